// Package gopool runs work items on long-lived goroutines.
//
// A goroutine started per message pays for its start and for growing its
// stack through the engine and the Redis client every time; a pooled
// goroutine keeps its grown stack, so a delivery grows no stack in the
// steady state (runtime.newstack in a CPU profile of dedupbench). Both transports run their deliveries on a Pool.
package gopool
