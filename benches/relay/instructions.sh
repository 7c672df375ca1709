#!/usr/bin/env bash
# User-space instructions per relayed request, counted by callgrind (issue 25): the measure that
# holds still on a shared machine where time and throughput move by 10 % between runs (the
# same binary measures within ~2 % of itself). Kernel work (system calls, wake-ups) is not
# counted: `run.sh`'s CPU and context-switch columns show it.
#
# Each target runs alone under valgrind behind the nginx upstream of run.sh; wrk (1 thread,
# c=8) warms it for 3 s, then the instructions of the next 4 s are divided by the requests wrk
# counted. Small bodies by default; TOLLGATE_WRK_BODY=large for the 256 KiB one, 4k or 64k for
# a prompt of that much prose,
# TOLLGATE_WRK_BODY=messages for a small messages request translated to chat completions, gemini
# or responses for it in those protocols (a pair: PERF_PROVIDER=gemini TOLLGATE_WRK_BODY=messages
# is messages → generate-content; PERF_OTHER_PROVIDER the same client's native provider).
#   nginx     nginx as a plain reverse proxy (run.sh's proxy.conf.tmpl), one process
#   bare      the bare Pingora proxy of run.sh
#   tollgate  HEAD's release build
#   other     PERF_OTHER_BIN, when set (a change against HEAD), with PERF_OTHER_EXTRA as more
#             top-level config members, each followed by a comma (e.g. a `telemetry` section),
#             and PERF_OTHER_GROUP as more members of its key's group, each preceded by a comma,
#             and PERF_OTHER_PROVIDER as its provider (PERF_PROVIDER's kinds: a Bedrock provider
#             against a native messages one in one run, issue 71)
#             (guardrails on, issue 65: PERF_OTHER_BIN=target/release/tollgate
#             PERF_OTHER_EXTRA='"guardrails": [{"name": "s", "kind": "secrets"}, {"name": "p", "kind": "pii"}],'
#             PERF_OTHER_GROUP=', "guardrails": ["s", "p"]' TOLLGATE_WRK_BODY=4k)
# PERF_EXTRA and PERF_KEY: more top-level members and more members of the key (each preceded by
# a comma) for the tollgate target; PERF_OTHER_KEY the same for other (issue 66: a key with two
# rolling windows and an account against a key with a calendar day window:
# PERF_KEY=', "budgets": {"day": 1000000}' PERF_OTHER_BIN=target/release/tollgate
# PERF_OTHER_EXTRA='"accounts": [{"name": "team", "balance": 1000000000}],'
# PERF_OTHER_KEY=', "budgets": {"5h": 100000, "7d": 1000000}, "account": "team"').
# PERF_SETTLE, when set, is a command run after the warm-up and again after the counted load
# (before counting stops), for every target alike: it returns once the work the requests left
# behind is done (a fleet node books its journal a sync round later; see benches/fleet), so the
# count holds exactly the counted requests' work.
# TOLLGATE_CG_THREADS=1 counts each thread apart and prints, beside the total, what the
# commit writer's thread (the one whose profile holds `store::commit::apply`: the ledger's
# group commit, off the request path) did per request, and the rest ("path"): the writer's
# share per request depends on how many bookings share a commit window, so on the
# throughput valgrind allows in that run, while the rest does not.
# TOLLGATE_CG_KEEP=DIR keeps the callgrind outputs (cg.bare.1, cg.tollgate.1, ...) for
# callgrind_annotate.
# Usage, from the repository root: bash benches/relay/instructions.sh
set -u
here="$(cd "$(dirname "$0")" && pwd)"
. "$here/prepare.sh" valgrind
dir="$(mktemp -d -t tollgate-instructions.XXXX)"
UP=$(port)
sed -e "s#__DIR__#$dir#g" -e "s#__UP__#$UP#g" "$here/upstream.conf.tmpl" > "$dir/upstream.conf"
nginx -p "$dir" -c "$dir/upstream.conf" -g 'daemon off;' & upstream=$!
cleanup() { kill "$upstream" 2>/dev/null; wait 2>/dev/null; [ -n "${TOLLGATE_CG_KEEP:-}" ] && mkdir -p "$TOLLGATE_CG_KEEP" && cp "$dir"/cg.* "$TOLLGATE_CG_KEEP"/ 2>/dev/null; rm -rf "$dir"; }
trap cleanup EXIT
. "$here/../gateway-config.sh"
# TOLLGATE_WRK_BODY=messages posts a messages request to /v1/messages (translated; the bare
# proxy passes it to nginx, which answers any path alike).
# gemini and responses post that request in those protocols to their own paths (issue 71:
# each translated pair against its native relay, PERF_PROVIDER naming the provider's protocol).
case "${TOLLGATE_WRK_BODY:-}" in
  messages) path=/v1/messages ;;
  gemini) path=/v1beta/models/alpha-5.5:generateContent ;;
  responses) path=/v1/responses ;;
  *) path=/v1/chat/completions ;;
esac
load() { wrk -t1 -c8 -d"$1s" -s "$here/post.lua" "http://127.0.0.1:$2$path" 2>/dev/null; }
measure() { # name port command...
  local name=$1 p=$2; shift 2
  local threads=no; [ -n "${TOLLGATE_CG_THREADS:-}" ] && threads=yes
  valgrind --tool=callgrind --instr-atstart=no --separate-threads=$threads --callgrind-out-file="$dir/cg.$name" "$@" >"$dir/$name.log" 2>&1 &
  local vg=$!
  for _ in $(seq 1 150); do curl -s -o /dev/null "http://127.0.0.1:$p/" && break; sleep 0.2; done
  load 3 "$p" >/dev/null
  eval "${PERF_SETTLE:-true}"
  callgrind_control -i on "$vg" >/dev/null 2>&1
  local r; r=$(load 4 "$p" | grep RESULT)
  eval "${PERF_SETTLE:-true}"
  callgrind_control -i off "$vg" >/dev/null 2>&1
  callgrind_control -d "$vg" >/dev/null 2>&1
  # Counted and dumped: killed at once (a Pingora graceful stop waits out its grace period).
  kill -9 "$vg"; wait "$vg" 2>/dev/null
  local total=0 writer=0 f t
  for f in "$dir/cg.$name.1" "$dir/cg.$name.1"-*; do
    [ -f "$f" ] || continue
    t=$(callgrind_annotate "$f" 2>/dev/null | awk '/PROGRAM TOTALS/ {gsub(",", "", $1); print $1; exit}')
    t=${t//[^0-9]/}  # a thread that ran nothing counted reads "."
    total=$((total + ${t:-0}))
    if [ "$threads" = yes ] && callgrind_annotate "$f" 2>/dev/null | grep -q 'store::commit::apply'; then writer=$((writer + ${t:-0})); fi
  done
  python3 - "$name" "$r" "$total" "$writer" "$threads" <<'PY'
import re, sys
name, result, total, writer, threads = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
m = re.search(r"rps=([0-9.]+)", result)
requests = float(m.group(1)) * 4 if m else 0
per = lambda n: n / requests / 1000 if requests else float("nan")
line = "%-9s requests=%6d  K instructions/request=%.1f" % (name, requests, per(total))
if threads == "yes":
    line += "  (commit writer %.1f, path %.1f)" % (per(writer), per(total - writer))
print(line)
PY
}
# nginx as the same plain reverse proxy (run.sh's proxy.conf), one process without a master:
# the per-core reference of issue 53.
NP=$(port)
sed -e "s#__DIR__#$dir#g" -e "s#__UP__#$UP#g" -e "s#__PX__#$NP#g" "$here/proxy.conf.tmpl" > "$dir/proxy.conf"
# PERF_NO_BASELINES=1 leaves out nginx and bare Pingora (tollgate against other only).
if [ -z "${PERF_NO_BASELINES:-}" ]; then
  measure nginx "$NP" nginx -p "$dir" -c "$dir/proxy.conf" -g 'daemon off; master_process off;'
  BP=$(port); measure bare "$BP" "$bare" "127.0.0.1:$BP" "127.0.0.1:$UP" 2
fi
GW=$(port); write_gateway_config "$dir/tollgate.yaml" "$dir" tollgate "$GW" "$(port)" "$UP" "${PERF_EXTRA:-}" "" "${PERF_KEY:-}"
RUST_LOG=warn measure tollgate "$GW" "$PWD/target/release/tollgate" -c "$dir/tollgate.yaml"
if [ -n "${PERF_OTHER_BIN:-}" ]; then
  GO=$(port); PERF_PROVIDER="${PERF_OTHER_PROVIDER:-${PERF_PROVIDER:-}}" write_gateway_config "$dir/other.yaml" "$dir" other "$GO" "$(port)" "$UP" "${PERF_OTHER_EXTRA:-}" "${PERF_OTHER_GROUP:-}" "${PERF_OTHER_KEY:-}"
  RUST_LOG=warn measure other "$GO" "$PERF_OTHER_BIN" -c "$dir/other.yaml"
fi
