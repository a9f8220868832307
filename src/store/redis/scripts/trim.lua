-- KEYS: log, meta, idem, idem-at, pages; ARGV: wanted oldest seq, forget keys dated at or
-- before (unix s), seqs per page block (the blocks whose seqs are all removed are dropped)
local meta = redis.call('HMGET', KEYS[2], 'oldest', 'last')
local oldest = tonumber(meta[1] or '1')
local last = tonumber(meta[2] or '0')
local want = tonumber(ARGV[1])
if want > last then want = last end
local removed = 0
if want > oldest then
  redis.call('XTRIM', KEYS[1], 'MINID', string.format('%d-0', want))
  redis.call('HSET', KEYS[2], 'oldest', string.format('%d', want))
  removed = want - oldest
  local size = tonumber(ARGV[3])
  for block = math.floor((oldest - 1) / size), math.floor((want - 1) / size) - 1 do
    redis.call('HDEL', KEYS[5], string.format('%d', block))
  end
end
local expired = redis.call('ZRANGEBYSCORE', KEYS[4], '-inf', ARGV[2])
for _, k in ipairs(expired) do redis.call('HDEL', KEYS[3], k) end
redis.call('ZREMRANGEBYSCORE', KEYS[4], '-inf', ARGV[2])
return removed
