#!/usr/bin/env bash
# Per-core cost against nginx (issue 53): what one small relayed request costs nginx (a plain
# reverse proxy, 2 workers), a bare Pingora proxy (2 threads) and tollgate (2 threads) in the
# same run — CPU time (perf's task-clock, user and kernel, all threads and workers), context
# switches and system calls per request, by call — while wrk (2 threads, c=64) posts the small
# chat completion of run.sh for PERF_SECONDS (default 8) per target, PERF_ROUNDS (default 3)
# alternating rounds, medians printed. The instructions in user space are
# instructions.sh's (callgrind); this shows the kernel's share, which callgrind does not count.
# PERF_OTHER_BIN adds another tollgate build as target "other"; PERF_OTHER_PINGORA, JSON
# members merged into that target's `pingora:` section (e.g. '{"work_stealing": false}'): with
# PERF_OTHER_BIN=target/release/tollgate, a framework lever against the same build without it.
# PERF_OTHER_EXTRA and PERF_OTHER_GROUP: more top-level members and more members of its key's
# group for "other", as instructions.sh takes them (the response cache's misses, issue 70:
# TOLLGATE_WRK_BODY=unique PERF_OTHER_BIN=target/release/tollgate PERF_OTHER_EXTRA='"cache": {},'
# PERF_OTHER_GROUP=', "cache": {"ttl": 3600}'). PERF_PROVIDER (gateway-config.sh) picks every
# tollgate target's provider, PERF_OTHER_PROVIDER the other's alone; TOLLGATE_WRK_BODY=messages
# posts the small messages request to /v1/messages (issue 71, Bedrock's signing against a
# native messages provider: PERF_PROVIDER=anthropic PERF_OTHER_PROVIDER=bedrock
# PERF_OTHER_BIN=target/release/tollgate TOLLGATE_WRK_BODY=messages).
# Usage, from the repository root: bash benches/relay/percore.sh
set -u
here="$(cd "$(dirname "$0")" && pwd)"
dur="${PERF_SECONDS:-8}"
rounds="${PERF_ROUNDS:-3}"
. "$here/prepare.sh"
command -v perf >/dev/null || { apt-get update -qq && apt-get install -y linux-perf; } >/dev/null 2>&1
dir="$(mktemp -d -t tollgate-percore.XXXX)"
UP=$(port); PX=$(port); BP=$(port); GW=$(port)
for t in upstream proxy; do sed -e "s#__DIR__#$dir#g" -e "s#__UP__#$UP#g" -e "s#__PX__#$PX#g" "$here/$t.conf.tmpl" > "$dir/$t.conf"; done
pids=""
nginx -p "$dir" -c "$dir/upstream.conf" -g 'daemon off;' & pids="$pids $!"
nginx -p "$dir" -c "$dir/proxy.conf" -g 'daemon off;' & ngx=$!; pids="$pids $ngx"
"$bare" "127.0.0.1:$BP" "127.0.0.1:$UP" 2 >"$dir/bare.log" 2>&1 & bp=$!; pids="$pids $bp"
. "$here/../gateway-config.sh"
tollgate_at() { # name port binary pingora-members [extra group-extra]
  write_gateway_config "$dir/$1.yaml" "$dir" "$1" "$2" "$(port)" "$UP" "${5:-}" "${6:-}"
  python3 - "$dir/$1.yaml" "$4" <<'PY'
import json, sys
c = json.load(open(sys.argv[1])); c["pingora"].update(json.loads(sys.argv[2])); json.dump(c, open(sys.argv[1], "w"))
PY
  RUST_LOG=warn "$3" -c "$dir/$1.yaml" >"$dir/$1.log" 2>&1 &
}
tollgate_at tollgate "$GW" "$PWD/target/release/tollgate" '{}'; tp=$!; pids="$pids $tp"
targets="nginx:$PX:$ngx bare:$BP:$bp tollgate:$GW:$tp"
if [ -n "${PERF_OTHER_BIN:-}" ]; then
  GO=$(port); PERF_PROVIDER="${PERF_OTHER_PROVIDER:-${PERF_PROVIDER:-}}" tollgate_at other "$GO" "$PERF_OTHER_BIN" "${PERF_OTHER_PINGORA:-{\}}" "${PERF_OTHER_EXTRA:-}" "${PERF_OTHER_GROUP:-}"; op=$!; pids="$pids $op"; targets="$targets other:$GO:$op"
fi
# nginx stops at TERM; the Pingora proxies are killed (a graceful stop waits out its grace period).
cleanup() { kill $pids 2>/dev/null; kill -9 $bp $tp ${op:-} 2>/dev/null; wait 2>/dev/null; rm -rf "$dir"; }
trap cleanup EXIT
for t in $targets; do p=$(echo "$t" | cut -d: -f2); for _ in $(seq 1 200); do curl -s -o /dev/null "http://127.0.0.1:$p/" && break; sleep 0.2; done; done
calls="read write readv writev recvfrom sendto recvmsg sendmsg epoll_wait epoll_pwait epoll_ctl futex sched_yield accept4 close clock_gettime setsockopt getsockopt"
# CPU and switches are counted with software counters alone: the system-call tracepoints cost
# every call something, which would charge the proxy that makes more calls. The calls are
# counted in a load of their own, in the first round.
cheap="task-clock,context-switches"
traced="raw_syscalls:sys_enter"
for c in $calls; do traced="$traced,syscalls:sys_enter_$c"; done
path=/v1/chat/completions
[ "${TOLLGATE_WRK_BODY:-}" = messages ] && path=/v1/messages
: >"$dir/rows"
counted() { # port family events → "rps secs event=value ..." over the load's middle
  wrk -t2 -c64 -d"${dur}s" -s "$here/post.lua" "http://127.0.0.1:$1$path" >"$dir/wrk" 2>&1 &
  local w=$!
  sleep 1
  perf stat -x, -e "$3" -p "$2" -o "$dir/stat" -- sleep $((dur - 2)) >/dev/null 2>&1
  wait "$w"
  echo "$(sed -nE 's/.*RESULT rps=([0-9.]+).*/\1/p' "$dir/wrk") $((dur - 2)) $(awk -F, '/^[0-9]/ {printf "%s=%s ", $3, $1}' "$dir/stat")"
}
for t in $targets; do wrk -t1 -c8 -d2s -s "$here/post.lua" "http://127.0.0.1:$(echo "$t" | cut -d: -f2)$path" >/dev/null 2>&1; done
for round in $(seq "$rounds"); do
  order="$targets"; [ $((round % 2)) -eq 0 ] && order=$(echo "$targets" | tr ' ' '\n' | tac | tr '\n' ' ')
  for t in $order; do
    IFS=: read -r n p pid <<<"$t"
    family=$(echo "$pid" $(pgrep -P "$pid") | tr ' ' ',')
    echo "cpu $n $round $(counted "$p" "$family" "$cheap")" >>"$dir/rows"
    [ "$round" = 1 ] && echo "calls $n $round $(counted "$p" "$family" "$traced")" >>"$dir/rows"
  done
done
python3 - "$dir/rows" "$calls" <<'PY'
import statistics, sys
lines, calls = open(sys.argv[1]).read().split("\n"), sys.argv[2].split()
cpu, sys_calls = {}, {}
for line in lines:
    if not line.strip():
        continue
    kind, name, _round, rps, secs, *fields = line.split()
    n = float(rps) * float(secs)
    got = dict(f.split("=", 1) for f in fields)
    val = lambda k: float(got.get(k, "0").replace("<not counted>", "0") or 0) / n
    if kind == "cpu":
        cpu.setdefault(name, []).append({"rps": float(rps), "cpu_us": val("task-clock") * 1e3, "switches": val("context-switches")})
    else:
        sys_calls[name] = {"all": val("raw_syscalls:sys_enter"), **{c: val("syscalls:sys_enter_" + c) for c in calls}}
med = {t: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for t, rs in cpu.items()}
print(f"medians of {max(len(v) for v in cpu.values())} rounds, wrk -t2 -c64, small chat completion; system calls from round 1")
print(f"{'target':9} {'rps':>9} {'CPU µs/req':>10} {'× nginx':>8} {'switches':>9} {'syscalls':>9}  per request by call")
for t, m in med.items():
    ratio = m["cpu_us"] / med["nginx"]["cpu_us"] if "nginx" in med else float("nan")
    c = sys_calls.get(t, {})
    by = " ".join(f"{k}={c[k]:.2f}" for k in calls if c.get(k, 0) >= 0.01)
    print(f"{t:9} {m['rps']:9.0f} {m['cpu_us']:10.1f} {ratio:8.2f} {m['switches']:9.2f} {c.get('all', float('nan')):9.2f}  {by}")
print("rounds: " + "; ".join(f"{t} " + " ".join(f"{r['cpu_us']:.1f}" for r in rs) for t, rs in cpu.items()))
PY
