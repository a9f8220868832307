-- FeedSync items (see feedsync.rs): functions the append script (append.lua) and the merge
-- script (feedsync_merge.lua) share; loaded in front of them, as one script.
-- An item is a SyncState (src/model/feedsync.rs) in the hash `sx`, keyed by loc; the sorted set
-- `sx-conflicts` holds the locs whose items carry conflicts.
-- The caller's KEYS[7] is `sx`, KEYS[8] `sx-conflicts`.
-- An item of the common shape (one history entry, by a publisher, whose sequence equals the
-- item's number of updates; no conflicts, no `noconflicts`, the id the hub gives the loc) is
-- stored counted, as 'UPDATES PUBLISHER': its id, when and deleted are those the resource's
-- latest change implies (its entry in `res`, written with it), as feedsync.rs reads it. Any
-- other item is stored as its JSON.
-- sx_record must compute what feedsync::record_local computes, and is checked against it by
-- the store contract (tests/store_contract.rs).
-- sx_items holds, per loc of the call, its item: a table, or a string (counted, or JSON as
-- stored; once recorded, only counted). sx_order lists the locs recorded (sx_recorded of
-- them), sx_prev holds the entry of each one's latest change in this call. sx_had tells
-- whether the stored item carried conflicts (it is then in `sx-conflicts`), for the locs whose
-- first change of the call did not find a counted item (read then); sx_table holds the locs
-- whose item is a table now.
-- Lists grow by their own counters, not by `#`: Lua 5.1 searches for a table's length.
local sx_items, sx_order, sx_merged, sx_had, sx_prev, sx_table = {}, {}, {}, {}, {}, {}
local sx_recorded = 0
-- Set by the merge script: the append writes the items and the index with the log (append.lua).
local sx_inline = false
-- Called for every change: kept in locals (a global is a table lookup each time).
local find, format, match = string.find, string.format, string.match

-- The item id of a loc: every byte that is not plain in an RFC 2141 NSS percent-encoded.
local function sx_id(loc)
  return (string.gsub(loc, "[^%w%(%)%+,%-%.:=@;%$_!%*']", function(c)
    return string.format('%%%02X', string.byte(c))
  end))
end

local function sx_subsumed(hx, hy)
  if hx.by ~= nil then return hy.by == hx.by and hy.sequence >= hx.sequence end
  return hy.by == nil and hy.when == hx.when and hy.sequence == hx.sequence
end

-- Of the updates by one endpoint only the newest stays (the first of equals); the topmost and
-- those without `by` always stay.
local function sx_compact(history)
  local best, at = {}, {}
  for j, h in ipairs(history) do
    if h.by ~= nil and (best[h.by] == nil or h.sequence > best[h.by]) then
      best[h.by] = h.sequence
      at[h.by] = j
    end
  end
  local out = {}
  for j, h in ipairs(history) do
    if j == 1 or h.by == nil or at[h.by] == j then out[#out + 1] = h end
  end
  return out
end

-- The update of FeedSync §3.2 by `by` at `when`, then compaction.
local function sx_update(item, by, when, deleted)
  item.updates = math.min(item.updates + 1, 2147483647)
  local conflicts = item.conflicts or {}
  local seq = item.updates
  if by ~= nil then
    local own = 0
    for _, h in ipairs(item.history) do
      if h.by == by and h.sequence > own then own = h.sequence end
    end
    for _, c in ipairs(conflicts) do
      for _, h in ipairs(c.sync.history) do
        if h.by == by and h.sequence > own then own = h.sequence end
      end
    end
    if seq <= own then seq = math.min(own + 1, 2147483647) end
  end
  table.insert(item.history, 1, {sequence = seq, when = when, by = by})
  if by ~= nil then
    local kept = {}
    for _, c in ipairs(conflicts) do
      if c.sync.history[1].by == by then
        for _, hx in ipairs(c.sync.history) do
          local known = false
          for _, hy in ipairs(item.history) do
            if sx_subsumed(hx, hy) then known = true break end
          end
          if not known then table.insert(item.history, 2, hx) end
        end
      else
        kept[#kept + 1] = c
      end
    end
    conflicts = kept
  end
  if #conflicts > 0 then item.conflicts = conflicts else item.conflicts = nil end
  if deleted then item.deleted = true else item.deleted = nil end
  item.history = sx_compact(item.history)
  return item
end

-- Whether log entry `e` of `loc` is a deletion. The entry's JSON starts with
-- {"loc":"LOC","change":"KIND"; when LOC needed no escaping in JSON (nearly always), KIND is
-- at a known place and is looked at there (a pattern match per change cost more than the rest
-- of recording it). An escaped loc cannot hold `","change":"` (every quote in it follows a
-- backslash), so the plain find answers exactly.
local function sx_deleted(e, loc)
  local at = 23 + 8 + #loc + 1
  if string.find(e, '","change":"', at, true) == at then
    return string.byte(e, at + 12) == 100 -- 'd'eleted (the others: created, updated)
  end
  return string.match(e, '^%d+{"loc":".-","change":"(%a+)"') == 'deleted'
end

-- The publisher of log entry `e`, from its last field `,"source":"NAME"}` (nil when it has
-- none), and the end of a counted item of that publisher (' NAME'), found by a pattern and
-- remembered: sx_last_tail is the entry's end that names it, sx_last_counted the pattern of a
-- counted item of it (capturing its number). Every change of one request has the same
-- publisher: sx_record compares an entry's end with sx_last_tail first, and calls this only
-- where they differ (the first change of a call, or where a call's next request has another
-- publisher).
local sx_last_by, sx_last_tail, sx_last_suffix, sx_last_counted
local function sx_find_by(e)
  local by = string.match(e, ',"source":"([^"\\]+)"}$')
  if by then
    sx_last_by, sx_last_tail, sx_last_suffix = by, ',"source":"' .. by .. '"}', ' ' .. by
    sx_last_counted = '^(%d+) ' .. string.gsub(by, '%p', '%%%0') .. '$'
  end
  return by, sx_last_suffix
end

-- Reads the stored items of the locs ARGV[first + 1] to ARGV[first + n] with HMGET, in
-- pieces, before their changes are recorded: every loc recorded is in sx_items from then on
-- (false: no item yet).
local function sx_prefetch(key, first, n)
  local piece, pieced = {}, 0
  local function fetch()
    local raws = redis.call('HMGET', key, unpack(piece, 1, pieced))
    for j = 1, pieced do
      sx_items[piece[j]] = raws[j]
    end
    pieced = 0
  end
  for i = first + 1, first + n do
    local loc = ARGV[i]
    if sx_items[loc] == nil then
      sx_items[loc] = false
      pieced = pieced + 1
      piece[pieced] = loc
      if pieced >= 500 then fetch() end
    end
  end
  if pieced > 0 then fetch() end
end

-- The item that counted item `raw` of `loc` stands for, given `prev`, the entry of the loc's
-- latest change (the one that made `raw`).
local function sx_expand(raw, loc, prev)
  local u, by = string.match(raw, '^(%d+) (.+)$')
  if not u or not prev then
    return error('changehub: the FeedSync item of ' .. loc .. ' is not readable')
  end
  u = tonumber(u)
  local when = tonumber(string.sub(prev, 1, 14)) - 1000000000000
  local item = {id = sx_id(loc), updates = u, history = {{sequence = u, when = when, by = by}}}
  if sx_deleted(prev, loc) then item.deleted = true end
  return item
end

-- Records change `e` (a log entry: its final 23-digit datetime key, then the change's JSON,
-- which starts with loc and change and ends with source) of `loc`: its item (read by
-- sx_prefetch) is created or updated, or takes the merged state given for it. `res` is the
-- resource index (the entry of a loc's latest change before this call).
-- Returns the entry, with the item's number of conflicts added when there are any.
local function sx_record(res, loc, e)
  local item, merged = sx_items[loc], sx_merged[loc]
  local by, suffix
  if sx_last_tail and find(e, sx_last_tail, #e - #sx_last_tail + 1, true) then
    by, suffix = sx_last_by, sx_last_suffix
  else
    by, suffix = sx_find_by(e)
  end
  -- The common case first: the same publisher again on a counted item, or a new resource.
  local counted
  if by and not merged then
    if not item then
      counted = '1' .. suffix
    else
      -- A counted item of this publisher: digits, as sx_expand reads them (anything else
      -- is left to it), made a number by arithmetic (tonumber converts twice) and written
      -- back with '%d' (`..` on a number formats it as a float).
      local digits = not sx_table[loc] and match(item, sx_last_counted)
      if digits then
        -- Its new entry replaces its old one (§3.2, then the compaction that keeps one
        -- entry per endpoint); updates and sequence stay equal.
        local u = digits + 0
        if u < 2147483647 then u = u + 1 else u = 2147483647 end
        counted = format('%d', u) .. suffix
      end
    end
  end
  -- Only a JSON item can carry conflicts; a counted one carries none.
  if not counted and sx_prev[loc] == nil and item and string.byte(item, 1) == 123 then
    sx_had[loc] = find(item, '"conflicts":', 1, true) ~= nil
  end
  if counted then
    item = counted
  elseif merged then
    item = cjson.decode(merged)
  else
    -- Whole seconds since the epoch: the key is nanoseconds + 10^21.
    local when = tonumber(string.sub(e, 1, 14)) - 1000000000000
    local deleted = sx_deleted(e, loc)
    if not item then
      item = {id = sx_id(loc), updates = 1, history = {{sequence = 1, when = when, by = by}}}
      if deleted then item.deleted = true end
    else
      if type(item) == 'string' then
        if string.byte(item, 1) == 123 then -- '{'
          item = cjson.decode(item)
        else
          item = sx_expand(item, loc, sx_prev[loc] or redis.call('HGET', res, loc))
        end
      end
      item = sx_update(item, by, when, deleted)
      -- Counted from now on when it has come to the common shape.
      if by and #item.history == 1 and item.history[1].sequence == item.updates
          and item.conflicts == nil and not item.noconflicts and item.id == sx_id(loc) then
        item = item.updates .. suffix
      end
    end
  end
  sx_items[loc] = item
  if sx_prev[loc] == nil then
    sx_recorded = sx_recorded + 1
    sx_order[sx_recorded] = loc
  end
  sx_prev[loc] = e
  if not counted then
    if type(item) == 'table' then
      sx_table[loc] = true
      local n = item.conflicts and #item.conflicts or 0
      if n > 0 then e = string.sub(e, 1, -2) .. ',"conflicts":' .. n .. '}' end
    else
      sx_table[loc] = nil
    end
  end
  return e
end

-- Writes every item recorded, and the conflicts set (score 0: in loc order), which changes
-- only where an item gained or lost its conflicts.
local function sx_flush(key, conflicts_key)
  local pending, n = {}, 0
  for i = 1, sx_recorded do
    local loc = sx_order[i]
    local item = sx_items[loc]
    local has = false
    if sx_table[loc] then
      has = item.conflicts ~= nil
      item = cjson.encode(item)
    end
    pending[n + 1] = loc
    pending[n + 2] = item
    n = n + 2
    if has and not sx_had[loc] then
      redis.call('ZADD', conflicts_key, 0, loc)
    elseif sx_had[loc] and not has then
      redis.call('ZREM', conflicts_key, loc)
    end
    if n >= 1000 then
      redis.call('HSET', key, unpack(pending, 1, n))
      n = 0
    end
  end
  if n > 0 then redis.call('HSET', key, unpack(pending, 1, n)) end
end
