-- KEYS: log, meta, res (loc -> entry), res-seq (loc by seq)
-- ARGV: first seq to read, most entries to read
-- Indexes log entries written before the resource index existed, never over a newer entry
-- (appends index their own changes meanwhile). Returns the next seq to read, or 0 when the
-- whole log is indexed (then `meta` says `indexed`). An entry holds one change (field `e`)
-- or a chunk of them (fields `c`, seqs from the entry's id on; see log.rs).
local entries = redis.call('XRANGE', KEYS[1], ARGV[1] .. '-0', '+', 'COUNT', ARGV[2])
local next_seq = tonumber(ARGV[1])
for _, entry in ipairs(entries) do
  local id = tonumber(string.match(entry[1], '^(%d+)'))
  local seq = id
  local fields = entry[2]
  for k = 1, #fields - 1, 2 do
    if fields[k] == 'e' or fields[k] == 'c' then
      local e = fields[k + 1]
      local loc = cjson.decode(string.sub(e, 24)).loc
      local current = redis.call('ZSCORE', KEYS[4], loc)
      if not current or tonumber(current) < seq then
        redis.call('HSET', KEYS[3], loc, e)
        redis.call('ZADD', KEYS[4], seq, loc)
      end
      seq = seq + 1
    end
  end
  -- Past this entry even when it held no change (the next call must not read it again).
  next_seq = math.max(seq, id + 1)
end
if #entries < tonumber(ARGV[2]) then
  redis.call('HSET', KEYS[2], 'indexed', '1')
  return 0
end
return next_seq
