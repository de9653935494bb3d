-- complete: stores the results of a batch of owned claims (SPEC §4.5).
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
-- Returns an array of two: a string of one code a key, in KEYS order: 1
-- completed; 2 already COMPLETED by this same token (a retry whose first
-- reply was lost: nothing changes); 0 not owned (gone, completed by another
-- token, released, another token) and nothing changed; then the
-- completed_at_ms of the keys this call completed (0 when it completed
-- none). One string rather than an integer a key: each entry of a reply
-- is a value the server converts and writes. The keys
-- completed are published on the channel in one message for the whole call:
-- the key alone when there is one (as SPEC §4.5 says), else "\n" key "\n"
-- key ... "\n". Waiters are rare (only for keys in flight), so one PUBLISH a
-- call rather than one a key.

local channel = ARGV[1]
local uniform = ARGV[2] == '=' -- no token is '=' (tokens are hex)
local first, stride = 2, 5
if uniform then first, stride = 5, 2 end
local now, now_s = nil, nil
local plain_arg, plain_ok -- the last outcome checked by plain (there are two)
local codes = {} -- the reply's codes, one a key
local published = {}
-- A claim as claim_json (or renew) wrote it starts with CLAIMED_HEAD, then
-- ',"fp":"'; only those templates write that start (encode puts the fence
-- first, a completion says COMPLETED). Its completion is the same text with
-- the state COMPLETED and the completion's fields appended: what done_json
-- would write from the parsed fields, without parsing them.
local CLAIMED_HEAD = '{"v":1,"state":"CLAIMED"'
local CLAIMED_START = CLAIMED_HEAD .. ',"fp":"'
local DONE_HEAD = '{"v":1,"state":"COMPLETED"'
-- done_mid is the completion's fields up to the result's text,
-- ',"completed_at_ms":' now ',"outcome":"' outcome '","result":"', built
-- once a call in the uniform form (one outcome), else once a key.
local done_mid

for i, key in ipairs(KEYS) do
  local a = first + (i - 1) * stride
  local token, outcome, result, meta, keep
  if uniform then
    token, outcome, result, meta, keep = ARGV[a], ARGV[3], ARGV[a + 1], '', ARGV[4]
  else
    token, outcome, result, meta, keep = ARGV[a], ARGV[a + 1], ARGV[a + 2], ARGV[a + 3], ARGV[a + 4]
  end
  local raw = get(key)
  if outcome ~= plain_arg then plain_arg, plain_ok = outcome, plain(outcome) end
  -- The template's fp is JSON text in which every '"' is escaped (cjson),
  -- so ',"' first occurs after it, at the token field: finding
  -- ',"token":"<token>","fence":' finds that field holding this token.
  -- A plain find that matches at 1 compares in place; string.sub would
  -- copy the start of every record into a new Lua string first.
  if type(raw) == 'string' and string.find(raw, CLAIMED_START, 1, true) == 1
    and string.find(raw, ',"token":"' .. token .. '","fence":', #CLAIMED_START, true)
    and meta == '' and plain_ok and (uniform or result == '' or slow().b64(result)) then
    -- The claim as the claim script wrote it, completed from a template:
    -- no JSON decoding or encoding, no pattern matching of the record.
    if now_s == nil then
      now = now or now_ms() -- one TIME a call: every key completed at the same instant
      now_s = string.format('%d', now)
    end
    if done_mid == nil or not uniform then
      done_mid = ',"completed_at_ms":' .. now_s .. ',"outcome":"' .. outcome .. '","result":"'
    end
    redis.call('SET', key, DONE_HEAD .. string.sub(raw, #CLAIMED_HEAD + 1, -2) .. done_mid .. result .. '"}', 'PX', keep)
    published[#published + 1] = key
    codes[i] = '1'
  else
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
      published[#published + 1] = key
      codes[i] = '1'
    end
  end
end
if #published == 1 then
  redis.call('PUBLISH', channel, published[1])
elseif #published > 1 then
  redis.call('PUBLISH', channel, '\n' .. table.concat(published, '\n') .. '\n')
end
return { table.concat(codes), now or tonumber(now_s) or 0 }
