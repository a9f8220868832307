-- The append script: one call appends the requests of one channel that waited together (group
-- commit, see group.rs), each as if it had been a call of its own, in the order given.
-- KEYS: log, meta, idem, idem-at, res (loc -> entry), res-seq (loc by seq), sx (loc -> FeedSync
--       item), sx-conflicts (locs whose items carry conflicts); runs after feedsync.lua
-- ARGV: ttl of idempotency keys (s), events channel, channel name, R (number of requests),
--       then per request: its idempotency key ('' for none), fingerprint, now (unix s),
--       number of changes, and '1' when its entries' datetime keys never go down from one
--       to the next ('0' otherwise); then one entry per change of every request, in order
--       (its datetime key, 23 digits, then its JSON), then the loc of each, in the same order
--       (or no locs at all: see below); last, an epoch for the channel, taken when it has
--       none yet
-- Returns 5 numbers per request, in order: status (0 appended, 1 replayed: the key was seen
-- with the same fingerprint, 2 conflict: with another one), accepted, first and last seq, and
-- 1 when every entry of the request was stored as sent (no datetime raised, no conflicts
-- count added; 0 otherwise); then the channel's epoch; then, per request, the channel's
-- latest datetime key before it ('' for none), which its entries' datetime keys were raised
-- to at least. The hub keeps the changes stored as sent, with that epoch, to read them back
-- without the log (recent.rs), and the entries for the fold (fold.rs).
-- Deferred or inline: the resource index (`res`, `res-seq`) and the FeedSync items (`sx`,
-- `sx-conflicts`) reflect the log up to the meta's `folded` (all of it when there is no
-- `folded`: an older hub wrote them with every append). A plain append while no item carries
-- conflicts writes the log alone and leaves them to the hub, which brings them up to the log
-- later, many calls at once (fold.rs). A merge (the merge script sets sx_inline), or any
-- append while some item carries conflicts (an entry then gets its item's number of
-- conflicts, which needs the item current), writes them with the log, as older hubs did: the
-- merge script refuses to run while they are behind, and while some item carries conflicts
-- every append is inline, so they cannot be behind then (only a merge adds conflicts).
-- The changes of the call go into the log CHUNK at a time, one stream entry per chunk (see
-- log.rs): id FIRST-0, where FIRST is the seq of its first change, and one field per change,
-- in seq order; `e` when the entry holds one change, `c` for each when it holds more. A field
-- per change costs Redis about a third of what an XADD per change did.
local ttl = tonumber(ARGV[1])
local r = tonumber(ARGV[4])
local total = 0
-- (Numbers are read by arithmetic: `tonumber` converts a string twice.)
for j = 0, r - 1 do total = total + ARGV[8 + 5 * j] end
-- ARGV[entry0 + i] is the i-th entry of the call (from 1), ARGV[loc0 + i] its loc.
local entry0 = 4 + 5 * r
local loc0 = entry0 + total
-- Only an inline append reads the locs: the hub leaves them out until a call refuses for want
-- of them (leaving 1,000 unread locs out took a ninth off what Redis spends on such a call).
local locs_sent = #ARGV == loc0 + total + 1
local meta = redis.call('HMGET', KEYS[2], 'last', 'dt', 'epoch', 'folded')
local inline = sx_inline or redis.call('ZCARD', KEYS[8]) > 0
if inline and total > 0 and not locs_sent then
  return redis.error_reply('changehub: locs needed for ' .. ARGV[3])
end
local epoch = meta[3]
if not epoch then
  epoch = ARGV[#ARGV]
  redis.call('HSET', KEYS[2], 'epoch', epoch)
end
local before = tonumber(meta[1] or '0')
local last = before
local latest = meta[2] or ''
if inline and meta[4] and meta[4] + 0 ~= before then
  return redis.error_reply('changehub: the resource index is behind the log of ' .. ARGV[3])
end
-- The index is written in pieces of at most 500 changes, one HSET and one ZADD each (a call
-- per change would cost more than the XADD); within a piece a later change of the same loc
-- wins, as it comes later in the arguments.
local entries, scores, pieced = {}, {}, 0
-- Used for every change: kept in locals (a global is a table lookup each time).
local sub, format, call, log_key, res_key = string.sub, string.format, redis.call, KEYS[1], KEYS[5]
local function flush_index()
  if pieced > 0 then
    call('HSET', res_key, unpack(entries))
    call('ZADD', KEYS[6], unpack(scores))
    entries, scores, pieced = {}, {}, 0
  end
end
-- The chunk of the log being filled: its changes, as the XADD's field-value pairs.
local CHUNK = 32
local chunk, chunked, chunk_id = {}, 0, nil
local function flush_chunk()
  if chunked == 1 then
    call('XADD', log_key, chunk_id, 'e', chunk[2])
  elseif chunked > 1 then
    call('XADD', log_key, chunk_id, unpack(chunk, 1, 2 * chunked))
  end
  chunked = 0
end
-- Every item the call may update is read at once (those of a request that turns out to be a
-- replay too: rare, and harmless).
if inline then sx_prefetch(KEYS[7], loc0, total) end

-- The outcome of a request with idempotency key `key`: nil when it is to be appended.
local function seen(key, fp, now)
  if key == '' then return nil end
  local rec = redis.call('HGET', KEYS[3], key)
  if not rec then return nil end
  local at, first, last, accepted, old = string.match(rec, '^(%d+) (%d+) (%d+) (%d+) (.*)$')
  if not at or tonumber(at) + ttl <= now then return nil end
  if old ~= fp then return {2, 0, 0, 0} end
  return {1, tonumber(accepted), tonumber(first), tonumber(last)}
end

local out, answered = {}, 0
local floors = {}
local done = 0 -- changes of the requests before this one
for j = 0, r - 1 do
  local key, fp = ARGV[5 + 5 * j], ARGV[6 + 5 * j]
  local n = ARGV[8 + 5 * j] + 0
  -- Only an idempotency key needs the time.
  local now, outcome
  if key ~= '' then
    now = ARGV[7 + 5 * j] + 0
    outcome = seen(key, fp, now)
  end
  floors[j + 1] = latest
  if outcome == nil then
    local first = last + 1
    -- A change's datetime never goes below the channel's latest: it is raised to it. A
    -- request whose datetimes never go down and whose first is not below the latest has
    -- nothing to raise, and its changes are not looked at one by one for it (the common
    -- case: every change at the time of its request).
    local first_key = n > 0 and ARGV[9 + 5 * j] == '1' and sub(ARGV[entry0 + done + 1], 1, 23)
    local ordered = first_key and first_key >= latest
    local sent = 1
    for i = done + 1, done + n do
      local sent_e = ARGV[entry0 + i]
      local e = sent_e
      if not ordered then
        local d = sub(e, 1, 23)
        if d < latest then
          d = latest
          e = latest .. sub(e, 24)
        end
        latest = d
      end
      last = last + 1
      local loc
      if inline then
        loc = ARGV[loc0 + i]
        e = sx_record(res_key, loc, e)
      end
      -- (Strings are interned: this compares two pointers.)
      if e ~= sent_e then sent = 0 end
      -- The index's score is the seq; a chunk's entry id is its first seq (XADD makes it SEQ-0).
      -- (A seq is formatted only where it is written: one string per change cost Redis a
      -- sixth of its instructions for an append of 1,000 changes.)
      if chunked == 0 then chunk_id = format('%d', last) end
      chunked = chunked + 1
      chunk[2 * chunked - 1] = 'c'
      chunk[2 * chunked] = e
      if chunked >= CHUNK then flush_chunk() end
      if inline then
        pieced = pieced + 2
        entries[pieced - 1] = loc
        entries[pieced] = e
        scores[pieced - 1] = format('%d', last)
        scores[pieced] = loc
        if pieced >= 1000 then flush_index() end
      end
    end
    if ordered then latest = n == 1 and first_key or sub(ARGV[entry0 + done + n], 1, 23) end
    -- Recorded at once, so that a later request of this call with the same key sees it.
    if key ~= '' then
      redis.call('HSET', KEYS[3], key, string.format('%d %d %d %d ', now, first, last, n) .. fp)
      redis.call('ZADD', KEYS[4], now, key)
    end
    out[answered + 1], out[answered + 2], out[answered + 3], out[answered + 4] = 0, n, first, last
    out[answered + 5] = sent
  else
    for k = 1, 4 do out[answered + k] = outcome[k] end
    out[answered + 5] = 0
  end
  answered = answered + 5
  done = done + n
end
flush_chunk()
if inline then
  flush_index()
  sx_flush(KEYS[7], KEYS[8])
end
if last > before then
  if inline then
    if meta[4] then redis.call('HSET', KEYS[2], 'folded', string.format('%d', last)) end
  elseif not meta[4] then
    redis.call('HSET', KEYS[2], 'folded', string.format('%d', before))
  end
  -- A new channel's index is complete from the start; an older one is completed by backfill.lua.
  if before == 0 then redis.call('HSET', KEYS[2], 'indexed', '1') end
  redis.call('HSET', KEYS[2], 'last', string.format('%d', last), 'dt', latest)
  redis.call('HSETNX', KEYS[2], 'oldest', '1')
  -- One head message per call, with its final seq: listeners only raise their heads to it.
  redis.call('PUBLISH', ARGV[2], string.format('head %s %d', ARGV[3], last))
end
out[answered + 1] = epoch
for j = 1, r do out[answered + 1 + j] = floors[j] end
return out
