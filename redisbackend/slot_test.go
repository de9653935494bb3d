package redisbackend

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"testing"
	"time"

	"github.com/idemkit/dedupworker/internal/testenv"
)

func TestHashSlotKnownValues(t *testing.T) {
	for key, want := range map[string]uint16{
		"123456789":            12739, // CRC16/XMODEM check value 0x31C3
		"":                     0,
		"foo":                  12182,
		"bar":                  5061,
		"{foo}bar":             12182,                       // hash tag
		"x{foo}y{z":            12182,                       // first tag wins
		"foo{}{bar}":           hashSlotNoTag("foo{}{bar}"), // empty tag: whole key
		"foo{{bar}}zap":        crc16("{bar") % numSlots,    // tag is "{bar"
		"foo{bar}{zap}":        crc16("bar") % numSlots,
		"{user1000}.following": crc16("user1000") % numSlots,
		"no close {brace":      hashSlotNoTag("no close {brace"),
	} {
		if got := hashSlot(key); got != want {
			t.Errorf("hashSlot(%q) = %d, want %d", key, got, want)
		}
	}
}

func hashSlotNoTag(key string) uint16 { return crc16(key) % numSlots }

// The slots computed here must be the server's: compare with CLUSTER KEYSLOT
// on a real cluster, for random keys with and without braces.
func TestHashSlotMatchesServer(t *testing.T) {
	client := testenv.RedisClusterClient(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	keys := []string{"", "{", "}", "{}", "a{b}c", "dedup:orders:{42}", "dedup:orders:42", "é✓{ü}"}
	for i := range 500 {
		b := make([]byte, 1+i%24)
		_, _ = rand.Read(b)
		k := hex.EncodeToString(b)
		switch i % 4 {
		case 1:
			k = fmt.Sprintf("%s{%s}", k[:len(k)/2], k[len(k)/2:])
		case 2:
			k = "dedup:scope:" + k + "{"
		case 3:
			k = string(b) // arbitrary bytes
		}
		keys = append(keys, k)
	}
	for _, k := range keys {
		want, err := client.ClusterKeySlot(ctx, k).Result()
		if err != nil {
			t.Fatalf("CLUSTER KEYSLOT %q: %v", k, err)
		}
		if got := hashSlot(k); int64(got) != want {
			t.Errorf("hashSlot(%q) = %d, server says %d", k, got, want)
		}
	}
}

// prefixedSlot agrees with hashSlot of the whole key, hash tags in the key
// or not.
func TestPrefixedSlot(t *testing.T) {
	const prefix = "ns-1:"
	for _, key := range []string{"", "a", "orders:42", "{x}y", "a{b}c", "a{}b", "a{", "a}b{c", "{}", "x{{y}}", "a{b", "a{b}{c}"} {
		if got, want := prefixedSlot(crc16(prefix), key), hashSlot(prefix+key); got != want {
			t.Errorf("prefixedSlot(%q) = %d, want %d", key, got, want)
		}
	}
}

// crc16Bytewise is CRC16/XMODEM a byte at a time, straight from its
// definition: crc16From must agree with it on every length and content.
func crc16Bytewise(crc uint16, s string) uint16 {
	for i := 0; i < len(s); i++ {
		crc ^= uint16(s[i]) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return crc
}

func TestCRC16FourBytesAtATimeMatchesBytewise(t *testing.T) {
	buf := make([]byte, 80)
	for n := range len(buf) + 1 {
		for range 20 {
			_, _ = rand.Read(buf[:n])
			s := string(buf[:n])
			for _, start := range []uint16{0, 0xffff, 0x1234} {
				if got, want := crc16From(start, s), crc16Bytewise(start, s); got != want {
					t.Fatalf("crc16From(%#x, %x) = %#x, want %#x", start, s, got, want)
				}
			}
		}
	}
}

func BenchmarkHashSlot(b *testing.B) {
	key := "dedup:relay:" + hex.EncodeToString(make([]byte, 16))
	b.SetBytes(int64(len(key)))
	for b.Loop() {
		_ = hashSlot(key)
	}
}
