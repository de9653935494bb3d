-- claim: claims a batch of keys atomically.
--
-- KEYS:    the Redis keys of the batch (all in one hash slot on Cluster).
-- ARGV[1]: grace in ms.
-- ARGV, 5 per key from ARGV[2]: token, fingerprint, fingerprint version,
--          lease in ms, retention in ms; then, optionally, '1' (durable): a
--          WAIT follows this call on its connection (see below, DUPLICATE).
--          Or, when every key of the call shares fingerprint version, lease
--          and retention (nearly always), and every token and fingerprint
--          is a JSON string's text as it stands (printable ASCII other
--          than '"' and backslash: the caller checks): ARGV[1] '=', ARGV[2]
--          the fingerprint version, ARGV[3] the lease, ARGV[4] the claims'
--          key TTL in ms (lease + max(grace, retention), worked out by the
--          caller), ARGV[5] '1' (durable) or '0', then 2 per key from
--          ARGV[6]: token, fingerprint. Each argument costs the server a
--          string, and each conversion between text and number costs the
--          script: fewer per key and per call is less work.
-- A claim's key lives lease + max(grace, retention): an expired claim
-- nobody completed or released (its worker died) is found and RECLAIMED,
-- its attempt counted, for as long as the key's completion would be
-- remembered, so a key that kills its worker on every run reaches
-- max_attempts however slowly the worker restarts.
-- Returns an array: first a string of one outcome code a key, in KEYS
-- order: n NEW with no record in the reply, N NEW, R RECLAIMED, V
-- RECOVERED, D DUPLICATE, I IN_FLIGHT, M MISMATCH; then, in KEYS order, one
-- record as JSON for every key whose code is not n: the claim just written
-- for N, R and V, the stored value untouched for D, I and M; then the
-- call's TIME in microseconds. A key coded n had no value; its claim is the
-- template claim_json writes from the request (its token, fingerprint,
-- version, lease) and the call's TIME: fence the TIME in microseconds,
-- claimed_at_ms the TIME in milliseconds, lease_until_ms that plus the
-- lease, attempts 1. Each entry of the reply is a Lua value the server
-- converts and writes, and a string the client reads: a new key costs the
-- reply one byte of the codes, not two entries.

-- CODE is each outcome's code in the reply (see above), made at the first
-- key that had a value: a call whose keys are all new (coded n) makes no
-- table of them.
local CODE
local uniform = ARGV[1] == '=' -- no grace is '='
local grace -- the long form's; the short form's TTL has it already
local durable
if uniform then durable = ARGV[5] == '1' else grace = tonumber(ARGV[1]); durable = ARGV[2 + 5 * #KEYS] == '1' end
local now, now_us = clock()
local now_s = string.format('%d', now)
-- The fence of a key without a record: new_fence(nil, now_us), the server
-- time in microseconds, so that a key whose record was lost starts above
-- every fence it had before.
local fresh_fence = int_s(now_us)
-- out[1] is the codes (written last, from codes), then the records.
local out = { '' }
local codes = {}
-- setget: write a fresh claim with SET NX … GET, which also returns what the
-- key held, so a new key costs one command instead of GET then SET. Redis
-- 6.2 refuses NX with GET (syntax error): then SET NX, and GET only when the
-- key exists.
local setget = true
-- The fingerprint version, the lease and the retention are the same for
-- (nearly) every key of a batch: each is converted once, when it changes
-- (in the short form, once a call). Number to text conversions are a large
-- part of a script's cost.
local fpv_arg, fpv, fpv_s
local lease_arg, keep_arg, lease, until_s, px_s
-- The loop reads these as locals: a global is a table lookup each time.
local ARGV, KEYS, type, rpcall, find, byte = ARGV, KEYS, type, redis.pcall, string.find, string.byte
-- CLAIMED_FP is how claim_json's claims start, up to the fingerprint's
-- text; DONE_FP is how complete.lua's templates start a completion.
local CLAIMED_FP = '{"v":1,"state":"CLAIMED","fp":"'
local DONE_FP = '{"v":1,"state":"COMPLETED","fp":"'

local mid, tail
if uniform then
  -- The short form: the version, the lease and the TTL are the call's, and
  -- a fresh claim is CLAIMED_FP .. fp .. mid .. token .. tail, mid holding
  -- the fingerprint version, tail the fence, the times and attempts 1. Its
  -- version is integer text of under 15 digits (the caller checks), which
  -- tostring would give back as it is: it is made a number only for a key
  -- that has a record to compare. fp and token stand in the claim as they
  -- are.
  fpv_arg, fpv_s = ARGV[2], ARGV[2]
  lease = tonumber(ARGV[3])
  until_s = string.format('%d', now + lease)
  px_s = ARGV[4]
  mid = '","fpv":' .. fpv_s .. ',"token":"'
  tail = '","fence":' .. fresh_fence .. ',"claimed_at_ms":' .. now_s .. ',"lease_until_ms":' .. until_s .. ',"attempts":1}'
end

for i = 1, #KEYS do
  local key, token, fp, fresh, efp, etoken = KEYS[i], nil, nil, nil, nil, nil
  if uniform then
    token, fp = ARGV[4 + 2 * i], ARGV[5 + 2 * i]
    fresh = CLAIMED_FP .. fp .. mid .. token .. tail
  else
    local a = 2 + (i - 1) * 5
    local fpv_a, lease_a, keep_a
    token, fp, fpv_a, lease_a, keep_a = ARGV[a], ARGV[a + 1], ARGV[a + 2], ARGV[a + 3], ARGV[a + 4]
    if fpv_a ~= fpv_arg then
      fpv_arg = fpv_a
      fpv = tonumber(fpv_arg)
      if fpv == nil then error('claim: fingerprint version ' .. fpv_arg .. ' is not a number') end
      fpv_s = tostring(fpv)
    end
    if lease_a ~= lease_arg or keep_a ~= keep_arg then
      lease_arg, keep_arg = lease_a, keep_a
      lease = tonumber(lease_arg)
      until_s = string.format('%d', now + lease)
      px_s = string.format('%d', lease + math.max(grace, tonumber(keep_arg) or 0))
    end
    -- The claim a new key gets (fence now_us, attempts 1, no steps), written
    -- only when the key does not exist: claim_json's, with fp and token
    -- JSON-encoded (cjson).
    efp, etoken = cjson.encode(fp), cjson.encode(token)
    fresh = claim_json(efp, fpv_s, etoken, fresh_fence, now_s, until_s, '1')
  end
  -- raw: false when SET NX wrote fresh; else what the key held (a string,
  -- or an error for a value of another type), untouched.
  local raw
  if setget then
    raw = rpcall('SET', key, fresh, 'NX', 'PX', px_s, 'GET')
    if raw ~= false and type(raw) == 'table' and raw.err and not find(raw.err, 'WRONGTYPE', 1, true) then
      setget = false
      raw = nil
    end
  end
  if raw == nil then
    if redis.call('SET', key, fresh, 'NX', 'PX', px_s) then
      raw = false
    else
      raw = get(key)
    end
  end
  if raw == false then
    -- fresh was written by SET NX: the reply leaves it out (see above).
    codes[i] = 'n'
  else
    local outcome, rec, mine = 'NEW', nil, false
    CODE = CODE or { NEW = 'N', RECLAIMED = 'R', RECOVERED = 'V', DUPLICATE = 'D', IN_FLIGHT = 'I', MISMATCH = 'M' }
    fpv = fpv or tonumber(fpv_arg)
    local state, pfp, pfpv, ptoken, pfence, _, plu, pattempts
    if uniform and type(raw) == 'string' and find(raw, DONE_FP, 1, true) == 1
      and find(raw, fp, #DONE_FP + 1, true) == #DONE_FP + 1 and byte(raw, #DONE_FP + 1 + #fp) == 34 then
      -- A completion of the same fingerprint, as complete.lua's templates
      -- write it: DUPLICATE, decided on its start. The short form's fp has
      -- no '"' or backslash (the caller checks), so the '"' after it ends
      -- the stored fp: the two are equal. The rest of the record is not
      -- read here: parse's pattern costs about 30k instructions a record,
      -- as much as the claim and completion of a new key. The client reads
      -- every DUPLICATE's record, and claims a key whose record it cannot
      -- read again in the long form, which never takes this path and
      -- recovers what valid refuses.
      outcome = 'DUPLICATE'
    else
      state, pfp, pfpv, ptoken, pfence, _, plu, pattempts = parse(raw)
      if state ~= nil then
        -- Written by this package's templates: decided on the parsed text. The
        -- integers are canonical, so text equality is numeric equality.
        if (pfpv == fpv_s or (#pfpv > 14 and tonumber(pfpv) == fpv)) and pfp ~= fp then
          outcome = 'MISMATCH'
        elseif state == 'COMPLETED' then
          outcome = 'DUPLICATE'
        elseif tonumber(plu) < now then
          outcome = 'RECLAIMED'
          rec = { fence = tonumber(pfence), attempts = tonumber(pattempts) }
        else
          outcome = 'IN_FLIGHT'
          mine = ptoken == token
        end
      elseif raw then
        rec = slow().decode(raw)
        if rec == nil or not slow().valid(rec) then
          outcome = 'RECOVERED' -- rec, if JSON, still lends its fence and attempts
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
          mine = rec.token == token
        end
      end
    end

    if outcome == 'DUPLICATE' or outcome == 'IN_FLIGHT' or outcome == 'MISMATCH' then
      -- WAIT (Options.Durability) counts only its own connection's writes.
      -- Two records the caller acts on may have been written on another
      -- connection: a live claim under this call's own token (the call ran
      -- before, its reply was lost, the client sent it again), and, when a
      -- WAIT follows, a completion it will ack as a duplicate (whose own
      -- WAIT may have fallen short). Writing the record back unchanged puts
      -- this connection's last write after the first one in the replication
      -- stream, so the WAIT that follows covers both.
      if mine or (durable and outcome == 'DUPLICATE') then
        redis.call('SET', key, raw, 'KEEPTTL')
      end
      codes[i] = CODE[outcome]
      out[#out + 1] = raw
    else
      local fence, attempts, steps = now_us, 1, nil
      if rec ~= nil then
        -- A recovered value keeps a numeric fence when it still has one, so
        -- fences never go backwards for a downstream system that saw them.
        fence = slow().new_fence(rec.fence, now_us)
        if slow().num(rec.attempts) then attempts = rec.attempts + 1 end
        if outcome ~= 'RECOVERED' and type(rec.steps) == 'table' then steps = rec.steps end
      end
      if efp == nil then efp, etoken = '"' .. fp .. '"', '"' .. token .. '"' end
      local claimed
      if steps == nil then
        claimed = claim_json(efp, fpv_s, etoken, int_s(fence), now_s, until_s, int_s(attempts))
      else
        claimed = slow().encode({
          v = 1, state = 'CLAIMED', fp = fp, fpv = fpv, token = token, fence = fence,
          claimed_at_ms = now, lease_until_ms = now + lease, attempts = attempts, steps = steps,
        })
      end
      redis.call('SET', key, claimed, 'PX', px_s)
      codes[i] = CODE[outcome]
      out[#out + 1] = claimed
    end
  end
end
out[1] = table.concat(codes)
out[#out + 1] = now_us
return out
