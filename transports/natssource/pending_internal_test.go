package natssource

import "testing"

// TestDefaultAckPending: without batching the window is the concurrency;
// a batching runner's is concurrency × batch, capped at
// maxDefaultAckPending, never under the concurrency.
func TestDefaultAckPending(t *testing.T) {
	for _, c := range []struct {
		concurrency, batch int
		batching           bool
		want               int
	}{
		{8, 8, false, 8},
		{64, 64, false, 64},
		{2, 10, true, 20},
		{64, 64, true, 4096},
		{100, 100, true, maxDefaultAckPending},
		{5000, 1, true, 5000},
		{5000, 64, true, 5000},
	} {
		if got := defaultAckPending(c.concurrency, c.batch, c.batching); got != c.want {
			t.Errorf("defaultAckPending(%d, %d, %v) = %d, want %d", c.concurrency, c.batch, c.batching, got, c.want)
		}
	}
}

// TestRunBatch: Config.Batch as given, else its default: the concurrency
// without batching, and for a batching runner the concurrency but at least
// defaultRunBatch; without batching a batch never exceeds the concurrency.
func TestRunBatch(t *testing.T) {
	for _, c := range []struct {
		batch, n int
		batching bool
		want     int
	}{
		{0, 16, false, 16},
		{0, 256, false, 256},
		{10, 16, false, 10},
		{64, 16, false, 16},
		{0, 1, true, defaultRunBatch},
		{0, 64, true, defaultRunBatch},
		{0, 256, true, 256},
		{10, 64, true, 10},
		{500, 4, true, 500},
	} {
		if got := runBatch(c.batch, c.n, c.batching); got != c.want {
			t.Errorf("runBatch(%d, %d, %v) = %d, want %d", c.batch, c.n, c.batching, got, c.want)
		}
	}
}
