-- complete: stores the results of a batch of owned claims.
--
-- KEYS:    the Redis keys (all in one hash slot on Cluster).
-- ARGV[1]: the notification channel.
-- ARGV, 5 per key from ARGV[2]: token, outcome, result (base64, '' for none),
--          meta (a JSON object of strings, '' for none), retention in ms;
--          or, when every key of the call shares outcome and retention and
--          has no meta (nearly always): ARGV[2] '=', ARGV[3] the outcome,
--          ARGV[4] the retention, then 2 per key from ARGV[5]: token,
--          result, every result standard base64 or '' (the caller encodes
--          them, so they are not checked again here). Each argument costs
--          the server a string: fewer per key is less work per key.
-- Returns one string: one code a key, in KEYS order: 1 completed; 2
-- already COMPLETED by this same token (a retry whose first reply was
-- lost: nothing changes); 0 not owned (gone, completed by another token,
-- released, another token) and nothing changed; then, in decimal, the
-- completed_at_ms of the keys this call completed (0 when it completed
-- none). One string rather than an integer a key: each entry of a reply
-- is a value the server converts and writes, and the client reads. The keys
-- completed are published on the channel in one message for the whole call:
-- the key alone when there is one, else "\n" key "\n"
-- key ... "\n". Waiters are rare (only for keys in flight), so one PUBLISH a
-- call rather than one a key.

local channel = ARGV[1]
local uniform = ARGV[2] == '=' -- no token is '=' (tokens are hex)
local now, now_s = nil, nil
local codes = {} -- the reply's codes, one a key
-- published is the keys completed, from its second entry: its first and
-- last ('' each) make table.concat write the message's "\n" at both ends.
local published, n_published = { '' }, 0
-- A claim as claim_json (or renew) wrote it starts with CLAIMED_HEAD, then
-- ',"fp":"'; only those templates write that start (encode puts the fence
-- first, a completion says COMPLETED). Its completion is the same text with
-- the state COMPLETED and the completion's fields appended: what done_json
-- would write from the parsed fields, without parsing them.
local CLAIMED_HEAD = '{"v":1,"state":"CLAIMED"'
local CLAIMED_START = '{"v":1,"state":"CLAIMED","fp":"'
local DONE_HEAD = '{"v":1,"state":"COMPLETED"'
local TOKEN_FIELD, TOKEN_END = ',"token":"', '","fence":'
-- done_mid is the completion's fields up to the result's text,
-- ',"completed_at_ms":' now ',"outcome":"' outcome '","result":"', built
-- once a call in the short form (one outcome), else once a key.
local done_mid

-- The loop reads these as locals: a global is a table lookup each time.
local ARGV, KEYS, type, find, sub, rcall, rpcall = ARGV, KEYS, type, string.find, string.sub, redis.call, redis.pcall

-- A claim as the claim script wrote it is completed from a template: no
-- JSON decoding or encoding, no pattern matching of the record. Its
-- completion is DONE_HEAD, the claim's text after CLAIMED_HEAD less its
-- '}', done_mid, the result and '"}'. templated reports whether the key's
-- outcome, result and meta let the template stand for it.
local outcome, result, meta, keep, templated = nil, nil, '', nil, nil
if uniform then
  outcome, keep = ARGV[3], ARGV[4]
  templated = plain(outcome) -- the results are base64 the caller encoded
end
for i = 1, #KEYS do
  local key, token = KEYS[i], nil
  if uniform then
    token, result = ARGV[3 + 2 * i], ARGV[4 + 2 * i]
  else
    local a = 2 + (i - 1) * 5
    token, outcome, result, meta, keep = ARGV[a], ARGV[a + 1], ARGV[a + 2], ARGV[a + 3], ARGV[a + 4]
    templated = meta == '' and plain(outcome) and (result == '' or slow().b64(result))
    done_mid = nil
  end
  -- get(key), inline: a WRONGTYPE error reads as "not a record", any other
  -- error is raised.
  local raw = rpcall('GET', key)
  local t = type(raw)
  if t == 'table' and raw.err and not find(raw.err, 'WRONGTYPE', 1, true) then
    error(raw)
  end
  -- The template's fp is JSON text in which every '"' is escaped (cjson),
  -- so ',"token":"' first occurs after it, at the token field: that field
  -- holds this token when the token stands right after it and
  -- '","fence":' right after the token. A plain find that matches where
  -- it starts compares in place, with strings the script already has:
  -- string.sub would copy part of every record into a new Lua string, and
  -- concatenating the token into one string to find would make a new
  -- string a key too (each is hashed and interned).
  local at = templated and t == 'string' and find(raw, CLAIMED_START, 1, true) == 1
    and find(raw, TOKEN_FIELD, #CLAIMED_START, true)
  if at then
    at = at + #TOKEN_FIELD
    at = find(raw, token, at, true) == at and find(raw, TOKEN_END, at + #token, true) == at + #token
  end
  if at then
    if done_mid == nil then
      if now_s == nil then
        now = now or now_ms() -- one TIME a call: every key completed at the same instant
        now_s = string.format('%d', now)
      end
      done_mid = ',"completed_at_ms":' .. now_s .. ',"outcome":"' .. outcome .. '","result":"'
    end
    rcall('SET', key, DONE_HEAD .. sub(raw, #CLAIMED_HEAD + 1, -2) .. done_mid .. result .. '"}', 'PX', keep)
    n_published = n_published + 1
    published[n_published + 1] = key
    codes[i] = '1'
  else
    -- Where the template does not stand: raw is not a claim as the
    -- templates write it held by token (steps, written by hand or by
    -- another version, or not owned), or the completion has meta or an
    -- outcome the template cannot hold. A claim held by token is decoded,
    -- changed and encoded; else the key is coded 2 when raw is its
    -- completion under this token, 0 when it is not owned.
    local rec = slow().decode(raw)
    if rec ~= nil and (rec.state ~= 'CLAIMED' or rec.token ~= token or rec.released == true) then
      rec = nil
    end
    if rec == nil then
      local done = slow().record(raw)
      if done ~= nil and done.state == 'COMPLETED' and done.token == token then
        -- A retry of a completion whose reply was lost, maybe on another
        -- connection: written back unchanged, so a WAIT that follows on
        -- this connection covers the first write too (see claim.lua).
        redis.call('SET', key, raw, 'KEEPTTL')
        codes[i] = '2'
      else
        codes[i] = '0'
      end
    else
      now = now or tonumber(now_s) or now_ms()
      rec.state = 'COMPLETED'
      rec.completed_at_ms = now
      rec.outcome = outcome
      if result == '' then rec.result = nil else rec.result = result end
      if meta == '' then rec.meta = nil else rec.meta = cjson.decode(meta) end
      redis.call('SET', key, slow().encode(rec), 'PX', tonumber(keep))
      n_published = n_published + 1
      published[n_published + 1] = key
      codes[i] = '1'
    end
  end
end
if n_published == 1 then
  redis.call('PUBLISH', channel, published[2])
elseif n_published > 1 then
  published[n_published + 2] = ''
  redis.call('PUBLISH', channel, table.concat(published, '\n'))
end
return table.concat(codes) .. (now_s or string.format('%d', now or 0))
