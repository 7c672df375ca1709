#!/usr/bin/env bash
# Held streams (issue 53): what open, slow SSE streams cost a proxy — resident memory per open
# stream, CPU per relayed event, time to first event at simultaneous starts, and the delay added
# between events at p99 — for tollgate and a bare Pingora proxy, against direct, in one run.
#
#   bash benches/streams/run.sh              (from the repository root)
#
# STREAMS_N (2000) streams per round, STREAMS_ROUNDS (3) alternating rounds (medians reported),
# STREAMS_DELTAS (30) events per stream STREAMS_INTERVAL_MS (100) apart, STREAMS_BATCH (1000)
# starts at once, STREAMS_BUSY=K adds K busy loops (CPU contention), STREAMS_SOURCES (1) source
# addresses (127.0.0.x: past ~28,000 streams one is not enough ports), STREAMS_TARGETS which
# of "direct bare tollgate" to run (in that order, reversed every other round; `guarded` is
# tollgate with its key's answers read as they stream by the guardrails of the kinds in
# STREAMS_GUARD_KINDS, default "secrets pii", each KIND or KIND=R1+R2 for only those
# recognisers; issue 65; `other` is tollgate built as STREAMS_OTHER_BIN), STREAMS_PREBUILT
# a directory with the four binaries (no build: the device machine), TOLLGATE_BIN another build
# of tollgate (default: target/release/tollgate, built here). The generator is
# `benches/streams` (its own crate, built once into ~/.cache/tollgate-streams-target); the
# upstream is tollgate-mock trickling events. STREAMS_CONCURRENCY=C runs the streams C at a
# time instead (each starting when one ends; time to first event over every stream), and
# STREAMS_STALL_MS (twice the interval) is the gap past which a stream counts as stalled.
# `translated` is tollgate with a messages client of the chat-completions mock (each event
# read as chat completions and written as the messages protocol), `messages` the same client of
# the mock as a messages provider (relayed natively): STREAMS_TARGETS="messages translated"
# gives a translated stream's CPU per event against its native relay's (issue 71).
set -euo pipefail
N=${STREAMS_N:-2000}
ROUNDS=${STREAMS_ROUNDS:-3}
DELTAS=${STREAMS_DELTAS:-30}
INTERVAL=${STREAMS_INTERVAL_MS:-100}
BATCH=${STREAMS_BATCH:-1000}
BUSY=${STREAMS_BUSY:-0}
SOURCES=${STREAMS_SOURCES:-1}
read -r -a TARGETS <<<"${STREAMS_TARGETS:-direct bare tollgate}"
if [ -n "${STREAMS_PREBUILT:-}" ]; then
  # A machine without the toolchain (the device): tollgate, tollgate-mock, bare-pingora and
  # streams-client built here and carried in one directory.
  bare="$STREAMS_PREBUILT/bare-pingora"; client="$STREAMS_PREBUILT/streams-client"
  mock="$STREAMS_PREBUILT/tollgate-mock"; tollgate="$STREAMS_PREBUILT/tollgate"
  port() { python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])'; }
else
  here=benches/relay
  # shellcheck source=../relay/prepare.sh
  . "$here/prepare.sh"
  cargo build --release --bin tollgate-mock >/dev/null 2>&1 || { echo "release build failed"; exit 1; }
  client=$(bench_tool streams streams-client) || exit 1
  mock=target/release/tollgate-mock
  tollgate=${TOLLGATE_BIN:-target/release/tollgate}
fi
ulimit -n 1048576 2>/dev/null || ulimit -n "$(ulimit -Hn)"
# A stream takes a descriptor in the generator and two in the proxy.
if [ "$(ulimit -n)" != unlimited ] && [ "$(ulimit -n)" -lt $((2 * N + 1000)) ]; then
  echo "open files limited to $(ulimit -n): $N streams need $((2 * N + 1000)) in the proxy; lower STREAMS_N or raise the limit"; exit 1
fi
work=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$work"; }
trap cleanup EXIT
wait_port() { for _ in $(seq 400); do (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0; sleep 0.05; done; echo "port $1 never opened"; exit 1; }

mock_port=$(port)
# The mock takes tollgate's upstream key and, for direct and bare Pingora (which pass the
# client's on), the client's.
KEY=sk-bench-streams-0000000000000000000001
"$mock" --listen "127.0.0.1:$mock_port" --key "mock-upstream-key,$KEY" >/dev/null 2>&1 &
pids+=($!)
wait_port "$mock_port"
for _ in $(seq "$BUSY"); do sh -c 'while :; do :; done' & pids+=($!); done

start_target() { # name → sets tpid and tport
  tport=$(port)
  case "$1" in
    direct) tpid=""; tport=$mock_port ;;
    bare) "$bare" "127.0.0.1:$tport" "127.0.0.1:$mock_port" 2 >/dev/null 2>&1 & tpid=$!; pids+=("$tpid"); wait_port "$tport" ;;
    tollgate | guarded | other | translated | messages)
      d="$work/tg-$RANDOM"; mkdir -p "$d"
      guards=""; names=""
      if [ "$1" = guarded ]; then
        for spec in ${STREAMS_GUARD_KINDS:-secrets pii}; do
          # KIND, or KIND=R1+R2: only those recognisers switched on.
          kind=${spec%%=*}; recs=""
          [ "$spec" != "$kind" ] && recs=", recognisers: [${spec#*=}]" && recs=${recs//+/, }
          guards="$guards${guards:+, }{ name: $kind, kind: $kind, phase: output$recs }"; names="$names${names:+, }$kind"
        done
        guards="guardrails: [$guards]"
      fi
      # translated and messages: a key of a translating group (a messages client of either provider).
      upstream=openai; groups=""; group=""
      case "$1" in translated | messages)
        groups="groups: { default: { platforms: [openai, anthropic], translate: true } }"; group=" group: default," ;;
      esac
      if [ "$1" = messages ]; then upstream=anthropic; fi
      cat >"$d/t.yaml" <<EOF
pingora: { threads: 2, pid_file: $d/pid, upgrade_sock: $d/sock }
listen: 127.0.0.1:$tport
data_dir: $d/data
providers:
  - { name: mock, protocol: $upstream, base_url: "http://127.0.0.1:$mock_port", api_key: mock-upstream-key, models: [alpha-5.5] }
$groups
prices:
  alpha-5.5: { input: 1.25, output: 10.0 }
forward_headers: ["x-mock-*"]
limits: { max_connections: 1000000, max_connections_per_ip: 1000000 }
keys:
  - { key: $KEY, name: bench,$group balance: 1000000.0$( [ -n "$guards" ] && echo ", guardrails: [$names]" ) }
$guards
EOF
      bin=$tollgate; [ "$1" = other ] && bin=${STREAMS_OTHER_BIN:?STREAMS_OTHER_BIN names the other build}
      RUST_LOG=error "$bin" -c "$d/t.yaml" >/dev/null 2>&1 & tpid=$!; pids+=("$tpid"); wait_port "$tport" ;;
  esac
}

results="$work/results.jsonl"
for r in $(seq "$ROUNDS"); do
  order=("${TARGETS[@]}")
  if [ $((r % 2)) -eq 0 ]; then order=(); for ((k = ${#TARGETS[@]} - 1; k >= 0; k--)); do order+=("${TARGETS[k]}"); done; fi
  for t in "${order[@]}"; do
    start_target "$t"
    sleep 0.5
    pidarg=(); [ -n "$tpid" ] && pidarg=(--pid "$tpid")
    mode=(--batch "$BATCH"); [ -n "${STREAMS_CONCURRENCY:-}" ] && mode=(--concurrency "$STREAMS_CONCURRENCY")
    # translated and messages: a messages client (the same body, read as a messages request)
    # of a chat-completions provider and of a messages one (issue 71's per-event ratio).
    path=/v1/chat/completions; case "$t" in translated | messages) path=/v1/messages ;; esac
    line=$("$client" "127.0.0.1:$tport" "$N" "${pidarg[@]}" --path "$path" --key "$KEY" --deltas "$DELTAS" --interval-ms "$INTERVAL" "${mode[@]}" --sources "$SOURCES" --stall-ms "${STREAMS_STALL_MS:-$((2 * INTERVAL))}")
    echo "{\"target\":\"$t\",\"round\":$r,\"result\":$line}" >>"$results"
    [ -n "${OUT:-}" ] && cp "$results" "$OUT/streams.jsonl"
    [ -n "$tpid" ] && { kill -9 "$tpid"; wait "$tpid" 2>/dev/null || true; }
  done
done

python3 - "$results" "$N" "$DELTAS" "$INTERVAL" "$BUSY" <<'PY'
import json, statistics, sys
path, n, deltas, interval, busy = sys.argv[1:]
rows = [json.loads(l) for l in open(path)]
med = lambda t, f: statistics.median(f(r["result"]) for r in rows if r["target"] == t)
print(f"held streams: {n} per round, {deltas} events {interval} ms apart, {busy} busy loops; medians of {max(r['round'] for r in rows)} alternating rounds")
late = [r for r in rows if r["result"].get("ended_before_sample")]
if late:
    print(f"WARNING: {len(late)} run(s) read memory after some streams ended (the ramp outlasted them): their KiB/stream is too low; lengthen STREAMS_DELTAS x STREAMS_INTERVAL_MS")
print(f"{'target':10} {'KiB/stream':>10} {'CPU µs/event':>12} {'TTFT p50 ms':>11} {'TTFT p99 ms':>11} {'gap p99 ms':>10} {'added gap p99':>13} {'done':>7} {'stalled':>7}")
targets = list(dict.fromkeys(r["target"] for r in rows))
direct_gap = med("direct", lambda r: r["gap_ms"]["p99"]) if "direct" in targets else float("nan")
for t in targets:
    kib = med(t, lambda r: r.get("kib_per_stream", float("nan"))) if t != "direct" else float("nan")
    cpu = med(t, lambda r: r.get("cpu_us_per_event", float("nan"))) if t != "direct" else float("nan")
    gap = med(t, lambda r: r["gap_ms"]["p99"])
    done = med(t, lambda r: r["completed"])
    print(f"{t:10} {kib:10.1f} {cpu:12.2f} {med(t, lambda r: r['ttft_ms']['p50']):11.3f} {med(t, lambda r: r['ttft_ms']['p99']):11.3f} {gap:10.3f} {gap - direct_gap:13.3f} {done:7.0f} {med(t, lambda r: r['stalled']):7.0f}")
print(json.dumps(rows))
PY
