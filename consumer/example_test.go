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

func ExampleBatchFunc() {
	// One call for the whole run, a result per message: a message whose
	// part failed is retried alone, the others complete.
	h := consumer.BatchFunc(func(ctx context.Context, msgs []*consumer.Message, results []consumer.Result) {
		for i, m := range msgs {
			if len(m.Payload) == 0 {
				results[i].Err = consumer.Permanent(errors.New("empty order"))
				continue
			}
			results[i].Value = append([]byte("stored "), m.Payload...)
		}
	})
	msgs := []*consumer.Message{{Payload: []byte("a")}, {}, {Payload: []byte("c")}}
	results := make([]consumer.Result, len(msgs))
	h.HandleBatch(context.Background(), msgs, results)
	for _, r := range results {
		fmt.Printf("%q %v\n", r.Value, consumer.IsPermanent(r.Err))
	}
	// A BatchFunc is also a Handler: Handle runs it on a batch of one.
	res, err := h.Handle(context.Background(), &consumer.Message{Payload: []byte("d")})
	fmt.Println(string(res), err)
	// Output:
	// "stored a" false
	// "" true
	// "stored c" false
	// stored d <nil>
}
