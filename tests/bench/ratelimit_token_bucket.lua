-- The token bucket of stripedb's benchmark as a Redis script (EVALSHA), the alternative
-- Gubernator's authors compared against: KEYS[1] = bucket, ARGV = limit, duration (ms),
-- hits. Same semantics as the limiter's token bucket: a fixed window of `duration` from
-- the first hit, a request for more than remaining is refused without consuming.
-- Returns {status (0 under, 1 over), remaining, reset_time (epoch ms)}.
local limit = tonumber(ARGV[1])
local duration = tonumber(ARGV[2])
local hits = tonumber(ARGV[3])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local v = redis.call('HMGET', KEYS[1], 'r', 'e')
local remaining = tonumber(v[1])
local expire = tonumber(v[2])
if remaining == nil or expire == nil or now >= expire then
	remaining = limit
	expire = now + duration
end
local status = 0
if hits > remaining then
	status = 1
else
	remaining = remaining - hits
end
redis.call('HSET', KEYS[1], 'r', remaining, 'e', expire)
redis.call('PEXPIREAT', KEYS[1], expire)
return {status, remaining, expire}
