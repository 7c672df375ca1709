#!/usr/bin/env bash
# The public board's method (onthebench.ai, `GetBusbar/benchmarking`; issue 71), reproduced:
# direct-to-mock, a bare Pingora proxy and tollgate in one run, and the peers that install from
# the package registries when asked for (BOARD_PEERS="portkey litellm").
#
#   bash benches/board/run.sh                 (from the repository root)
#
# The board's columns, each from the same mock (`benches/board`, built once into
# ~/.cache/tollgate-board-target) and the same generators (wrk for whole answers, streams-client
# for streams):
#   * added p99 at c=1: p99 of a small chat completion from a zero-delay mock, minus direct's
#     (BOARD_C1_ROUNDS rounds of BOARD_C1_SECS, targets taking turns, medians);
#   * sustained: the most requests/s with p99 < 1 s from a mock that answers after 20 ms, over
#     the ladder BOARD_LADDER (connections);
#   * maximum: the most requests/s from the zero-delay mock over the same ladder, the proxy's CPU
#     per request at that rung, and the newer frontier — the most requests/s at p99 below 1, 5,
#     10, 50 and 100 ms with no failed request;
#   * streams: the most concurrent streams (BOARD_STREAM_LADDER) that are all stall-free — every
#     one ends with [DONE], no gap between events over BOARD_STALL_MS (40: twice the pace) —
#     against a mock pacing 64 content deltas 20 ms apart; the ladder stops at the first rung
#     that fails. And time to first event: over BOARD_TTFE_STREAMS streams at concurrency 1 and
#     at BOARD_TTFE_CONCURRENCY (8), p50 and p99, against direct and bare Pingora.
# Every rung lasts BOARD_SECS (5). BOARD_TARGETS picks targets (default: direct bare tollgate and
# the peers). BOARD_PIN=1 (a machine of 16 cores or more: the device) gives the board's split —
# gateway on 4 cores, mock on 6, load on 6; otherwise everything shares the machine, as the
# figures in docs/performance.md say. TOLLGATE_BIN another tollgate build; BOARD_OTHER_BIN adds a
# second one as target `other` (a change against the build before it, in one run); BOARD_PREBUILT a
# directory with tollgate, bare-pingora, board-mock and streams-client (no build: the device).
# Results: a table, and every rung as JSON lines in target/bench/board.jsonl (and $OUT).
set -euo pipefail
SECS=${BOARD_SECS:-5}
LADDER=${BOARD_LADDER:-16 32 64 128 256 512 1024}
STREAM_LADDER=${BOARD_STREAM_LADDER:-16 32 64 128 256 512 1024 2048}
STALL_MS=${BOARD_STALL_MS:-40}
C1_ROUNDS=${BOARD_C1_ROUNDS:-3}
C1_SECS=${BOARD_C1_SECS:-5}
TTFE_N=${BOARD_TTFE_STREAMS:-120}
TTFE_C=${BOARD_TTFE_CONCURRENCY:-8}
PEERS=${BOARD_PEERS:-}
KEY=sk-bench-board-00000000000000000000001
cache="${XDG_CACHE_HOME:-$HOME/.cache}"
if [ -n "${BOARD_PREBUILT:-}" ]; then
  bare="$BOARD_PREBUILT/bare-pingora"; mock="$BOARD_PREBUILT/board-mock"
  client="$BOARD_PREBUILT/streams-client"; tollgate="$BOARD_PREBUILT/tollgate"
  port() { python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])'; }
else
  here=benches/relay
  # shellcheck source=../relay/prepare.sh
  . "$here/prepare.sh"
  mock=$(bench_tool board board-mock) || exit 1
  client=$(bench_tool streams streams-client) || exit 1
  tollgate=${TOLLGATE_BIN:-target/release/tollgate}
fi
ulimit -n 1048576 2>/dev/null || ulimit -n "$(ulimit -Hn)"

# The board's split on a big machine; shared cores otherwise.
gw_threads=2; load_threads=2; pin_gw=(); pin_mock=(); pin_load=()
if [ "${BOARD_PIN:-0}" = 1 ]; then
  [ "$(nproc)" -ge 16 ] || { echo "BOARD_PIN=1 needs 16 cores ($(nproc) here)"; exit 1; }
  gw_threads=4; load_threads=6
  pin_gw=(taskset -c 0-3); pin_mock=(taskset -c 4-9); pin_load=(taskset -c 10-15)
fi

# Peers, installed on first use into the cache (npm and PyPI only).
peers_dir="$cache/tollgate-board-peers"
targets=(direct bare tollgate)
[ -n "${BOARD_OTHER_BIN:-}" ] && targets+=(other)
for p in $PEERS; do
  case "$p" in
    portkey)
      [ -f "$peers_dir/portkey/node_modules/@portkey-ai/gateway/build/start-server.js" ] ||
        npm install --silent --prefix "$peers_dir/portkey" @portkey-ai/gateway@1.15.2 >/dev/null 2>&1 ||
        { echo "portkey: npm install failed; left out"; continue; }
      targets+=(portkey) ;;
    litellm)
      [ -x "$peers_dir/litellm/bin/litellm" ] || { python3 -m venv "$peers_dir/litellm" &&
        "$peers_dir/litellm/bin/pip" install -q 'litellm[proxy]' >/dev/null 2>&1; } ||
        { echo "litellm: pip install failed; left out"; continue; }
      targets+=(litellm) ;;
    *) echo "unknown peer $p (portkey, litellm)"; exit 2 ;;
  esac
done
[ -n "${BOARD_TARGETS:-}" ] && read -r -a targets <<<"$BOARD_TARGETS"

work=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill -- "-$p" 2>/dev/null || true; kill "$p" 2>/dev/null || true; done; rm -rf "$work"; }
trap cleanup EXIT
wait_port() { for _ in $(seq 600); do (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0; sleep 0.05; done; echo "port $1 never opened"; exit 1; }
results=target/bench/board.jsonl
mkdir -p target/bench; : >"$results"
emit() { echo "$1" >>"$results"; [ -n "${OUT:-}" ] && cp "$results" "$OUT/board.jsonl"; true; }

mock_pid=""; mock_port=""
start_mock() { # mock arguments
  [ -n "$mock_pid" ] && { kill "$mock_pid"; wait "$mock_pid" 2>/dev/null || true; }
  mock_port=$(port)
  "${pin_mock[@]}" "$mock" "127.0.0.1:$mock_port" "$@" >/dev/null 2>&1 & mock_pid=$!; pids+=("$mock_pid")
  wait_port "$mock_port"
}

# start_target NAME → tpid (empty for direct), tport, theaders (a peer's routing headers, as
# wrk's script takes them) and hdr (the same as streams-client's arguments).
start_target() {
  tport=$(port); tpid=""; theaders=""; hdr=()
  case "$1" in
    direct) tport=$mock_port ;;
    bare) "${pin_gw[@]}" "$bare" "127.0.0.1:$tport" "127.0.0.1:$mock_port" "$gw_threads" >/dev/null 2>&1 & tpid=$! ;;
    tollgate | other)
      d="$work/tg-$RANDOM"; mkdir -p "$d"
      cat >"$d/t.yaml" <<EOF
pingora: { threads: $gw_threads, pid_file: $d/pid, upgrade_sock: $d/sock }
listen: 127.0.0.1:$tport
data_dir: $d/data
providers:
  - { name: mock, protocol: openai, base_url: "http://127.0.0.1:$mock_port", api_key: mock-upstream-key, models: [alpha-5.5] }
prices:
  alpha-5.5: { input: 1.25, output: 10.0 }
limits: { max_connections: 1000000, max_connections_per_ip: 1000000 }
keys:
  - { key: $KEY, name: board, balance: 100000000.0 }
EOF
      bin=$tollgate; [ "$1" = other ] && bin=$BOARD_OTHER_BIN
      RUST_LOG=error "${pin_gw[@]}" "$bin" -c "$d/t.yaml" >/dev/null 2>&1 & tpid=$! ;;
    portkey)
      PORT=$tport setsid "${pin_gw[@]}" node "$peers_dir/portkey/node_modules/@portkey-ai/gateway/build/start-server.js" --port="$tport" --headless >/dev/null 2>&1 & tpid=$!
      theaders="x-portkey-provider: openai|x-portkey-custom-host: http://127.0.0.1:$mock_port/v1" ;;
    litellm)
      d="$work/ll-$RANDOM"; mkdir -p "$d"
      cat >"$d/c.yaml" <<EOF
model_list:
  - model_name: alpha-5.5
    litellm_params: { model: openai/alpha-5.5, api_base: "http://127.0.0.1:$mock_port/v1", api_key: mock-upstream-key }
EOF
      LITELLM_MASTER_KEY=$KEY setsid "${pin_gw[@]}" "$peers_dir/litellm/bin/litellm" --config "$d/c.yaml" --host 127.0.0.1 --port "$tport" --num_workers "$gw_threads" >/dev/null 2>&1 & tpid=$! ;;
  esac
  [ -n "$tpid" ] && { pids+=("$tpid"); wait_port "$tport"; }
  local hs h; IFS='|' read -r -a hs <<<"$theaders"; for h in "${hs[@]}"; do [ -n "$h" ] && hdr+=(--header "$h"); done
  # One request through, so every target starts its rungs warm (connections to the mock made).
  BOARD_HEADERS="$theaders" BOARD_AUTH=$KEY wrk -t1 -c1 -d1s -s benches/board/board.lua "http://127.0.0.1:$tport/v1/chat/completions" >/dev/null 2>&1 || true
}
# A peer runs in a session of its own (setsid): its workers (LiteLLM's processes) go with it.
stop_target() { [ -n "$tpid" ] && { kill -9 -- "-$tpid" 2>/dev/null || true; kill -9 "$tpid" 2>/dev/null || true; wait "$tpid" 2>/dev/null || true; }; true; }

# The process's CPU time so far, in clock ticks (its children's too: LiteLLM's workers).
ticks() {
  [ -n "$tpid" ] || { echo 0; return; }
  local all=0 p
  for p in $tpid $(pgrep -P "$tpid" 2>/dev/null); do
    all=$((all + $(awk '{print $14 + $15}' "/proc/$p/stat" 2>/dev/null || echo 0)))
  done
  echo "$all"
}

# One wrk rung: prints wrk's RESULT object with the proxy's CPU per request added.
rung() { # connections seconds
  local c=$1 s=$2 t before after out
  t=$((c < load_threads ? c : load_threads))
  before=$(ticks)
  out=$(BOARD_HEADERS="$theaders" BOARD_AUTH=$KEY "${pin_load[@]}" wrk -t"$t" -c"$c" -d"${s}s" --timeout 10s -s benches/board/board.lua "http://127.0.0.1:$tport/v1/chat/completions" 2>/dev/null | sed -n 's/^RESULT //p')
  after=$(ticks)
  [ -n "$out" ] || out='{"requests":0,"rps":0,"p50_us":0,"p99_us":0,"max_us":0,"errors":1,"non2xx":0}'
  echo "${out%\}},\"cpu_us_per_request\":$(python3 -c "import json,sys;r=json.loads(sys.argv[1]);print(round(($after-$before)*10000/max(r['requests'],1),1))" "$out")}"
}

echo "board: targets ${targets[*]}; rungs of ${SECS}s over connections $LADDER; streams $STREAM_LADDER (stall past ${STALL_MS} ms)"

# 1. Added p99 at c=1, zero-delay mock: rounds with the targets taking turns.
start_mock --delay-ms 0
for r in $(seq "$C1_ROUNDS"); do
  order=("${targets[@]}")
  if [ $((r % 2)) -eq 0 ]; then order=(); for ((k = ${#targets[@]} - 1; k >= 0; k--)); do order+=("${targets[k]}"); done; fi
  for t in "${order[@]}"; do
    start_target "$t"; emit "{\"phase\":\"c1\",\"target\":\"$t\",\"round\":$r,\"c\":1,\"result\":$(rung 1 "$C1_SECS")}"; stop_target
  done
done

# 2. The ladder against the zero-delay mock (maximum, frontier), 3. against the 20 ms mock.
for phase in max sustained; do
  if [ "$phase" = max ]; then start_mock --delay-ms 0; else start_mock --delay-ms 20; fi
  for t in "${targets[@]}"; do
    start_target "$t"
    for c in $LADDER; do emit "{\"phase\":\"$phase\",\"target\":\"$t\",\"c\":$c,\"result\":$(rung "$c" "$SECS")}"; done
    stop_target
  done
done

# 4. Streams: 64 deltas 20 ms apart; the ladder until a rung stalls, then time to first event.
start_mock --chunks 64 --interval-ms 20
for t in "${targets[@]}"; do
  start_target "$t"
  for c in $STREAM_LADDER; do
    line=$("${pin_load[@]}" "$client" "127.0.0.1:$tport" "$c" --key "$KEY" --deltas 64 --interval-ms 20 --concurrency "$c" --stall-ms "$STALL_MS" --sources 4 "${hdr[@]}")
    emit "{\"phase\":\"streams\",\"target\":\"$t\",\"c\":$c,\"result\":$line}"
    python3 -c "import json,sys;r=json.loads(sys.argv[1]);sys.exit(0 if r['stalled']==0 and r['failed']==0 else 1)" "$line" || break
  done
  stop_target
done
# Time to first event, on a mock of short streams (two deltas): at c=1 and at TTFE_C.
start_mock --chunks 2 --interval-ms 20
for t in "${targets[@]}"; do
  start_target "$t"
  for c in 1 "$TTFE_C"; do
    line=$("${pin_load[@]}" "$client" "127.0.0.1:$tport" "$TTFE_N" --key "$KEY" --deltas 2 --interval-ms 20 --concurrency "$c" --stall-ms "$STALL_MS" "${hdr[@]}")
    emit "{\"phase\":\"ttfe\",\"target\":\"$t\",\"c\":$c,\"result\":$line}"
  done
  stop_target
done

python3 benches/board/report.py "$results"
