-- Brings the resource index and the FeedSync items up to the log (see fold.rs), with what
-- the hub worked out from the log entries after `folded`.
-- KEYS: meta, res (loc -> entry), res-seq (loc by seq), sx (loc -> item), sx-conflicts
-- ARGV: the `folded` the hub read, the new `folded`, N, then per resource: its loc, the log
--       entry of its latest change, that change's seq, its item as stored, and '+' when the
--       item gained conflicts, '-' when it lost them ('' otherwise).
-- Writes nothing and answers 0 when `folded` moved meanwhile (another fold came first);
-- answers 1 when written.
if redis.call('HGET', KEYS[1], 'folded') ~= ARGV[1] then return 0 end
local call, unpack = redis.call, unpack
local n = ARGV[3] + 0
for c = 0, n - 1, 500 do
  local entries, scores, items, m = {}, {}, {}, 0
  for i = c + 1, math.min(c + 500, n) do
    local at = 3 + 5 * (i - 1)
    local loc = ARGV[at + 1]
    entries[m + 1], entries[m + 2] = loc, ARGV[at + 2]
    scores[m + 1], scores[m + 2] = ARGV[at + 3], loc
    items[m + 1], items[m + 2] = loc, ARGV[at + 4]
    m = m + 2
    local conflicts = ARGV[at + 5]
    if conflicts == '+' then
      call('ZADD', KEYS[5], 0, loc)
    elseif conflicts == '-' then
      call('ZREM', KEYS[5], loc)
    end
  end
  if m > 0 then
    call('HSET', KEYS[2], unpack(entries, 1, m))
    call('ZADD', KEYS[3], unpack(scores, 1, m))
    call('HSET', KEYS[4], unpack(items, 1, m))
  end
end
call('HSET', KEYS[1], 'folded', ARGV[2])
return 1
