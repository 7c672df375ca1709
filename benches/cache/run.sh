#!/usr/bin/env bash
# The response cache's figures (issue 70), in one run on this machine, against the relay's nginx
# upstream (benches/relay) and the bundled mock:
#   throughput  wrk -t2 -c64, a small chat completion at temperature 0: "hit" (a gateway whose
#               group caches it: every request after the first is answered from the cache)
#               against "relay" (the same build without a cache section: every request relayed
#               to the local upstream); medians of three rounds, and their ratio (target >= 2)
#   c=1         wrk -t1 -c1: p50 and p99 of each (target: the hit's p99 below the relay's)
#   stream      a streamed answer of 2,000 events (the mock's x-mock-deltas): time to the first
#               byte of a hit, and of the same call relayed (x-tollgate-cache: refresh), at the
#               client on loopback, p50 and p99 of 200 each (target: the hit's <= 1 ms)
# Instructions per request of a miss against a relay without the cache (target <= 1.05x) are
# callgrind's, through benches/relay/instructions.sh:
#   TOLLGATE_WRK_BODY=unique PERF_OTHER_BIN=target/release/tollgate \
#     PERF_OTHER_EXTRA='"cache": {},' PERF_OTHER_GROUP=', "cache": {"ttl": 3600}' bash benches/relay/instructions.sh
# (and the build before the cache as PERF_OTHER_BIN with the same body, for "cache off: unchanged").
# Usage, from the repository root: bash benches/cache/run.sh  (PERF_SECONDS=6 by default).
set -u
here="$(cd "$(dirname "$0")/../relay" && pwd)"
dur="${PERF_SECONDS:-6}"
. "$here/prepare.sh"
cargo build --release --bin tollgate-mock >/dev/null 2>&1 || { echo "mock build failed"; exit 1; }
bin="$PWD/target/release/tollgate"
dir="$(mktemp -d -t tollgate-cache-perf.XXXX)"
UP=$(port); RELAY=$(port); HIT=$(port); MOCK=$(port); STREAM=$(port)
sed -e "s#__DIR__#$dir#g" -e "s#__UP__#$UP#g" "$here/upstream.conf.tmpl" > "$dir/upstream.conf"
pids=""
nginx -p "$dir" -c "$dir/upstream.conf" -g 'daemon off;' & pids="$pids $!"
"$PWD/target/release/tollgate-mock" --listen "127.0.0.1:$MOCK" --key up-openai-key >"$dir/mock.log" 2>&1 & pids="$pids $!"
. "$here/../gateway-config.sh"
write_gateway_config "$dir/relay.yaml" "$dir" relay "$RELAY" "$(port)" "$UP" ""
write_gateway_config "$dir/hit.yaml" "$dir" hit "$HIT" "$(port)" "$UP" '"cache": {},' ', "cache": {"ttl": 3600}'
write_gateway_config "$dir/stream.yaml" "$dir" stream "$STREAM" "$(port)" "$MOCK" '"cache": {"max_entry_bytes": 8388608}, "forward_headers": ["x-mock-*"],' ', "cache": {"ttl": 3600}'
for g in relay hit stream; do RUST_LOG=warn "$bin" -c "$dir/$g.yaml" >"$dir/$g.log" 2>&1 & pids="$pids $!"; done
cleanup() { kill -9 $pids 2>/dev/null; wait 2>/dev/null; rm -rf "$dir"; }
trap cleanup EXIT
for p in $RELAY $HIT $STREAM; do for _ in $(seq 1 200); do curl -s -o /dev/null "http://127.0.0.1:$p/" && break; sleep 0.2; done; done
export TOLLGATE_WRK_BODY=cached
run() { wrk -t"$1" -c"$2" -d"${dur}s" -s "$here/post.lua" "http://127.0.0.1:$3/v1/chat/completions" 2>/dev/null | grep RESULT; }
field() { sed -E "s/.*$1=([0-9.]+).*/\\1/"; }
for p in $RELAY $HIT; do run 1 4 "$p" >/dev/null; done   # warm-up (and the hit's first, kept answer)
declare -A RPS
for round in 1 2 3; do
  for t in relay:$RELAY hit:$HIT; do
    r=$(run 2 64 "${t#*:}")
    [ "$(echo "$r" | field non2xx)" = 0 ] || echo "warning: ${t%%:*} answered non-2xx: $r"
    RPS[${t%%:*}]="${RPS[${t%%:*}]:-} $(echo "$r" | field rps)"
  done
done
median() { echo "$@" | tr ' ' '\n' | sort -n | awk 'NF {a[n++] = $1} END {print a[int(n / 2)]}'; }
relay_rps=$(median ${RPS[relay]}); hit_rps=$(median ${RPS[hit]})
c1_relay=$(run 1 1 "$RELAY"); c1_hit=$(run 1 1 "$HIT")
printf "throughput c=64 (median of 3)  relay %8.0f req/s   hit %8.0f req/s   hit/relay %.2f\n" "$relay_rps" "$hit_rps" "$(echo "$hit_rps / $relay_rps" | bc -l)"
printf "c=1 latency                    relay p50 %5d us p99 %5d us   hit p50 %5d us p99 %5d us\n" \
  "$(echo "$c1_relay" | field p50_us)" "$(echo "$c1_relay" | field p99_us)" "$(echo "$c1_hit" | field p50_us)" "$(echo "$c1_hit" | field p99_us)"
# A 2,000-event stream: kept once, then its hits and the same call relayed, timed to the first byte.
python3 - "$STREAM" <<'PY'
import http.client, json, statistics, sys, time
port = int(sys.argv[1])
body = json.dumps({"model": "alpha-5.5", "temperature": 0, "stream": True, "messages": [{"role": "user", "content": "a long story"}]})
def call(extra):
    c = http.client.HTTPConnection("127.0.0.1", port)
    headers = {"Authorization": "Bearer sk-bench-0000000000000000000001", "Content-Type": "application/json", "x-mock-deltas": "2000", **extra}
    t0 = time.perf_counter()
    c.request("POST", "/v1/chat/completions", body, headers)
    r = c.getresponse()
    r.read(1)
    first = time.perf_counter() - t0
    rest = r.read()
    c.close()
    return r.getheader("x-tollgate-cache"), first, rest.count(b"data: ") + 1
verdict, _, events = call({})
assert verdict == "miss" and events > 2000, (verdict, events)
def times(extra, want):
    out = []
    for _ in range(200):
        v, first, n = call(extra)
        assert v == want and n == events, (v, n)
        out.append(first * 1e6)
    out.sort()
    return statistics.median(out), out[int(len(out) * 0.99) - 1]
hit = times({}, "hit")
relay = times({"x-tollgate-cache": "refresh"}, "miss")
print("stream of %d events, first byte  hit p50 %5.0f us p99 %5.0f us   relayed p50 %5.0f us p99 %5.0f us" % (events, hit[0], hit[1], relay[0], relay[1]))
PY
