// Package redisprobe asks a Redis server whether it answers, the one way
// the library (redisbackend.NewFromURL) and the binary (internal/app) do
// before they build a client on it.
package redisprobe
