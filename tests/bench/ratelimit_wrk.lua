-- wrk script: POST /v1/GetRateLimits with one token-bucket request per call over
-- RL_KEYS distinct keys (default 10000): limit 100 per minute, hits 1 - the workload of
-- ratelimit_bench api and of the Redis EVALSHA script (ratelimit_token_bucket.lua).
-- Used by tests/bench/ratelimit_bench.sh.
local keys = tonumber(os.getenv("RL_KEYS") or "10000")
local fmt = '{"requests":[{"name":"requests_per_sec","unique_key":"account:%07d",' ..
	'"hits":1,"limit":100,"duration":60000}]}'
local counter = 0

wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"

function setup(thread)
	thread:set("id", counter)
	counter = counter + 1
end

function init(args)
	math.randomseed(12345 + (id or 0))
end

function request()
	return wrk.format(nil, nil, nil, string.format(fmt, math.random(0, keys - 1)))
end

function done(summary, latency, requests)
	local e = summary.errors
	local secs = summary.duration / 1e6
	io.write(string.format("http requests=%d seconds=%.3f rate=%.0f p50_us=%d p99_us=%d errors=%d\n",
		summary.requests, secs, summary.requests / secs, latency:percentile(50),
		latency:percentile(99), e.connect + e.read + e.write + e.status + e.timeout))
end
