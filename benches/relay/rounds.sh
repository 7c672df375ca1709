#!/usr/bin/env bash
# The relay's overhead as a median over many short alternating rounds (issue 25). On this shared
# 2-core machine one 8 s round moves by ±10 % with the neighbours (the same binary measured 0.77×
# and 1.16× bare Pingora minutes apart), so run.sh's best-of-two can say little about a change of
# a few per cent. Here bare Pingora, tollgate and tollgate with billing.sync_commit take turns,
# round after round (ROUNDS, 10 by default, of PERF_SECONDS, 4 by default, each; each round
# starts one target later than the one before), each round's ratios are taken against bare's
# figure of the same round, and the medians are reported:
#   throughput   wrk -t2 -c64 req/s (TOLLGATE_WRK_BODY=large: the 256 KiB body at c=16)
#   cpu/req      the proxy's CPU time per request, user + system, all threads, from /proc
# Same upstream, load generator and gateway configuration as run.sh. PERF_OTHER_BIN=path adds
# that build as target "other" (a change against HEAD's build).
# Usage, from the repository root: bash benches/relay/rounds.sh
set -u
here="$(cd "$(dirname "$0")" && pwd)"
dur="${PERF_SECONDS:-4}"
rounds="${ROUNDS:-10}"
. "$here/prepare.sh"
dir="$(mktemp -d -t tollgate-rounds.XXXX)"
UP=$(port)
sed -e "s#__DIR__#$dir#g" -e "s#__UP__#$UP#g" "$here/upstream.conf.tmpl" > "$dir/upstream.conf"
pids=""
cleanup() { kill $pids 2>/dev/null; wait 2>/dev/null; rm -rf "$dir"; }
trap cleanup EXIT
nginx -p "$dir" -c "$dir/upstream.conf" -g 'daemon off;' & pids="$pids $!"
declare -A PID PORT
BP=$(port); "$bare" "127.0.0.1:$BP" "127.0.0.1:$UP" 2 >"$dir/bare.log" 2>&1 & pids="$pids $!"
PID[bare]=$!; PORT[bare]=$BP
. "$here/../gateway-config.sh"
gateway() { # name binary billing
  local listen admin; listen=$(port); admin=$(port)
  write_gateway_config "$dir/$1.yaml" "$dir" "$1" "$listen" "$admin" "$UP" "\"billing\": $3,"
  RUST_LOG=warn "$2" -c "$dir/$1.yaml" >"$dir/$1.log" 2>&1 & pids="$pids $!"
  PID[$1]=$!; PORT[$1]=$listen
}
gateway tollgate "$PWD/target/release/tollgate" '{}'
gateway tg-sync "$PWD/target/release/tollgate" '{"sync_commit": true}'
names="bare tollgate tg-sync"
[ -n "${PERF_OTHER_BIN:-}" ] && { gateway other "$PERF_OTHER_BIN" '{}'; names="$names other"; }
conns=64; [ "${TOLLGATE_WRK_BODY:-}" = large ] && conns=16
for n in $names; do
  for _ in $(seq 1 200); do curl -s -o /dev/null "http://127.0.0.1:${PORT[$n]}/" && break; sleep 0.2; done
  wrk -t2 -c$conns -d2s -s "$here/post.lua" "http://127.0.0.1:${PORT[$n]}/v1/chat/completions" >/dev/null 2>&1   # warm-up
done
ticks() { awk '{print $14 + $15}' "/proc/$1/stat" 2>/dev/null || echo 0; }
hz=$(getconf CLK_TCK)
: > "$dir/rounds.txt"
set -- $names
for round in $(seq 1 "$rounds"); do
  # Each round starts one target later, so no target always follows the same one.
  order="$*"; for _ in $(seq 2 "$round"); do order="${order#* } ${order%% *}"; done
  for n in $order; do
    c0=$(ticks "${PID[$n]}")
    r=$(wrk -t2 -c$conns -d"${dur}s" -s "$here/post.lua" "http://127.0.0.1:${PORT[$n]}/v1/chat/completions" 2>/dev/null | grep RESULT)
    c1=$(ticks "${PID[$n]}")
    echo "$round $n $c0 $c1 $r" >> "$dir/rounds.txt"
  done
done
python3 - "$dir/rounds.txt" "$dur" "$hz" "$names" <<'PY'
import re, statistics, sys
path, dur, hz, names = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), sys.argv[4].split()
rows = {}
errors = {n: 0 for n in names}
for line in open(path):
    m = re.match(r"(\d+) (\S+) (\d+) (\d+) .*rps=([0-9.]+).*errors=(\d+) non2xx=(\d+)", line)
    if not m:
        continue
    rnd, n, c0, c1, rps = int(m[1]), m[2], int(m[3]), int(m[4]), float(m[5])
    errors[n] += int(m[6]) + int(m[7])
    cpu = (c1 - c0) / hz * 1e6 / (rps * dur) if rps else float("nan")
    rows.setdefault(rnd, {})[n] = (rps, cpu)
print("round " + " ".join("%22s" % n for n in names) + "   (req/s, CPU us/req)")
for rnd in sorted(rows):
    print("%5d " % rnd + " ".join("%22s" % ("%8.0f %6.1f" % rows[rnd][n] if n in rows[rnd] else "-") for n in names))
for n in names[1:]:
    pairs = [(r[n][0] / r["bare"][0], r[n][1] / r["bare"][1]) for r in rows.values() if n in r and "bare" in r and r["bare"][0]]
    if not pairs:
        continue
    t = sorted(p[0] for p in pairs)
    c = sorted(p[1] for p in pairs)
    print("%s/bare over %d rounds: throughput median %.3f (middle half %.2f-%.2f), CPU per request median %.3f, errors+non2xx=%d"
          % (n, len(pairs), statistics.median(t), t[len(t) // 4], t[(3 * len(t)) // 4], statistics.median(c), errors[n]))
PY
