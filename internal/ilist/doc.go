// Package ilist is the module's one intrusive doubly linked list: an
// element embeds [Links], so that listing and unlisting it allocate
// nothing and take constant time. The engine's lease-renewal schedule and
// the Redis store's local cache keep their entries in one.
package ilist
