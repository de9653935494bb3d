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

local NULL = cjson.null

local function absent(x)
  return x == nil or x == NULL
end

local function opt(x, kind)
  return absent(x) or type(x) == kind
end

-- Standard base64 with padding, what Go's base64.StdEncoding accepts.
local function b64(s)
  return type(s) == 'string' and #s % 4 == 0 and string.find(s, '^[A-Za-z0-9+/]*=?=?$') ~= nil
end

local function is_string(s) return type(s) == 'string' end

-- A finite number in float64's range: cjson reads 1e400 as inf where Go's
-- decoder refuses it, and the two must agree on what is a record.
local function num(x)
  return type(x) == 'number' and x > -1e308 and x < 1e308
end

-- strmap: absent, null, or an object whose keys are strings and whose values
-- pass check. An empty JSON array decodes to the same empty table as {}.
local function strmap(m, check)
  if absent(m) then return true end
  if type(m) ~= 'table' then return false end
  for k, v in pairs(m) do
    if type(k) ~= 'string' or not check(v) then return false end
  end
  return true
end

-- valid mirrors the Go decoder in redisbackend: what it rejects is not a
-- record (SPEC §4.8) and is replaced by the next claim.
local function valid(r)
  local s = r.state
  return (s == 'CLAIMED' or s == 'COMPLETED')
    and type(r.token) == 'string' and type(r.fp) == 'string'
    and num(r.fpv) and num(r.fence) and num(r.attempts)
    and num(r.claimed_at_ms) and num(r.lease_until_ms)
    and (absent(r.completed_at_ms) or num(r.completed_at_ms))
    and (absent(r.v) or num(r.v))
    and opt(r.outcome, 'string') and opt(r.released, 'boolean')
    and (absent(r.result) or b64(r.result))
    and strmap(r.meta, is_string) and strmap(r.steps, b64)
end

-- A claim without steps (nearly every claim) is written from this template,
-- which costs less per key than cjson.encode of a table. Strings still go
-- through cjson.encode for escaping; the numbers are finite.
local FRESH = '{"v":1,"state":"CLAIMED","fp":%s,"fpv":%s,"token":%s,"fence":%s,'
  .. '"claimed_at_ms":%d,"lease_until_ms":%d,"attempts":%s}'

local grace = tonumber(ARGV[1])
local now = now_ms()
local out = {}

for i, key in ipairs(KEYS) do
  local a = 2 + (i - 1) * 4
  local token, fp, fpv, lease = ARGV[a], ARGV[a + 1], tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3])
  local raw = redis.pcall('GET', key)
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
    if steps == nil then
      claimed = string.format(FRESH, cjson.encode(fp), fpv, cjson.encode(token), fence, now, now + lease, attempts)
    else
      claimed = cjson.encode({
        v = 1, state = 'CLAIMED', fp = fp, fpv = fpv, token = token, fence = fence,
        claimed_at_ms = now, lease_until_ms = now + lease, attempts = attempts, steps = steps,
      })
    end
    redis.call('SET', key, claimed, 'PX', lease + grace)
    out[#out + 1] = outcome
    out[#out + 1] = claimed
  end
end
return out
