-- The board's request: a small chat completion, not streamed. BOARD_AUTH is the bearer token;
-- BOARD_HEADERS ("Name: value|Name: value") adds a peer gateway's routing headers.
wrk.method = "POST"
wrk.body = '{"model":"alpha-5.5","max_tokens":64,"messages":[{"role":"user","content":"hello"}]}'
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer " .. (os.getenv("BOARD_AUTH") or "sk-bench-board")
for h in string.gmatch(os.getenv("BOARD_HEADERS") or "", "[^|]+") do
  local name, value = string.match(h, "^%s*([^:]+):%s*(.*)$")
  if name then wrk.headers[name] = value end
end
done = function(summary, latency, requests)
  io.write(string.format('RESULT {"requests":%d,"rps":%.1f,"p50_us":%d,"p99_us":%d,"max_us":%d,"errors":%d,"non2xx":%d}\n',
    summary.requests, summary.requests / (summary.duration / 1e6), latency:percentile(50), latency:percentile(99),
    latency.max, summary.errors.connect + summary.errors.read + summary.errors.write + summary.errors.timeout,
    summary.errors.status))
end
