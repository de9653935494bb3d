-- complete: stores the results of a batch of owned claims (SPEC §4.5).
--
-- KEYS:    the Redis keys (all in one hash slot on Cluster).
-- ARGV[1]: the notification channel.
-- ARGV, 5 per key from ARGV[2]: token, outcome, result (base64, '' for none),
--          meta (a JSON object of strings, '' for none), retention in ms.
-- Returns an array of integers in KEYS order: 1 completed (and the key
-- published on the channel), or already COMPLETED by this same token (a
-- retry whose first reply was lost: nothing changes); 0 not owned (gone,
-- completed by another token, released, another token) and nothing changed.

local channel = ARGV[1]
local now, now_s = nil, nil
local plain_arg, plain_ok -- the last outcome checked by plain (there are two)
local out = {}

for i, key in ipairs(KEYS) do
  local a = 2 + (i - 1) * 5
  local token, outcome, result, meta = ARGV[a], ARGV[a + 1], ARGV[a + 2], ARGV[a + 3]
  local raw = get(key)
  local state, fp, fpv, owner, fence, claimed, lease, attempts = parse(raw)
  if outcome ~= plain_arg then plain_arg, plain_ok = outcome, plain(outcome) end
  if state == 'CLAIMED' and owner == token and meta == '' and plain_ok and (result == '' or b64(result)) then
    -- The claim as the claim script wrote it, completed from a template:
    -- no JSON decoding or encoding.
    if now_s == nil then now_s = string.format('%d', now_ms()) end
    redis.call('SET', key, done_json('"' .. fp .. '"', fpv, '"' .. owner .. '"', fence, claimed, lease, attempts,
      now_s, '"' .. outcome .. '"', '"' .. result .. '"'), 'PX', ARGV[a + 4])
    redis.call('PUBLISH', channel, key)
    out[i] = 1
  else
    local rec = decode(raw)
    if rec ~= nil and (rec.state ~= 'CLAIMED' or rec.token ~= token or rec.released == true) then
      rec = nil
    end
    if rec == nil then
      local done = record(raw)
      if done ~= nil and done.state == 'COMPLETED' and done.token == token then
        -- A retry of a completion whose reply was lost, maybe on another
        -- connection: written back unchanged, so a WAIT that follows on
        -- this connection covers the first write too (see claim.lua).
        redis.call('SET', key, raw, 'KEEPTTL')
        out[i] = 1
      else
        out[i] = 0
      end
    else
      now = now or tonumber(now_s) or now_ms()
      rec.state = 'COMPLETED'
      rec.completed_at_ms = now
      rec.outcome = outcome
      if result == '' then rec.result = nil else rec.result = result end
      if meta == '' then rec.meta = nil else rec.meta = cjson.decode(meta) end
      redis.call('SET', key, encode(rec), 'PX', tonumber(ARGV[a + 4]))
      redis.call('PUBLISH', channel, key)
      out[i] = 1
    end
  end
end
return out
