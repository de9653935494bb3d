-- claim: claims a batch of keys atomically (SPEC §4.3).
--
-- KEYS:    the Redis keys of the batch (all in one hash slot on Cluster).
-- ARGV[1]: grace in ms (a CLAIMED key lives lease + grace).
-- ARGV, 4 per key from ARGV[2]: token, fingerprint, fingerprint version,
--          lease in ms.
-- Returns a flat array, 2 entries per key in KEYS order: the outcome
-- (NEW, RECLAIMED, RECOVERED, DUPLICATE, IN_FLIGHT, MISMATCH), then a record
-- as JSON: the claim just written for NEW/RECLAIMED/RECOVERED, the stored
-- value untouched for the others.

local grace = tonumber(ARGV[1])
local now = now_ms()
local out = {}
-- setget: write a fresh claim with SET NX … GET, which also returns what the
-- key held, so a new key costs one command instead of GET then SET. Redis
-- 6.2 refuses NX with GET (syntax error): then SET NX, and GET only when the
-- key exists.
local setget = true

for i, key in ipairs(KEYS) do
  local a = 2 + (i - 1) * 4
  local token, fp, fpv, lease = ARGV[a], ARGV[a + 1], tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3])
  -- The claim a new key gets (fence 1, attempts 1, no steps), written only
  -- when the key does not exist.
  local fresh = string.format(FRESH, cjson.encode(fp), fpv, cjson.encode(token), 1, now, now + lease, 1)
  local raw
  if setget then
    raw = redis.pcall('SET', key, fresh, 'NX', 'PX', lease + grace, 'GET')
    if type(raw) == 'table' and raw.err and not string.find(raw.err, 'WRONGTYPE', 1, true) then
      setget = false
    end
  end
  if not setget then
    if redis.call('SET', key, fresh, 'NX', 'PX', lease + grace) then
      raw = false
    else
      raw = get(key)
    end
  end
  -- raw is false when the key did not exist and now holds fresh; else what
  -- it held (a string, or an error for a value of another type), untouched.
  local outcome, rec = 'NEW', nil
  if raw then
    rec = decode(raw)
    if rec == nil or not valid(rec) then
      outcome = 'RECOVERED'
    elseif rec.fpv == fpv and rec.fp ~= fp then
      outcome = 'MISMATCH'
    elseif rec.state == 'COMPLETED' then
      outcome = 'DUPLICATE'
    elseif rec.released == true then
      outcome = 'NEW'
    elseif rec.lease_until_ms < now then
      outcome = 'RECLAIMED'
    else
      outcome = 'IN_FLIGHT'
    end
  end

  if outcome == 'DUPLICATE' or outcome == 'IN_FLIGHT' or outcome == 'MISMATCH' then
    out[#out + 1] = outcome
    out[#out + 1] = raw
  else
    local fence, attempts, steps = 1, 1, nil
    if rec ~= nil then
      -- A recovered value keeps a numeric fence when it still has one, so
      -- fences never go backwards for a downstream system that saw them.
      if num(rec.fence) then fence = rec.fence + 1 end
      if num(rec.attempts) then attempts = rec.attempts + 1 end
      if outcome ~= 'RECOVERED' and type(rec.steps) == 'table' then steps = rec.steps end
    end
    local claimed
    if not raw then
      claimed = fresh -- already written by SET NX
    elseif steps == nil then
      claimed = string.format(FRESH, cjson.encode(fp), fpv, cjson.encode(token), fence, now, now + lease, attempts)
    else
      claimed = cjson.encode({
        v = 1, state = 'CLAIMED', fp = fp, fpv = fpv, token = token, fence = fence,
        claimed_at_ms = now, lease_until_ms = now + lease, attempts = attempts, steps = steps,
      })
    end
    if raw then
      redis.call('SET', key, claimed, 'PX', lease + grace)
    end
    out[#out + 1] = outcome
    out[#out + 1] = claimed
  end
end
return out
