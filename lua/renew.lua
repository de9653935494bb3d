-- renew: extends an owned claim's lease (SPEC §6).
--
-- KEYS[1]: the Redis key.
-- ARGV:    token, lease in ms, grace in ms.
-- Returns the new lease end (server ms), or 0 when not owned (nothing changed).

local token, lease = ARGV[1], tonumber(ARGV[2])
local raw = get(KEYS[1])
local state, fp, fpv, owner, fence, claimed, _, attempts = parse(raw)
if state == 'CLAIMED' and owner == token then
  -- Still as the claim script wrote it: rewritten from the same template,
  -- so the completion takes its fast path too.
  local until_ms = now_ms() + lease
  redis.call('SET', KEYS[1], claim_json('"' .. fp .. '"', fpv, '"' .. owner .. '"', fence, claimed, string.format('%d', until_ms), attempts),
    'PX', lease + tonumber(ARGV[3]))
  return until_ms
end
local rec = decode(raw)
if rec == nil or rec.state ~= 'CLAIMED' or rec.token ~= token or rec.released == true then return 0 end
rec.lease_until_ms = now_ms() + lease
redis.call('SET', KEYS[1], encode(rec), 'PX', lease + tonumber(ARGV[3]))
return rec.lease_until_ms
