package main

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
)

// input is one message of a scenario's input.
type input struct {
	Key  string // the Idempotency-Key header
	Part int    // the partition it is published to (0 on NATS)
	// Seq numbers the distinct messages of its partition in publish order;
	// a duplicate carries its original's Seq, because its payload is the
	// same.
	Seq int
	Dup bool
	// Pad is how many bytes of padding its payload carries (-pad).
	Pad int
}

// minDupDistance is how many messages a duplicate comes after its original
// at least: a producer retry or a redelivery after the first copy finished,
// not two copies racing.
const minDupDistance = 1000

// makePlan returns n messages over parts partitions of which dupPct % repeat
// the key, payload and partition of an earlier message at least
// minDupDistance messages before, in a fixed pseudo-random order. Distinct
// messages go round-robin over the partitions.
func makePlan(n, dupPct, parts int, prefix string) []input {
	rnd := rand.New(rand.NewPCG(uint64(n), uint64(dupPct)))
	out := make([]input, n)
	isDup := make([]bool, n)
	if n > minDupDistance {
		dups := min(n*dupPct/100, n-minDupDistance)
		for _, i := range rnd.Perm(n - minDupDistance)[:dups] {
			isDup[minDupDistance+i] = true
		}
	}
	seqs := make([]int, parts)
	u := 0
	for i := range out {
		if isDup[i] {
			// Only an original can be repeated: walk back from a random
			// earlier index to the nearest original.
			j := rnd.IntN(i - minDupDistance + 1)
			for out[j].Dup {
				j--
			}
			out[i] = out[j]
			out[i].Dup = true
			continue
		}
		p := u % parts
		out[i] = input{Key: prefix + "-" + strconv.Itoa(u), Part: p, Seq: seqs[p]}
		seqs[p]++
		u++
	}
	return out
}

// distinct returns how many distinct keys plan holds.
func distinct(plan []input) int {
	n := 0
	for _, in := range plan {
		if !in.Dup {
			n++
		}
	}
	return n
}

// body is the payload of every message: a small JSON document that names
// the message's input partition and sequence, so the output can be checked
// for order without any header surviving the relay.
type body struct {
	ID       string `json:"id"`
	Part     int    `json:"p"`
	Seq      int    `json:"s"`
	Amount   int    `json:"amount"`
	Currency string `json:"currency"`
	Pad      string `json:"pad,omitempty"`
}

func payload(in input) []byte {
	b, _ := json.Marshal(body{ID: in.Key, Part: in.Part, Seq: in.Seq, Amount: 1234, Currency: "EUR", Pad: strings.Repeat("x", in.Pad)})
	return b
}

// padPlan gives every message of plan a payload padded by n bytes.
func padPlan(plan []input, n int) {
	for i := range plan {
		plan[i].Pad = n
	}
}

func parsePayload(p []byte) (body, error) {
	var b body
	if err := json.Unmarshal(p, &b); err != nil {
		return b, fmt.Errorf("output payload %q: %w", truncate(p, 80), err)
	}
	return b, nil
}

func truncate(p []byte, n int) []byte {
	if len(p) > n {
		return p[:n]
	}
	return p
}

// partitionKey is the Kafka message key of partition p's messages: every
// contender's writer hashes it, so one input partition's messages land in
// one output partition, in which their order can be read.
func partitionKey(p int) string { return "p" + strconv.Itoa(p) }
