// Package consumertest has an in-memory consumer.Delivery and
// consumer.Source for tests of handlers, middleware and processors, without
// a broker.
//
// A Delivery records how the code under test settled it, and its Expect
// methods fail the test unless it was settled exactly once, the way a
// processor must:
//
//	func TestRetriesLater(t *testing.T) {
//		d := consumertest.NewDelivery(consumertest.NewMessage("order-1", `{"id":1}`), 1)
//		p.Process(t.Context(), d)
//		if delay := d.ExpectNakked(t); delay < time.Second {
//			t.Fatalf("nak delay %s, want at least 1s", delay)
//		}
//	}
//
// FailWith makes a Delivery's broker calls fail, to test what the code does
// when the broker refuses an Ack or has no dead-letter destination. A Source
// feeds messages to a dedupworker.Worker and ends when every one is done, so a
// test reads the results after Run returns.
package consumertest
