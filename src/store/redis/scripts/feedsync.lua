-- FeedSync items (see feedsync.rs): functions the append script (append.lua) and the merge
-- script (feedsync_merge.lua) share; loaded in front of them, as one script.
-- An item is the JSON of a SyncState (src/model/feedsync.rs) in the hash `sx`, keyed by loc;
-- the sorted set `sx-conflicts` holds the locs whose items carry conflicts.
-- The caller's KEYS[7] is `sx`, KEYS[8] `sx-conflicts`.
-- sx_record must compute what feedsync::record_local computes, and is checked against it by
-- the store contract (tests/store_contract.rs).
local sx_items, sx_order, sx_merged = {}, {}, {}

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

-- Records change `e` (a log entry: a 23-digit datetime key, then the change's JSON, which
-- starts with loc and change and ends with source) of `loc`, whose final datetime key is `d`:
-- its item is created or updated, or takes the merged state given for it. Returns the entry,
-- with the item's number of conflicts added when there are any.
local function sx_record(key, loc, e, d)
  local item = sx_items[loc]
  if item == nil then
    local raw = redis.call('HGET', key, loc)
    item = raw and cjson.decode(raw) or false
    sx_order[#sx_order + 1] = loc
  end
  if sx_merged[loc] then
    item = cjson.decode(sx_merged[loc])
  else
    local kind = string.match(e, '^%d+{"loc":".-","change":"(%a+)"')
    local by = string.match(e, ',"source":"([^"\\]+)"}$')
    -- Whole seconds since the epoch: the key is nanoseconds + 10^21.
    local when = tonumber(string.sub(d, 1, 14)) - 1000000000000
    local deleted = kind == 'deleted'
    if item then
      item = sx_update(item, by, when, deleted)
    else
      item = {id = sx_id(loc), updates = 1, history = {{sequence = 1, when = when, by = by}}}
      if deleted then item.deleted = true end
    end
  end
  sx_items[loc] = item
  local n = item.conflicts and #item.conflicts or 0
  if n > 0 then e = string.sub(e, 1, -2) .. ',"conflicts":' .. n .. '}' end
  return e
end

-- Writes every item recorded, and the conflicts set (score 0: in loc order).
local function sx_flush(key, conflicts_key)
  local pending = {}
  for _, loc in ipairs(sx_order) do
    local item = sx_items[loc]
    pending[#pending + 1] = loc
    pending[#pending + 1] = cjson.encode(item)
    if item.conflicts then
      redis.call('ZADD', conflicts_key, 0, loc)
    else
      redis.call('ZREM', conflicts_key, loc)
    end
    if #pending >= 200 then
      redis.call('HSET', key, unpack(pending))
      pending = {}
    end
  end
  if #pending > 0 then redis.call('HSET', key, unpack(pending)) end
end
