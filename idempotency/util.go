package idempotency

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"
)

// keyHash is what logs show instead of a key: keys can carry personal data.
func keyHash(ekey string) string {
	sum := sha256.Sum256([]byte(ekey))
	return hex.EncodeToString(sum[:6])
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n]
}

func sourcesString(ss []KeySource) string {
	parts := make([]string, len(ss))
	for i, s := range ss {
		parts[i] = s.String()
	}
	return strings.Join(parts, ", ")
}
