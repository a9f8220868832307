-- KEYS: meta, res (loc -> entry), res-seq (loc by seq)
-- ARGV: after (seq), limit
-- Returns the seq the index reflects, then the seq and entry of each resource of the page.
-- The seq the index reflects: `folded` when the hub keeps it apart from the log (append.lua).
local heads = redis.call('HMGET', KEYS[1], 'last', 'folded')
local last = heads[2] or heads[1] or '0'
local page = redis.call('ZRANGEBYSCORE', KEYS[3], '(' .. ARGV[1], '+inf', 'WITHSCORES', 'LIMIT', 0, ARGV[2])
local out = {last}
local i = 1
while i <= #page do
  -- HMGET in pieces: unpack has a bounded stack.
  local locs = {}
  local seqs = {}
  while i <= #page and #locs < 500 do
    locs[#locs + 1] = page[i]
    seqs[#seqs + 1] = page[i + 1]
    i = i + 2
  end
  local entries = redis.call('HMGET', KEYS[2], unpack(locs))
  for j = 1, #locs do
    out[#out + 1] = seqs[j]
    out[#out + 1] = entries[j]
  end
end
return out
