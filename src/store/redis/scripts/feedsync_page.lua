-- KEYS: meta, res (loc -> entry), res-seq (loc by seq), sx (loc -> FeedSync item)
-- ARGV: after (seq), limit
-- Returns the seq the index reflects, then the seq, entry and item ('' for none) of each resource.
-- The seq the index reflects: `folded` when the hub keeps it apart from the log (append.lua).
local heads = redis.call('HMGET', KEYS[1], 'last', 'folded')
local last = heads[2] or heads[1] or '0'
local page = redis.call('ZRANGEBYSCORE', KEYS[3], '(' .. ARGV[1], '+inf', 'WITHSCORES', 'LIMIT', 0, ARGV[2])
local out = {last}
for i = 1, #page, 2 do
  out[#out + 1] = page[i + 1]
  out[#out + 1] = redis.call('HGET', KEYS[2], page[i])
  out[#out + 1] = redis.call('HGET', KEYS[4], page[i]) or ''
end
return out
