package consumer_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/idemkit/dedupworker/consumer"
)

func ExampleHandlerFunc() {
	h := consumer.HandlerFunc(func(ctx context.Context, m *consumer.Message) ([]byte, error) {
		if len(m.Payload) == 0 {
			// Retrying cannot fix an empty order: dead-letter it.
			return nil, consumer.Permanent(errors.New("empty order"))
		}
		return []byte("accepted"), nil
	})
	res, err := h.Handle(context.Background(), &consumer.Message{Payload: []byte(`{"id":1}`)})
	fmt.Println(string(res), err)
	_, err = h.Handle(context.Background(), &consumer.Message{})
	fmt.Println(consumer.IsPermanent(err))
	// Output:
	// accepted <nil>
	// true
}
