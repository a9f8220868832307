-- KEYS: log, meta, idem, idem-at; ARGV: wanted oldest seq, forget keys dated at or before (unix s)
local meta = redis.call('HMGET', KEYS[2], 'oldest', 'last', 'folded')
local oldest = tonumber(meta[1] or '1')
local last = tonumber(meta[2] or '0')
local want = tonumber(ARGV[1])
if want > last then want = last end
-- Never past what the index reflects: the hub brings it up from the log (fold.rs). The change
-- after `folded` stays.
if meta[3] and want > meta[3] + 1 then want = meta[3] + 1 end
local removed = 0
if want > oldest then
  -- Whole entries only: the one that holds `want` stays (see log.rs), readers leave out the
  -- changes in it before `oldest`.
  local holder = redis.call('XREVRANGE', KEYS[1], string.format('%d-0', want), '-', 'COUNT', 1)
  if holder[1] then redis.call('XTRIM', KEYS[1], 'MINID', holder[1][1]) end
  redis.call('HSET', KEYS[2], 'oldest', string.format('%d', want))
  removed = want - oldest
end
local expired = redis.call('ZRANGEBYSCORE', KEYS[4], '-inf', ARGV[2])
for _, k in ipairs(expired) do redis.call('HDEL', KEYS[3], k) end
redis.call('ZREMRANGEBYSCORE', KEYS[4], '-inf', ARGV[2])
return removed
