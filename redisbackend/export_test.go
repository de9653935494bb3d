package redisbackend

// LocalWaiters reports whether a Wait is waiting in process on the claim s
// holds on key: the tests' way to know a waiter is parked before they act.
func LocalWaiters(s *Store, key string) bool {
	if s.cache == nil {
		return false
	}
	s.cache.mu.Lock()
	defer s.cache.mu.Unlock()
	p := s.cache.slots[s.prefix+key]
	return p != nil && !p.cached && p.held && p.ended != nil
}

// HashSlot is the Redis Cluster hash slot of key.
func HashSlot(key string) uint16 { return hashSlot(key) }
