-- step: stores the result of a finished step in an owned claim.
--
-- KEYS[1]: the Redis key.
-- ARGV:    token, step name, result (base64).
-- Returns 1 saved, 0 not owned (nothing changed). The key's TTL is kept.

local rec = slow().owned(KEYS[1], ARGV[1])
if rec == nil then return 0 end
if type(rec.steps) ~= 'table' then rec.steps = {} end
rec.steps[ARGV[2]] = ARGV[3]
redis.call('SET', KEYS[1], slow().encode(rec), 'KEEPTTL')
return 1
