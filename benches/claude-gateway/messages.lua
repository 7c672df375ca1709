-- A small messages request with the person's bearer token (BENCH_TOKEN), for bench.py.
wrk.method = "POST"
wrk.body = '{"model":"beta-opus-4-7","max_tokens":64,"messages":[{"role":"user","content":"hello"}]}'
wrk.headers["Content-Type"] = "application/json"
wrk.headers["anthropic-version"] = "2023-06-01"
-- The mock (the baseline) takes its key as x-api-key (BENCH_API_KEY=1); the gateways a bearer.
if os.getenv("BENCH_API_KEY") == "1" then
  wrk.headers["x-api-key"] = os.getenv("BENCH_TOKEN")
else
  wrk.headers["Authorization"] = "Bearer " .. os.getenv("BENCH_TOKEN")
end
done = function(summary, latency, requests)
  io.write(string.format("RESULT rps=%.1f p50_us=%d p99_us=%d errors=%d non2xx=%d\n",
    summary.requests / (summary.duration / 1e6), latency:percentile(50), latency:percentile(99),
    summary.errors.connect + summary.errors.read + summary.errors.write + summary.errors.timeout,
    summary.errors.status))
end
