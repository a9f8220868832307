-- KEYS: log, meta, idem, idem-at, res (loc -> entry), res-seq (loc by seq), sx (loc -> FeedSync
--       item), sx-conflicts (locs whose items carry conflicts); runs after feedsync.lua
-- ARGV: idempotency key ('' for none), fingerprint, now (unix s), ttl (s), events channel,
--       channel name, then one entry per change: its datetime key (23 digits) and its JSON,
--       then the loc of each change, in the same order
local key = ARGV[1]
local now = tonumber(ARGV[3])
if key ~= '' then
  local rec = redis.call('HGET', KEYS[3], key)
  if rec then
    local at, first, last, accepted, fp = string.match(rec, '^(%d+) (%d+) (%d+) (%d+) (.*)$')
    if at and tonumber(at) + tonumber(ARGV[4]) > now then
      if fp ~= ARGV[2] then return {2, 0, 0, 0} end
      return {1, tonumber(accepted), tonumber(first), tonumber(last)}
    end
  end
end
local meta = redis.call('HMGET', KEYS[2], 'last', 'dt')
local last = tonumber(meta[1] or '0')
local latest = meta[2] or ''
local first = last + 1
local n = (#ARGV - 6) / 2
-- The index is written in pieces of at most 500 changes, one HSET and one ZADD each (a call
-- per change would cost more than the XADD); within a piece a later change of the same loc
-- wins, as it comes later in the arguments.
local entries, scores = {}, {}
local function flush_index()
  if #entries > 0 then
    redis.call('HSET', KEYS[5], unpack(entries))
    redis.call('ZADD', KEYS[6], unpack(scores))
    entries, scores = {}, {}
  end
end
local locs = {}
for i = 0, n - 1 do locs[i + 1] = ARGV[7 + n + i] end
sx_prefetch(KEYS[7], locs)
for i = 0, n - 1 do
  local e = ARGV[7 + i]
  local d = string.sub(e, 1, 23)
  if d < latest then
    d = latest
    e = latest .. string.sub(e, 24)
  end
  last = last + 1
  e = sx_record(KEYS[7], ARGV[7 + n + i], e, d)
  redis.call('XADD', KEYS[1], string.format('%d-0', last), 'e', e)
  local loc = ARGV[7 + n + i]
  entries[#entries + 1] = loc
  entries[#entries + 1] = e
  scores[#scores + 1] = last
  scores[#scores + 1] = loc
  if #entries >= 1000 then flush_index() end
  latest = d
end
flush_index()
sx_flush(KEYS[7], KEYS[8])
if n > 0 then
  -- A new channel's index is complete from the start; an older one is completed by backfill.lua.
  if first == 1 then redis.call('HSET', KEYS[2], 'indexed', '1') end
  redis.call('HSET', KEYS[2], 'last', string.format('%d', last), 'dt', latest)
  redis.call('HSETNX', KEYS[2], 'oldest', '1')
  redis.call('PUBLISH', ARGV[5], string.format('head %s %d', ARGV[6], last))
end
if key ~= '' then
  redis.call('HSET', KEYS[3], key, string.format('%d %d %d %d ', now, first, last, n) .. ARGV[2])
  redis.call('ZADD', KEYS[4], now, key)
end
return {0, n, first, last}
