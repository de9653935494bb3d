-- renew: extends an owned claim's lease (SPEC §6).
--
-- KEYS[1]: the Redis key.
-- ARGV:    token, lease in ms, grace in ms.
-- Returns the new lease end (server ms), or 0 when not owned (nothing changed).

local rec = owned(KEYS[1], ARGV[1])
if rec == nil then return 0 end
local lease = tonumber(ARGV[2])
rec.lease_until_ms = now_ms() + lease
redis.call('SET', KEYS[1], cjson.encode(rec), 'PX', lease + tonumber(ARGV[3]))
return rec.lease_until_ms
