-- KEYS: owner; ARGV: holder, events channel, channel name
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  redis.call('PUBLISH', ARGV[2], 'released ' .. ARGV[3])
end
return 0
