package redisbackend

import (
	"bufio"
	"context"
	"errors"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"
)

// NodeMemory is the memory of one primary, from INFO memory (CONFIG GET
// where INFO lacks a field).
type NodeMemory struct {
	Addr string
	// UsedMemory is used_memory in bytes; MaxMemory is maxmemory, 0 when
	// there is no limit.
	UsedMemory, MaxMemory int64
	// Policy is maxmemory-policy ("" when neither INFO nor CONFIG said).
	Policy string
}

// Memory reads the memory of every primary of a Cluster, or of the one
// server, with INFO memory; maxmemory and maxmemory-policy come from CONFIG
// GET when INFO does not carry them (Redis before 4) and CONFIG is allowed.
func (s *Store) Memory(ctx context.Context) ([]NodeMemory, error) {
	const op = "memory"
	if err := s.live(op); err != nil {
		return nil, err
	}
	nodes, err := s.primaries(ctx)
	if err != nil {
		return nil, storeErr(op, err)
	}
	out := make([]NodeMemory, 0, len(nodes))
	for _, node := range nodes {
		info, err := node.Info(ctx, "memory").Result()
		if err != nil {
			return nil, storeErr(op, err)
		}
		f := infoFields(info)
		m := NodeMemory{Policy: f["maxmemory_policy"]}
		if c, ok := node.(*redis.Client); ok {
			m.Addr = c.Options().Addr
		}
		m.UsedMemory, _ = strconv.ParseInt(f["used_memory"], 10, 64)
		maxS, haveMax := f["maxmemory"]
		if !haveMax || m.Policy == "" {
			if cfg, err := node.ConfigGet(ctx, "maxmemory*").Result(); err == nil {
				if v, ok := cfg["maxmemory"]; ok && !haveMax {
					maxS, haveMax = v, true
				}
				if m.Policy == "" {
					m.Policy = cfg["maxmemory-policy"]
				}
			}
		}
		m.MaxMemory, _ = strconv.ParseInt(maxS, 10, 64)
		out = append(out, m)
	}
	return out, nil
}

// infoFields reads the "name:value" lines of an INFO reply.
func infoFields(info string) map[string]string {
	f := map[string]string{}
	sc := bufio.NewScanner(strings.NewReader(info))
	for sc.Scan() {
		if k, v, ok := strings.Cut(strings.TrimSpace(sc.Text()), ":"); ok && !strings.HasPrefix(k, "#") {
			f[k] = v
		}
	}
	return f
}

// MemoryUsage returns MEMORY USAGE of each of keys (effective keys), in
// one pipeline (routed per slot on a Cluster): the bytes Redis holds for the
// key, its value and overhead. A key gone since it was listed reads 0.
func (s *Store) MemoryUsage(ctx context.Context, keys []string) ([]int64, error) {
	const op = "memory usage"
	if err := s.live(op); err != nil {
		return nil, err
	}
	cmds := make([]*redis.IntCmd, len(keys))
	_, _ = s.client.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, k := range keys {
			cmds[i] = p.MemoryUsage(ctx, s.prefix+k)
		}
		return nil
	})
	out := make([]int64, len(keys))
	for i, c := range cmds {
		n, err := c.Result()
		switch {
		case errors.Is(err, redis.Nil):
		case err != nil:
			return nil, storeErr(op, err)
		}
		out[i] = n
	}
	return out, nil
}
