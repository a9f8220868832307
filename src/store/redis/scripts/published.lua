-- KEYS: meta; ARGV: first, last, events channel, channel name
local p = tonumber(redis.call('HGET', KEYS[1], 'published') or '0')
if tonumber(ARGV[2]) > p then redis.call('HSET', KEYS[1], 'published', ARGV[2]) end
redis.call('PUBLISH', ARGV[3], 'published ' .. ARGV[4] .. ' ' .. ARGV[1] .. ' ' .. ARGV[2])
return 0
