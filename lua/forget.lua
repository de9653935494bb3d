-- forget: deletes a record and tells the local caches of every process on
-- the namespace (redisbackend.LocalCache) to drop it.
--
-- KEYS[1]: the Redis key.
-- ARGV[1]: the invalidation channel.
-- Returns {deleted, published}: deleted 1 when there was a value, else 0;
-- published 1 when the key went out on the channel (it is sent either way:
-- a cache may hold a record that expired here), 0 when Redis refused the
-- PUBLISH (an ACL user without the channel: the key is deleted all the
-- same, and the caller warns).

local n = redis.call('DEL', KEYS[1])
local ok = redis.pcall('PUBLISH', ARGV[1], KEYS[1])
if type(ok) == 'table' and ok.err then return { n, 0 } end
return { n, 1 }
