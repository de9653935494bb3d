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
local now = nil
local out = {}

for i, key in ipairs(KEYS) do
  local a = 2 + (i - 1) * 5
  local rec = owned(key, ARGV[a])
  if rec == nil then
    local done = decode(get(key))
    if done ~= nil and valid(done) and done.state == 'COMPLETED' and done.token == ARGV[a] then
      out[i] = 1
    else
      out[i] = 0
    end
  else
    now = now or now_ms()
    rec.state = 'COMPLETED'
    rec.completed_at_ms = now
    rec.outcome = ARGV[a + 1]
    local result, meta = ARGV[a + 2], ARGV[a + 3]
    if result == '' then rec.result = nil else rec.result = result end
    if meta == '' then rec.meta = nil else rec.meta = cjson.decode(meta) end
    redis.call('SET', key, cjson.encode(rec), 'PX', tonumber(ARGV[a + 4]))
    redis.call('PUBLISH', channel, key)
    out[i] = 1
  end
end
return out
