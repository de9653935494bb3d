-- release: gives up an owned claim so the key can be claimed again at once.
-- The record stays, CLAIMED with released = true and an expired
-- lease, so its fence, attempts and steps carry over to the next claim.
--
-- KEYS[1]: the Redis key.
-- ARGV:    token, keep in ms (how long the released record lives),
--          the notification channel, and optionally '1' (undo): the claim
--          never ran (the store failed it for want of replicas), so the
--          attempt it counted is taken back as well.
-- Returns 1 released (and the key published), 0 not owned (nothing changed).

local rec = slow().owned(KEYS[1], ARGV[1])
if rec == nil then return 0 end
rec.released = true
rec.lease_until_ms = now_ms()
if ARGV[4] == '1' and slow().num(rec.attempts) and rec.attempts >= 1 then
  rec.attempts = rec.attempts - 1
end
redis.call('SET', KEYS[1], slow().encode(rec), 'PX', tonumber(ARGV[2]))
redis.call('PUBLISH', ARGV[3], KEYS[1])
return 1
