-- Shared helpers. Prepended to every script of this package at build time
-- (see doc.go), so each script stays one self-contained EVAL body.

-- now_ms is the Redis server's clock in milliseconds: every lease is on it.
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- clock reads TIME once and returns it in milliseconds (for leases) and in
-- microseconds (the floor of every new fence). Microseconds
-- since 1970 are about 1.8e15, below 2^53: an exact integer in Lua's double
-- and in Go's int64 until the year 2255.
local function clock()
  local t = redis.call('TIME')
  local s, us = tonumber(t[1]), tonumber(t[2])
  return s * 1000 + math.floor(us / 1000), s * 1000000 + us
end

-- MAX_EXACT is 2^53: up to it every integer is exact in a double, and
-- string.format('%d') writes it in full.
local MAX_EXACT = 9007199254740992

-- int_s writes the number n as JSON text: an integer (every fence, time
-- and count this package writes) in full, with all its digits, where
-- tostring and cjson.encode keep only 14 significant digits (a fence in
-- microseconds has 16); any other number (only in values written by hand)
-- with 17 significant digits, which reads back as the same double.
local function int_s(n)
  if n == math.floor(n) and n > -MAX_EXACT and n < MAX_EXACT then
    return string.format('%d', n)
  end
  return string.format('%.17g', n)
end

-- get reads key with GET. A value of another Redis type comes back as its
-- WRONGTYPE error, which decode reads as "not a record"; any other error (a
-- permission the ACL user lacks, say) is raised, so the call fails instead
-- of reading as "no record" and being answered as a lost claim.
local function get(key)
  local raw = redis.pcall('GET', key)
  if type(raw) == 'table' and raw.err and not string.find(raw.err, 'WRONGTYPE', 1, true) then
    error(raw)
  end
  return raw
end

-- A claim without steps (nearly every claim) is written by claim_json and
-- its completion, when it has no meta, by done_json: string concatenation,
-- which costs a fraction of cjson.encode of a table or of string.format
-- (both turn every number into text through sprintf). Every argument is
-- JSON text already: strings encoded (cjson.encode, or checked by plain/b64
-- and quoted), numbers as integer text.
local function claim_json(fp, fpv, token, fence, claimed, lease_until, attempts)
  return '{"v":1,"state":"CLAIMED","fp":' .. fp .. ',"fpv":' .. fpv .. ',"token":' .. token
    .. ',"fence":' .. fence .. ',"claimed_at_ms":' .. claimed .. ',"lease_until_ms":' .. lease_until
    .. ',"attempts":' .. attempts .. '}'
end

-- Patterns reading back exactly what claim_json (with plain strings) and
-- done_json write: strings of letters, digits and - . : _ (no escapes), integers
-- without sign, fraction, exponent or leading zero. What they match is a
-- valid record (valid() would say so) that cjson would decode to the same
-- values; anything else goes through decode and valid.
-- NAME is '"([%w%-%.:_]*)"' and INT '([1-9]%d*)': CLAIMED_PAT is
-- '^{"v":1,"state":"CLAIMED","fp":' NAME ',"fpv":' INT ',"token":' NAME
-- ',"fence":' INT ',"claimed_at_ms":' INT ',"lease_until_ms":' INT
-- ',"attempts":' INT '}$', and DONE_PAT the same with state COMPLETED and,
-- before '}$', ',"completed_at_ms":' INT ',"outcome":' NAME
-- ',"result":"([%w+/]*=?=?)"'. They are written out whole, not concatenated:
-- this file runs at every call of every script, where building them is a
-- fixed cost of each call (docs/PERFORMANCE.md); lua_test.go checks them
-- against the composition.
local CLAIMED_PAT = '^{"v":1,"state":"CLAIMED","fp":"([%w%-%.:_]*)","fpv":([1-9]%d*),"token":"([%w%-%.:_]*)","fence":([1-9]%d*),"claimed_at_ms":([1-9]%d*),"lease_until_ms":([1-9]%d*),"attempts":([1-9]%d*)}$'
local DONE_PAT = '^{"v":1,"state":"COMPLETED","fp":"([%w%-%.:_]*)","fpv":([1-9]%d*),"token":"([%w%-%.:_]*)","fence":([1-9]%d*),"claimed_at_ms":([1-9]%d*),"lease_until_ms":([1-9]%d*),"attempts":([1-9]%d*),"completed_at_ms":([1-9]%d*),"outcome":"([%w%-%.:_]*)","result":"([%w+/]*=?=?)"}$'

-- plain reports whether s may stand in a template string without escaping.
local function plain(s)
  return string.find(s, '^[%w%-%.:_]*$') ~= nil
end

-- parse reads raw when it is a record as claim_json or done_json writes it: the
-- record's fields as strings (state, fp, fpv, token, fence, claimed_at_ms,
-- lease_until_ms, attempts), else nil. It is the cheap path in front of
-- decode; it never accepts what decode+valid would refuse.
local function parse(raw)
  if type(raw) ~= 'string' then return nil end
  local fp, fpv, token, fence, claimed, lease, attempts = string.match(raw, CLAIMED_PAT)
  if fp ~= nil then
    return 'CLAIMED', fp, fpv, token, fence, claimed, lease, attempts
  end
  local completed, outcome, result
  fp, fpv, token, fence, claimed, lease, attempts, completed, outcome, result = string.match(raw, DONE_PAT)
  if fp ~= nil and #result % 4 == 0 then
    return 'COMPLETED', fp, fpv, token, fence, claimed, lease, attempts
  end
  return nil
end

-- slow returns the helpers of the paths that read records outside the
-- templates (steps, meta, released, written by hand or by another
-- version), or rewrite them: new_fence, decode, owned, valid and its
-- checks (absent, opt, b64, num, strmap), encode, done_json, record. It
-- makes them at its first call in a script run, and the scripts call them
-- as slow().name: each local function is a closure made at every call of
-- a script, and a call on the templates' paths, nearly every call, needs
-- none of these (docs/PERFORMANCE.md has what they cost).
local S
local function slow()
  if S ~= nil then return S end
  -- new_fence is the fence of a new owner of a key whose record held fence
  -- old (nil when there was none): max(old + 1, now_us). Taking the server's
  -- clock as the floor keeps fences growing when the record is lost (expired,
  -- deleted, evicted, a wiped or failed-over Redis), as long as the clock did
  -- not go back by more than the time since the last claim.
  local function new_fence(old, now_us)
    if type(old) == 'number' and old > -1e308 and old < 1e308 then
      return math.max(math.floor(old) + 1, now_us)
    end
    return now_us
  end

  -- decode returns the JSON object stored in raw, or nil when raw is not a
  -- string (absent key, or a value of another Redis type) or not a JSON object
  -- or array.
  local function decode(raw)
    if type(raw) ~= 'string' then return nil end
    local ok, rec = pcall(cjson.decode, raw)
    if ok and type(rec) == 'table' then return rec end
    return nil
  end

  -- owned returns the record at key when it is a live claim held by token:
  -- CLAIMED, not released, same token. Anything else (gone, COMPLETED, released,
  -- another owner, not a record) yields nil, and the caller changes nothing.
  local function owned(key, token)
    local rec = decode(get(key))
    if rec == nil or rec.state ~= 'CLAIMED' or rec.token ~= token or rec.released == true then
      return nil
    end
    return rec
  end

  -- Record validation, shared by claim (RECOVERED) and complete (a retried
  -- completion is recognised only on a valid record).
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
  -- record and is replaced by the next claim.
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

  -- encode writes a record table as JSON: cjson.encode for everything but the
  -- fence, which cjson would round to 14 significant digits, written in full
  -- by int_s in front of the other fields (field order is not significant to
  -- any reader; the templates' fast paths never match cjson's output anyway).
  local function encode(rec)
    local fence = rec.fence
    if type(fence) ~= 'number' then return cjson.encode(rec) end
    rec.fence = nil
    local rest = cjson.encode(rec)
    rec.fence = fence
    if rest == '{}' then return '{"fence":' .. int_s(fence) .. '}' end
    return '{"fence":' .. int_s(fence) .. ',' .. string.sub(rest, 2)
  end

  local function done_json(fp, fpv, token, fence, claimed, lease_until, attempts, completed, outcome, result)
    return '{"v":1,"state":"COMPLETED","fp":' .. fp .. ',"fpv":' .. fpv .. ',"token":' .. token
      .. ',"fence":' .. fence .. ',"claimed_at_ms":' .. claimed .. ',"lease_until_ms":' .. lease_until
      .. ',"attempts":' .. attempts .. ',"completed_at_ms":' .. completed .. ',"outcome":' .. outcome
      .. ',"result":' .. result .. '}'
  end

  -- record returns raw as a table: by parse when it can, else decoded and
  -- checked by valid; nil when raw is not a record.
  local function record(raw)
    local state, fp, fpv, token, fence, claimed, lease, attempts = parse(raw)
    if state ~= nil then
      return {
        state = state, fp = fp, fpv = tonumber(fpv), token = token, fence = tonumber(fence),
        claimed_at_ms = tonumber(claimed), lease_until_ms = tonumber(lease), attempts = tonumber(attempts),
      }
    end
    local rec = decode(raw)
    if rec ~= nil and valid(rec) then return rec end
    return nil
  end

  S = {
    new_fence = new_fence, decode = decode, owned = owned, NULL = NULL, absent = absent, opt = opt,
    b64 = b64, num = num, strmap = strmap, valid = valid, encode = encode, done_json = done_json,
    record = record,
  }
  return S
end
