-- Shared helpers. Prepended to every script of this package at build time
-- (see doc.go), so each script stays one self-contained EVAL body.

-- now_ms is the Redis server's clock in milliseconds: every lease is on it.
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
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
  local rec = decode(redis.pcall('GET', key))
  if rec == nil or rec.state ~= 'CLAIMED' or rec.token ~= token or rec.released == true then
    return nil
  end
  return rec
end
