#!/usr/bin/env bash
# The relay's own overhead, seen by an external load generator (issue 25). wrk (2 threads, so the
# generator gets one core's worth of the machine's two) POSTs a small chat completion at c=64 and
# c=1, then a 256 KiB body with "model" last at c=16, to an nginx upstream that answers a fixed
# completion with usage (it costs almost nothing: going direct is several times any proxy). In
# one run, best of two rounds:
#   direct     the upstream itself
#   nginx      nginx as a plain reverse proxy (2 workers, upstream keepalive)
#   bare       a Pingora proxy with no logic (bare/, same Pingora version, 2 threads): the ceiling
#   tollgate   2 threads, default commit mode, RUST_LOG=warn
#   tg-sync    the same with billing.sync_commit: true (every record on disk before its answer)
# Prints the table, then tollgate's and tg-sync's ratios to bare (throughput) and added p99 at c=1
# (over direct) against bare's. The proxies' CPU time (user + system, all threads, from /proc) and
# context switches per request at c=64 show small changes that throughput's noise hides.
# PERF_OTHER_BIN=path/to/another/tollgate adds it as target "other" (a change against HEAD's build). `../shared/perf/run.sh`, the team's reference, measures the same.
# PERF_TRACED=1 adds target "traced": HEAD's build exporting a span per request and per upstream
# attempt (sample ratio 1.0) over OTLP/HTTP to a stand-in collector (otlp_sink.py), compared with
# "tollgate" at the end (issue 31's cost of tracing).
# Usage, from the repository root: bash benches/relay/run.sh  (PERF_SECONDS=8 by default).
set -u
here="$(cd "$(dirname "$0")" && pwd)"
dur="${PERF_SECONDS:-8}"
. "$here/prepare.sh"
bin="$PWD/target/release/tollgate"
dir="$(mktemp -d -t tollgate-relay-perf.XXXX)"
UP=$(port); PX=$(port); BP=$(port); GW=$(port); GA=$(port); GS=$(port); GSA=$(port)
for t in upstream proxy; do sed -e "s#__DIR__#$dir#g" -e "s#__UP__#$UP#g" -e "s#__PX__#$PX#g" "$here/$t.conf.tmpl" > "$dir/$t.conf"; done
pids=""
nginx -p "$dir" -c "$dir/upstream.conf" -g 'daemon off;' & pids="$pids $!"
nginx -p "$dir" -c "$dir/proxy.conf" -g 'daemon off;' & pids="$pids $!"
"$bare" "127.0.0.1:$BP" "127.0.0.1:$UP" 2 >"$dir/bare.log" 2>&1 & pids="$pids $!"
. "$here/../gateway-config.sh"
gateway() { # name listen admin billing
  write_gateway_config "$dir/$1.yaml" "$dir" "$1" "$2" "$3" "$UP" "\"billing\": $4,"
  RUST_LOG=warn "$bin" -c "$dir/$1.yaml" >"$dir/$1.log" 2>&1 & pids="$pids $!"
}
gateway tollgate "$GW" "$GA" '{}'
gateway tg-sync "$GS" "$GSA" '{"sync_commit": true}'
declare -A PID
PID[nginx]=$(echo $pids | awk '{print $2}')
PID[bare]=$(echo $pids | awk '{print $3}')
PID[tollgate]=$(echo $pids | awk '{print $4}')
PID[tg-sync]=$(echo $pids | awk '{print $5}')
targets="direct:$UP nginx:$PX bare:$BP tollgate:$GW tg-sync:$GS"
if [ -n "${PERF_OTHER_BIN:-}" ]; then
  GO=$(port); GOA=$(port)
  bin="$PERF_OTHER_BIN" gateway other "$GO" "$GOA" '{}'
  PID[other]=$(echo $pids | awk '{print $6}')
  targets="$targets other:$GO"
fi
if [ -n "${PERF_TRACED:-}" ]; then
  TS=$(port); GT=$(port); GTA=$(port)
  python3 "$here/otlp_sink.py" "$TS" >/dev/null 2>&1 & pids="$pids $!"
  export OTEL_BSP_SCHEDULE_DELAY=200
  gateway traced "$GT" "$GTA" "{}, \"telemetry\": {\"otlp\": {\"endpoint\": \"http://127.0.0.1:$TS\", \"sample_ratio\": 1.0}}"
  PID[traced]=$(echo $pids | awk '{print $NF}')
  targets="$targets traced:$GT"
fi
# CPU ticks (user + system, all threads) and context switches (all threads) of a process and
# its children (nginx's workers).
family() { echo "$1" $(pgrep -P "$1"); }
ticks() { for q in $(family "$1"); do awk '{print $14 + $15}' "/proc/$q/stat" 2>/dev/null; done | awk '{s += $1} END {print s + 0}'; }
switches() { for q in $(family "$1"); do cat /proc/"$q"/task/*/status 2>/dev/null; done | awk '/ctxt_switches/ {s += $2} END {print s + 0}'; }
hz=$(getconf CLK_TCK)
# nginx stops at TERM; the Pingora proxies are killed (a graceful stop waits out its grace period).
cleanup() { kill $pids 2>/dev/null; for n in "${!PID[@]}"; do [ "$n" = nginx ] || kill -9 "${PID[$n]}" 2>/dev/null; done; wait 2>/dev/null; rm -rf "$dir"; }
trap cleanup EXIT
for t in $targets; do p=${t#*:}; for i in $(seq 1 200); do curl -s -o /dev/null "http://127.0.0.1:$p/" && break; sleep 0.2; done; done
path=/v1/chat/completions
run() { wrk -t"$1" -c"$2" -d"${dur}s" -s "$here/$4" "http://127.0.0.1:$3$path" 2>/dev/null | grep RESULT; }
field() { sed -E "s/.*$1=([0-9.]+).*/\\1/"; }
declare -A RPS P50 P99 LRPS ERR CPU CSW
for t in $targets; do run 1 4 "${t#*:}" post.lua >/dev/null; done   # warm-up
for round in 1 2; do
  for t in $targets; do
    n=${t%%:*}; p=${t#*:}
    pid=${PID[$n]:-}
    [ -n "$pid" ] && { c0=$(ticks "$pid"); s0=$(switches "$pid"); }
    r=$(run 2 64 "$p" post.lua)
    if [ -n "$pid" ]; then
      c1=$(ticks "$pid"); s1=$(switches "$pid"); reqs=$(echo "$r" | field rps | awk -v d="$dur" '{print $1 * d}')
      CPU[$n]="${CPU[$n]:-} $(awk -v a="$c0" -v b="$c1" -v n="$reqs" -v hz="$hz" 'BEGIN {printf "%.1f", (b - a) / hz * 1e6 / n}')"
      CSW[$n]="${CSW[$n]:-} $(awk -v a="$s0" -v b="$s1" -v n="$reqs" 'BEGIN {printf "%.2f", (b - a) / n}')"
    fi
    l=$(run 1 1 "$p" post.lua); g=$(TOLLGATE_WRK_BODY=large run 2 16 "$p" post.lua)
    RPS[$n]="${RPS[$n]:-} $(echo "$r" | field rps)"
    P50[$n]="${P50[$n]:-} $(echo "$l" | field p50_us)"
    P99[$n]="${P99[$n]:-} $(echo "$l" | field p99_us)"
    LRPS[$n]="${LRPS[$n]:-} $(echo "$g" | field rps)"
    ERR[$n]="${ERR[$n]:-} $(echo "$r $g" | grep -oE 'errors=[0-9]+ non2xx=[0-9]+' | tr '\n' ' ')"
  done
done
best() { echo $1 | tr ' ' '\n' | sort -g | tail -1; }
low() { echo $1 | tr ' ' '\n' | sort -g | head -1; }
printf "%-9s %12s %11s %11s %17s %14s %13s\n" target "rps c=64" "p50 us c=1" "p99 us c=1" "256 KiB rps c=16" "cpu us/req" "switches/req"
for t in $targets; do
  n=${t%%:*}
  printf "%-9s %12s %11s %11s %17s %14s %13s\n" $n "$(best "${RPS[$n]}")" "$(low "${P50[$n]}")" "$(low "${P99[$n]}")" "$(best "${LRPS[$n]}")" "$(low "${CPU[$n]:--}")" "$(low "${CSW[$n]:--}")"
done
for n in tollgate tg-sync ${PERF_OTHER_BIN:+other}; do
  python3 - "$n" "$(best "${RPS[$n]}")" "$(best "${RPS[bare]}")" "$(best "${LRPS[$n]}")" "$(best "${LRPS[bare]}")" "$(low "${P99[$n]}")" "$(low "${P99[bare]}")" "$(low "${P99[direct]}")" "${ERR[$n]}" <<'PY'
import sys
n = sys.argv[1]
t, b, lt, lb, t99, b99, d99 = (float(x) for x in sys.argv[2:9])
added_t, added_b = max(t99 - d99, 1.0), max(b99 - d99, 1.0)
errors = sum(int(x.split("=")[1]) for x in sys.argv[9].split() if "=" in x)
print("%s/bare throughput=%.2f 256KiB=%.2f added_p99 %s=%dus bare=%dus ratio=%.2f errors+non2xx=%d"
      % (n, t / b, lt / lb, n, added_t, added_b, added_t / added_b, errors))
PY
done
if [ -n "${PERF_TRACED:-}" ]; then
  python3 - "$(best "${RPS[traced]}")" "$(best "${RPS[tollgate]}")" "$(low "${CPU[traced]}")" "$(low "${CPU[tollgate]}")" <<'PY'
import sys
rt, rp, ct, cp = (float(x) for x in sys.argv[1:5])
print(f"traced / tollgate: {rt / rp:.3f}x throughput (c=64), {ct / cp:.3f}x CPU per request ({ct - cp:+.1f} us)")
PY
fi
