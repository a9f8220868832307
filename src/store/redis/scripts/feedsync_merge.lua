-- The merge script: feedsync.lua, this, then append.lua as a function (see feedsync.rs).
-- KEYS: as append.lua.
-- ARGV: as append.lua with one request (R = 1, no idempotency key), then for each change (same
--       order) the seq the latest change of its loc must still have (0: none) and the item's
--       merged state (JSON), then the number of changes. Answers {3, 0, 0, 0, 0, nil} (and
--       writes nothing) when a loc moved on, or when the index is behind the log (`folded`,
--       see append.lua).
-- The seqs are checked against the index, which must be up to the log: when it is not, the
-- answer is the same as for a loc that moved on, and the hub brings it up and merges again.
local heads = redis.call('HMGET', KEYS[2], 'last', 'folded')
if heads[2] and heads[2] ~= (heads[1] or '0') then return {3, 0, 0, 0, 0, false} end
sx_inline = true
local m = tonumber(ARGV[#ARGV])
local base = #ARGV - 1 - 2 * m
local args = {}
for j = 1, base do args[j] = ARGV[j] end
for j = 1, m do
  local loc = args[9 + m + j]
  local seq = redis.call('ZSCORE', KEYS[6], loc)
  if tonumber(seq or '0') ~= tonumber(ARGV[base + 2 * j - 1]) then return {3, 0, 0, 0, 0, false} end
  sx_merged[loc] = ARGV[base + 2 * j]
end
-- append.lua reads the arguments without the merge's.
local ARGV = args
