-- renew: extends an owned claim's lease.
--
-- KEYS[1]: the Redis key.
-- ARGV:    token, lease in ms, grace in ms.
-- Returns the new lease end (server ms), or 0 when not owned (nothing changed).
--
-- The key keeps outliving its lease by what the claim gave it (max(grace,
-- retention), see claim.lua): the new TTL is the new lease plus the time
-- the key had left after the old lease's end, and at least lease + grace.
-- So a worker that dies after renewals leaves its attempt counted as long
-- as one that died before the first. Renew need not be told
-- the retention, and costs one PTTL more, once per lease/3 per running
-- handler.

local token, lease, grace = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])

-- ttl is the key's TTL for the new lease: lease + the tail beyond the old
-- lease's end (old_until, server ms) it has now, at least lease + grace. A
-- key without a TTL (written by hand; PTTL -1) gets lease + grace.
local function ttl(now, old_until)
  local left = redis.call('PTTL', KEYS[1])
  local tail = grace
  if left > 0 and type(old_until) == 'number' then tail = math.max(grace, left - (old_until - now)) end
  return lease + tail
end

local raw = get(KEYS[1])
local state, fp, fpv, owner, fence, claimed, old_until, attempts = parse(raw)
if state == 'CLAIMED' and owner == token then
  -- Still as the claim script wrote it: rewritten from the same template,
  -- so the completion takes its fast path too.
  local now = now_ms()
  local until_ms = now + lease
  redis.call('SET', KEYS[1], claim_json('"' .. fp .. '"', fpv, '"' .. owner .. '"', fence, claimed, string.format('%d', until_ms), attempts),
    'PX', ttl(now, tonumber(old_until)))
  return until_ms
end
local rec = slow().decode(raw)
if rec == nil or rec.state ~= 'CLAIMED' or rec.token ~= token or rec.released == true then return 0 end
local now = now_ms()
local px = ttl(now, rec.lease_until_ms)
rec.lease_until_ms = now + lease
redis.call('SET', KEYS[1], slow().encode(rec), 'PX', px)
return rec.lease_until_ms
