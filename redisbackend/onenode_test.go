package redisbackend_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/dedupworker/idempotency"
	"github.com/idemkit/dedupworker/internal/testenv"
	"github.com/idemkit/dedupworker/redisbackend"
)

// TestStoreClusterOneNodeBatch checks the path of a batch whose keys live on
// one primary, as the engine sends them once Node has named it: the calls
// go in one pipeline on that primary's own client, not through the
// ClusterClient's pipeline. When a slot moved after Node named its
// primary, the call answered MOVED did not run: it is sent again through
// the ClusterClient, and its key is claimed on its new primary.
func TestStoreClusterOneNodeBatch(t *testing.T) {
	testenv.Long(t, "starts a private cluster")
	c := startPrivateCluster(t, 3, false)
	client := c.clusterClient(t, "")
	top := &countHook{} // the ClusterClient's own pipelines
	client.AddHook(top)
	nodes := make(map[string]*countHook)
	for _, m := range c.masters {
		nodes[m.addr()] = &countHook{}
	}
	client.OnNewNode(func(rdb *redis.Client) {
		if h := nodes[rdb.Options().Addr]; h != nil {
			rdb.AddHook(h)
		}
	})
	store := newStore(t, client, redisbackend.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	// keysOf returns n new keys whose slots master i owns, each in a slot
	// of its own.
	seq := 0
	keysOf := func(i, n int) []string {
		var keys []string
		seen := map[uint16]bool{}
		for len(keys) < n {
			seq++
			k := "one-node-" + strconv.Itoa(seq)
			rk := store.RedisKey(k)
			if slot := redisbackend.HashSlot(rk); c.slotOwner(rk) == i && !seen[slot] {
				seen[slot] = true
				keys = append(keys, k)
			}
		}
		return keys
	}
	claim := func(keys []string) {
		t.Helper()
		reqs := make([]idempotency.ClaimRequest, len(keys))
		for i, k := range keys {
			reqs[i] = idempotency.ClaimRequest{Key: k, Fingerprint: "fp", Lease: time.Minute}
		}
		res, err := store.Claim(ctx, reqs)
		if err != nil {
			t.Fatalf("Claim: %v", err)
		}
		for i, r := range res {
			if r.Outcome != idempotency.ClaimNew {
				t.Fatalf("Claim of %s: %s, want NEW", keys[i], r.Outcome)
			}
		}
	}
	// Load the scripts and the layout: the first pipeline goes through
	// the ClusterClient.
	claim(keysOf(0, 3))

	keys := keysOf(0, 8)
	for _, k := range keys {
		if got, want := store.Node(ctx, k), c.masters[0].addr(); got != want {
			t.Fatalf("Node(%s) = %s, want %s", k, got, want)
		}
	}
	top0, node0 := top.trips.Load(), nodes[c.masters[0].addr()].trips.Load()
	claim(keys)
	if n := top.trips.Load() - top0; n != 0 {
		t.Errorf("a batch of one primary's keys took %d pipelines through the ClusterClient, want 0", n)
	}
	if n := nodes[c.masters[0].addr()].trips.Load() - node0; n != 1 {
		t.Errorf("a batch of one primary's keys took %d round trips to it, want 1", n)
	}

	// Move the slot of one key, which Node named master 0 for, to master
	// 1. The slot is empty, so CLUSTER SETSLOT ... NODE moves it at once.
	keys = keysOf(0, 8)
	for _, k := range keys {
		store.Node(ctx, k)
	}
	moved := keys[3]
	slot := redisbackend.HashSlot(store.RedisKey(moved))
	for _, m := range []*clusterNode{c.masters[1], c.masters[0], c.masters[2]} {
		if err := m.client.Do(ctx, "cluster", "setslot", slot, "node", c.masters[1].id).Err(); err != nil {
			t.Fatalf("CLUSTER SETSLOT %d NODE on %s: %v", slot, m.addr(), err)
		}
	}
	claim(keys)
	n, err := c.masters[1].client.Exists(ctx, store.RedisKey(moved)).Result()
	if err != nil || n != 1 {
		t.Errorf("the moved key's claim on its new primary: EXISTS = %d, %v; want 1", n, err)
	}
	testenv.Eventually(t, 10*time.Second, "Node names the moved slot's new primary", func() bool {
		return store.Node(ctx, moved) == c.masters[1].addr()
	})
}
