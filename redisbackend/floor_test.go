package redisbackend_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// The floor scripts run, for each key, the commands the store's scripts run
// for a new key, and nothing else: a claim is SET NX PX
// GET of a record the client built, a completion a GET then a SET of a
// completion the client built. They decide no outcome and neither read nor
// build text, and each call reads TIME once, as the store's calls do. What
// they cost Redis is a lower bound for a script that claims and completes a
// key with those commands and records of those sizes.
const (
	floorClaim = `local t = redis.call('TIME')
for i = 1, #KEYS do redis.call('SET', KEYS[i], ARGV[i + 1], 'NX', 'PX', ARGV[1], 'GET') end
return #KEYS`
	floorComplete = `local t = redis.call('TIME')
for i = 1, #KEYS do
  local raw = redis.call('GET', KEYS[i])
  redis.call('SET', KEYS[i], ARGV[i + 1], 'PX', ARGV[1])
end
return #KEYS`
)

// BenchmarkRedisFloor measures what claiming and completing a new key costs
// Redis at the floor, in batches of 100 keys with the store's record sizes:
// the floor scripts above ("lua"), and the same commands sent in pipelines
// without a script ("native"; the store makes every state change a script).
// Run it beside BenchmarkRedisCPU's claim+complete/batch=100: the store
// less "lua" is what the store's decisions cost, "lua" less "native" what
// running the commands from a script costs. It reads the same environment
// as BenchmarkRedisCPU (a private server, or DEDUP_COST_REDIS_URL;
// DEDUP_CALLGRIND_PID), and reports the same redis-us/msg.
func BenchmarkRedisFloor(b *testing.B) {
	client, pid := costServer(b)
	ctx := context.Background()
	const size = 100
	// A claim and a completion as the store's templates write them.
	claim := `{"v":1,"state":"CLAIMED","fp":"1:5e884898da28047151d0e56f8dc6292773603d0d6aabbdd62a11ef721d1542d8","fpv":1,"token":"0123456789abcdef0123456789abcdef","fence":1765000000000000,"claimed_at_ms":1765000000000,"lease_until_ms":1765000030000,"attempts":1}`
	done := strings.TrimSuffix(strings.Replace(claim, "CLAIMED", "COMPLETED", 1), "}") +
		`,"completed_at_ms":1765000000100,"outcome":"ok","result":"eyJzdGF0dXMiOiJzaGlwcGVkIn0="}`
	ttl := strconv.Itoa(int(time.Hour.Milliseconds()))
	claimSHA, err := client.ScriptLoad(ctx, floorClaim).Result()
	if err != nil {
		b.Fatal(err)
	}
	completeSHA, err := client.ScriptLoad(ctx, floorComplete).Result()
	if err != nil {
		b.Fatal(err)
	}
	seq := 0
	keys := make([]string, size)
	next := func() {
		for i := range keys {
			seq++
			keys[i] = "floor:" + strconv.Itoa(seq)
		}
	}
	args := func(v string) []any {
		a := make([]any, 0, size+1)
		a = append(a, ttl)
		for range size {
			a = append(a, v)
		}
		return a
	}
	claimArgs, doneArgs := args(claim), args(done)
	variants := []struct {
		name  string
		batch func() error
	}{
		{"lua", func() error {
			next()
			if err := client.EvalSha(ctx, claimSHA, keys, claimArgs...).Err(); err != nil {
				return err
			}
			return client.EvalSha(ctx, completeSHA, keys, doneArgs...).Err()
		}},
		{"native", func() error {
			next()
			p := client.Pipeline()
			p.Time(ctx)
			for _, k := range keys {
				p.SetArgs(ctx, k, claim, redis.SetArgs{Mode: "NX", TTL: time.Hour, Get: true})
			}
			if _, err := p.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
				return err
			}
			p = client.Pipeline()
			p.Time(ctx)
			for _, k := range keys {
				p.Get(ctx, k)
				p.Set(ctx, k, done, time.Hour)
			}
			_, err := p.Exec(ctx)
			return err
		}},
	}
	for _, v := range variants {
		b.Run(v.name+"/batch=100", func(b *testing.B) {
			for range 3 {
				if err := v.batch(); err != nil {
					b.Fatal(err)
				}
			}
			msgs := 0
			callgrind(b, pid, "-z")
			before := redisCPU(b, client)
			for b.Loop() {
				if err := v.batch(); err != nil {
					b.Fatal(err)
				}
				msgs += size
			}
			after := redisCPU(b, client)
			callgrind(b, pid, "--dump=floor_"+v.name)
			b.ReportMetric((after-before).Seconds()*1e6/float64(msgs), "redis-us/msg")
		})
	}
}
