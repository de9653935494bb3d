-- Forget-if: deletes each key of the batch whose record is still of the
-- given class (and old enough) when the script runs, so that a bulk forget
-- never deletes a record that changed after the caller's scan.
-- KEYS the batch; ARGV class (claimed, released, completed, dead_lettered
-- or all), older_ms (0: any age). A record's class: CLAIMED and not
-- released is claimed, CLAIMED and released is released, COMPLETED with
-- outcome dead_lettered is dead_lettered, any other COMPLETED is completed.
-- Its age is TIME minus claimed_at_ms (CLAIMED) or completed_at_ms
-- (COMPLETED); a record without that time is of no age and never older.
-- Reply: per key 1 (deleted), 0 (no record: gone, or not a record) or
-- 2 (kept: its class or age no longer match), then one more entry: 1 when
-- the invalidation below was published or not needed, 0 when Redis refused
-- it (an ACL user without the channel). When it deleted any and ARGV[3]
-- names a channel, "" is published there once: the local caches of the
-- namespace (redisbackend.LocalCache) drop every entry.
local class, older, channel = ARGV[1], tonumber(ARGV[2]), ARGV[3]
local deleted = false
local now = now_ms()
local out = {}
for i, key in ipairs(KEYS) do
  local rec = slow().decode(get(key))
  if rec == nil or not slow().valid(rec) then
    out[i] = 0
  else
    local c, at
    if rec.state == 'COMPLETED' then
      c, at = 'completed', rec.completed_at_ms
      if rec.outcome == 'dead_lettered' then c = 'dead_lettered' end
    else
      c, at = 'claimed', rec.claimed_at_ms
      if rec.released == true then c = 'released' end
    end
    if (class == 'all' or class == c) and (older == 0 or (slow().num(at) and now - at > older)) then
      redis.call('DEL', key)
      deleted = true
      out[i] = 1
    else
      out[i] = 2
    end
  end
end
local published = 1
if deleted and channel ~= nil and channel ~= '' then
  local ok = redis.pcall('PUBLISH', channel, '')
  if type(ok) == 'table' and ok.err then published = 0 end
end
out[#KEYS + 1] = published
return out
