#!/usr/bin/env bash
# One tollgate node on PostgreSQL against one on sled, same run, same nginx upstream, same external
# load generator (wrk): throughput at c=64 and added p99 at c=1 (over going direct), best of two
# rounds; then what the shared database carries: statements per relayed request (tollgate's own
# counter) and the server's transactions per second at the measured rate (pg_stat_database).
# A control row runs the sled node with the same database load beside it (see db_load). The
# upstream and the request are the relay bench's (benches/relay).
#
# Where the machine has 8 cores or more, nothing shares a core with what it measures: nginx on
# 0-1 (0-3 from 16), wrk on 2-3 (4-7), the node under test on 4-5 (8-11), PostgreSQL on 6-7
# (12-15); each node gets as many threads as its cores. Below 8 cores everything shares them.
#
# FLEET_BIN: the tollgate to measure (default: this checkout's release build, built first).
# FLEET_BEFORE_BIN: another build measured in the same rounds (a sled and a PostgreSQL node of
# its own, on a database of its own), e.g. the commit before a change.
# PGBIN / PGSHARE: PostgreSQL's bin and share directories (default: Debian's newest). nginx, wrk
# and PostgreSQL are installed when missing and none is named.
# Usage, from the repository root: bash benches/fleet/run.sh  (PERF_SECONDS=8 by default).
set -u
here="$(cd "$(dirname "$0")" && pwd)"
dur="${PERF_SECONDS:-8}"
command -v nginx >/dev/null && command -v wrk >/dev/null || { apt-get update -qq && apt-get install -y nginx wrk; } >/dev/null 2>&1
[ -n "${PGBIN:-}" ] || [ -d /usr/lib/postgresql ] || { apt-get update -qq && apt-get install -y postgresql; } >/dev/null 2>&1
pgbin="${PGBIN:-$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1)}"
if [ -z "${FLEET_BIN:-}" ]; then
  cargo build --release --bin tollgate >/dev/null 2>&1 || { echo "release build failed"; exit 1; }
fi
bin="${FLEET_BIN:-$PWD/target/release/tollgate}"
before="${FLEET_BEFORE_BIN:-}"
dir="$(mktemp -d -t tollgate-fleet-perf.XXXX)"; chmod 755 "$dir"
port() { python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])'; }
# Cores: the upstream, the load, the node under test, the database.
n=$(nproc)
if [ "$n" -ge 16 ]; then C_UP=0-3 C_LOAD=4-7 C_NODE=8-11 C_DB=12-15 threads=4
elif [ "$n" -ge 8 ]; then C_UP=0-1 C_LOAD=2-3 C_NODE=4-5 C_DB=6-7 threads=2
else C_UP="" threads=2; fi
pin() { # pin CORES CMD...: the command on those cores (exec'd: a background job's $! is its pid)
  local c=$1; shift
  if [ -z "$C_UP" ]; then exec "$@"
  elif command -v taskset >/dev/null; then exec taskset -c "$c" "$@"
  else exec python3 -c 'import os,sys; a,_,b=sys.argv[1].partition("-"); os.sched_setaffinity(0, range(int(a), int(b or a)+1)); os.execvp(sys.argv[2], sys.argv[2:])' "$c" "$@"; fi
}
[ -n "$C_UP" ] && echo "cores: upstream $C_UP, wrk $C_LOAD, node $C_NODE, PostgreSQL $C_DB; $threads threads a node"
# The server refuses to run as root: as the postgres user where there is one, else nobody.
as_pg() {
  if [ "$(id -u)" != 0 ]; then "$@"
  elif id postgres >/dev/null 2>&1; then runuser -u postgres -- "$@"
  else python3 -c 'import os,sys; os.setgid(65534); os.setuid(65534); os.execvp(sys.argv[1], sys.argv[1:])' "$@"; fi
}
UP=$(port); DB=$(port)
mkdir "$dir/pg"; [ "$(id -u)" = 0 ] && { id postgres >/dev/null 2>&1 && chown postgres:postgres "$dir/pg" || chown 65534:65534 "$dir/pg"; }
as_pg "$pgbin/initdb" -D "$dir/pg/data" -U postgres -A trust --no-sync -E UTF8 ${PGSHARE:+-L "$PGSHARE"} >"$dir/initdb.log" 2>&1 || { echo "initdb failed"; tail -5 "$dir/initdb.log"; exit 1; }
(pin "${C_DB:-0}" bash -c "$(declare -f as_pg); as_pg \"\$@\"" _ "$pgbin/postgres" -D "$dir/pg/data" -p "$DB" -k "$dir/pg" -c listen_addresses=127.0.0.1 -c max_connections=100 >"$dir/pg.log" 2>&1) &
for i in $(seq 1 100); do as_pg "$pgbin/pg_isready" -q -h 127.0.0.1 -p "$DB" && break; sleep 0.2; done
psql_() { as_pg "$pgbin/psql" -h 127.0.0.1 -p "$DB" -U postgres -qtA "$@"; }
psql_ -c "CREATE DATABASE tollgate" postgres && psql_ -c "CREATE DATABASE tollgate_before" postgres
sed -e "s#__DIR__#$dir#g" -e "s#__UP__#$UP#g" -e "s#worker_processes 1;#worker_processes $threads;#" "$here/../relay/upstream.conf.tmpl" > "$dir/upstream.conf"
(pin "${C_UP:-0}" nginx -p "$dir" -c "$dir/upstream.conf" -g 'daemon off;') & pu=$!
. "$here/../gateway-config.sh"
pids=""
node() { # name binary listen admin store
  write_gateway_config "$dir/$1.yaml" "$dir" "$1" "$3" "$4" "$UP" "$5"
  sed -i "s#\"threads\": 2#\"threads\": $threads#" "$dir/$1.yaml"
  (RUST_LOG=warn pin "${C_NODE:-0}" "$2" -c "$dir/$1.yaml" >"$dir/$1.log" 2>&1) & pids="$pids $!"
}
store() { echo "\"store\": {\"postgres\": {\"url\": \"postgres://postgres@127.0.0.1:$DB/$1\"}, \"node_id\": \"bench-1\"},"; }
declare -A PORT
targets="direct"; PORT[direct]=$UP
add() { # name binary database(or "")
  local p a; p=$(port); a=$(port); PORT[$1]=$p; PORT[$1.admin]=$a
  node "$1" "$2" "$p" "$a" "$([ -n "$3" ] && store "$3")"; targets="$targets $1"
}
add sled "$bin" ""; add postgres "$bin" tollgate
[ -n "$before" ] && { add sled-before "$before" ""; add postgres-before "$before" tollgate_before; }
cleanup() { kill $pids $pu 2>/dev/null; as_pg "$pgbin/pg_ctl" -D "$dir/pg/data" stop -m fast >/dev/null 2>&1; wait 2>/dev/null; rm -rf "$dir"; }
trap cleanup EXIT
ready() { python3 - "$1" <<'PY'
import socket, sys, time
for _ in range(300):
    try: socket.create_connection(("127.0.0.1", int(sys.argv[1])), 0.2).close(); sys.exit(0)
    except OSError: time.sleep(0.1)
sys.exit(1)
PY
}
for t in $targets; do ready "${PORT[$t]}" || { echo "$t did not open"; tail -5 "$dir/$t.log" "$dir/upstream.err" 2>/dev/null; exit 1; }; done
path=/v1/chat/completions
run() { # threads connections port: wrk's RESULT line; a run with failures is said
  local r; r=$( (pin "${C_LOAD:-0}" wrk -t"$1" -c"$2" -d"${dur}s" -s "$here/../relay/post.lua" "http://127.0.0.1:$3$path") 2>/dev/null | grep RESULT)
  echo "$r" | grep -q "errors=0 non2xx=0" || echo "FAILURES on port $3: $r" >&2
  echo "$r"
}
xacts() { psql_ -c "SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = 'tollgate'" postgres; }
metric() { python3 -c 'import sys,urllib.request as u; r=u.Request("http://127.0.0.1:%s/metrics" % sys.argv[1], headers={"Authorization": "Bearer perf-admin-token-000000000001"}); print(u.urlopen(r).read().decode())' "${PORT[postgres.admin]}" 2>/dev/null | awk -v m="$1" '$1 == m {print $2}'; }
# The control row "sled+db": the sled node at c=1 while the database beside it stores as many
# usage records per second (same text, same indexes) as the postgres node booked at c=1. On one
# machine the database's work competes with the node for the cores and the disk; this row shows
# how much of the postgres node's added p99 is that, not the node's request path.
db_load() { # rows per second, seconds
  for i in $(seq 1 "$2"); do
    echo "INSERT INTO bench_load SELECT node_id, seq, key_id, time_ms, record, bin FROM usage_records LIMIT $1; SELECT pg_sleep(1);"
  done | psql_ tollgate >/dev/null 2>&1
}
for t in $targets; do run 1 4 "${PORT[$t]}" >/dev/null; done
psql_ -c "CREATE TABLE bench_load (LIKE usage_records INCLUDING INDEXES)" tollgate
declare -A RPS P99
xact_rate=""
for round in 1 2; do
  for n in $targets; do
    p=${PORT[$n]}
    x0=$(xacts)
    r=$(run "$threads" 64 "$p")
    x1=$(xacts)
    l=$(run 1 1 "$p")
    RPS[$n]="${RPS[$n]:-} $(echo "$r" | sed -E 's/.*rps=([0-9.]+).*/\1/')"
    P99[$n]="${P99[$n]:-} $(echo "$l" | sed -E 's/.*p99_us=([0-9]+).*/\1/')"
    [ "$n" = postgres ] && xact_rate="$xact_rate $(( (x1 - x0) / dur ))" && c1_rate=$(echo "$l" | sed -E 's/.*rps=([0-9]+).*/\1/')
  done
  db_load "$c1_rate" $((dur + 2)) & loader=$!
  l=$(run 1 1 "${PORT[sled]}")
  kill $loader 2>/dev/null; wait $loader 2>/dev/null
  P99[control]="${P99[control]:-} $(echo "$l" | sed -E 's/.*p99_us=([0-9]+).*/\1/')"
done
best() { echo $1 | tr ' ' '\n' | sort -g | tail -1; }
low() { echo $1 | tr ' ' '\n' | sort -g | head -1; }
printf "%-16s %12s %10s %s\n" target "rps(c=64)" "p99us(c=1)" "rounds: rps / p99"
for n in $targets; do printf "%-16s %12s %10s %s\n" $n "$(best "${RPS[$n]}")" "$(low "${P99[$n]}")" "${RPS[$n]} /${P99[$n]}"; done
printf "%-16s %12s %10s\n" sled+db - "$(low "${P99[control]}")"
ratio() { # label sled-node postgres-node
  python3 - "$1" "$(best "${RPS[$2]}")" "$(best "${RPS[$3]}")" "$(low "${P99[$2]}")" "$(low "${P99[$3]}")" "$(low "${P99[direct]}")" <<'PY'
import sys
label = sys.argv[1]
s, p, s99, p99, d99 = (float(x) for x in sys.argv[2:7])
added_s, added_p = max(s99 - d99, 1.0), max(p99 - d99, 1.0)
print("%s: postgres/sled throughput=%.2f added_p99 postgres=%dus sled=%dus ratio=%.2f" % (label, p / s, added_p, added_s, added_p / added_s))
PY
}
ratio after sled postgres
[ -n "$before" ] && ratio before sled-before postgres-before
python3 - "$(best "${RPS[postgres]}")" "$(low "${P99[postgres]}")" "$(low "${P99[direct]}")" "$(metric tollgate_store_statements_per_request)" "$(metric tollgate_store_statements_total)" "$(best "$xact_rate")" "$(low "${P99[control]}")" <<'PY'
import sys
p, p99, d99 = (float(x) for x in sys.argv[1:4])
per_request, statements, xact_rate = float(sys.argv[4] or 0), float(sys.argv[5] or 0), float(sys.argv[6] or 0)
c99 = float(sys.argv[7] or 0)
added_p, added_c = max(p99 - d99, 1.0), max(c99 - d99, 1.0)
print("added_p99 sled with the same database load beside it=%dus; postgres/that=%.2f" % (added_c, added_p / added_c))
print("statements per relayed request=%.5f (total %d); PostgreSQL transactions/s at %.0f req/s: %.1f" % (per_request, statements, p, xact_rate))
PY
