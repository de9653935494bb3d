package redisbackend_test

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/dedupworker/idempotency"
	"github.com/idemkit/dedupworker/redisbackend"
)

func ExampleNew() {
	url := os.Getenv("REDIS_URL")
	if url == "" {
		url = "redis://127.0.0.1:6379/0"
	}
	opt, err := redis.ParseURL(url)
	if err != nil {
		panic(err)
	}
	client := redis.NewClient(opt)
	defer client.Close()

	store, err := redisbackend.New(client, redisbackend.Options{Namespace: "example"})
	if err != nil {
		panic(err)
	}
	defer store.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	key := "orders:42" // "<scope>:<idempotency key>"
	_, _ = store.Delete(ctx, key)
	defer store.Delete(ctx, key)

	req := idempotency.ClaimRequest{Key: key, Fingerprint: "1:9f86d0", FingerprintVersion: 1, Lease: 30 * time.Second}
	res, err := store.Claim(ctx, []idempotency.ClaimRequest{req})
	if err != nil {
		panic(err)
	}
	claim := res[0].Claim
	// claim.Fence is for downstream systems: it exceeds every fence this
	// key had before (it is at least the server's time in microseconds).
	fmt.Println(res[0].Outcome, "attempt", claim.Attempts)

	// ... the handler runs under the claim, then its result is stored:
	ok, err := store.Complete(ctx, []idempotency.Completion{{
		Key: key, Token: claim.Token, Outcome: idempotency.RecordOutcomeOK,
		Result: []byte("shipped"), Retention: 24 * time.Hour,
	}})
	if err != nil {
		panic(err)
	}
	fmt.Println("completed:", ok[0])

	// A redelivery of the same message is a duplicate, with the result.
	res, err = store.Claim(ctx, []idempotency.ClaimRequest{req})
	if err != nil {
		panic(err)
	}
	fmt.Println(res[0].Outcome, string(res[0].Record.Result))
	// Output:
	// NEW attempt 1
	// completed: true
	// DUPLICATE shipped
}
