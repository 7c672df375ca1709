#!/usr/bin/env bash
# One tollgate node on PostgreSQL against one on sled, same run, same nginx upstream, same external
# load generator (wrk): throughput at c=64 and added p99 at c=1 (over going direct), best of two
# rounds; then what the shared database carries: statements per relayed request (tollgate's own
# counter) and the server's transactions per second at the measured rate (pg_stat_database).
# A control row runs the sled node with the same database load beside it (see db_load). The
# upstream and the request are the relay bench's (benches/relay).
# Usage, from the repository root: bash benches/fleet/run.sh  (PERF_SECONDS=8 by default).
set -u
here="$(cd "$(dirname "$0")" && pwd)"
dur="${PERF_SECONDS:-8}"
command -v nginx >/dev/null && command -v wrk >/dev/null || { apt-get update -qq && apt-get install -y nginx wrk; } >/dev/null 2>&1
[ -d /usr/lib/postgresql ] || { apt-get update -qq && apt-get install -y postgresql; } >/dev/null 2>&1
pgbin="$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1)"
cargo build --release --bin tollgate >/dev/null 2>&1 || { echo "release build failed"; exit 1; }
bin="$PWD/target/release/tollgate"
dir="$(mktemp -d -t tollgate-fleet-perf.XXXX)"; chmod 755 "$dir"
port() { python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])'; }
UP=$(port); SL=$(port); PG=$(port); PGA=$(port); SLA=$(port); DB=$(port)
as_pg() { if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi; }
mkdir "$dir/pg"; [ "$(id -u)" = 0 ] && chown postgres:postgres "$dir/pg"
as_pg "$pgbin/initdb" -D "$dir/pg/data" -U postgres -A trust --no-sync -E UTF8 >/dev/null
as_pg "$pgbin/postgres" -D "$dir/pg/data" -p "$DB" -k "$dir/pg" -c listen_addresses=127.0.0.1 -c max_connections=100 >"$dir/pg.log" 2>&1 &
for i in $(seq 1 100); do as_pg "$pgbin/pg_isready" -q -h 127.0.0.1 -p "$DB" && break; sleep 0.2; done
as_pg "$pgbin/createdb" -h 127.0.0.1 -p "$DB" -U postgres tollgate
sed -e "s#__DIR__#$dir#g" -e "s#__UP__#$UP#g" "$here/../relay/upstream.conf.tmpl" > "$dir/upstream.conf"
nginx -p "$dir" -c "$dir/upstream.conf" -g 'daemon off;' & pu=$!
. "$here/../gateway-config.sh"
node() { # name listen admin store
  write_gateway_config "$dir/$1.yaml" "$dir" "$1" "$2" "$3" "$UP" "$4"
  RUST_LOG=warn "$bin" -c "$dir/$1.yaml" >"$dir/$1.log" 2>&1 &
}
node sled "$SL" "$SLA" ""; psl=$!
node postgres "$PG" "$PGA" "\"store\": {\"postgres\": {\"url\": \"postgres://postgres@127.0.0.1:$DB/tollgate\"}, \"node_id\": \"bench-1\"},"; ppn=$!
cleanup() { kill $psl $ppn $pu 2>/dev/null; as_pg "$pgbin/pg_ctl" -D "$dir/pg/data" stop -m fast >/dev/null 2>&1; wait 2>/dev/null; rm -rf "$dir"; }
trap cleanup EXIT
for p in $UP $SL $PG; do for i in $(seq 1 200); do curl -s -o /dev/null "http://127.0.0.1:$p/" && break; sleep 0.2; done; done
path=/v1/chat/completions
run() { wrk -t"$1" -c"$2" -d"${dur}s" -s "$here/../relay/post.lua" "http://127.0.0.1:$3$path" 2>/dev/null | grep RESULT; }
xacts() { as_pg "$pgbin/psql" -h 127.0.0.1 -p "$DB" -U postgres -tAc "SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = 'tollgate'"; }
metric() { curl -s -H "Authorization: Bearer perf-admin-token-000000000001" "http://127.0.0.1:$PGA/metrics" | awk -v m="$1" '$1 == m {print $2}'; }
psql_() { as_pg "$pgbin/psql" -h 127.0.0.1 -p "$DB" -U postgres -qtA tollgate "$@"; }
# The control row "sled+db": the sled node at c=1 while the database beside it stores as many
# usage records per second (same text, same indexes) as the postgres node booked at c=1. On one
# machine the database's work competes with the node for the cores and the disk; this row shows
# how much of the postgres node's added p99 is that, not the node's request path.
db_load() { # rows per second, seconds
  for i in $(seq 1 "$2"); do
    echo "INSERT INTO bench_load SELECT 'load', g, 'k', g, (SELECT record FROM usage_records LIMIT 1) FROM generate_series(1, $1) g; SELECT pg_sleep(1);"
  done | psql_ >/dev/null 2>&1
}
for p in $UP $SL $PG; do run 1 4 "$p" >/dev/null; done
psql_ -c "CREATE TABLE bench_load (LIKE usage_records INCLUDING INDEXES)"
declare -A RPS P99
xact_rate=""
for round in 1 2; do
  for t in direct:$UP sled:$SL postgres:$PG; do
    n=${t%%:*}; p=${t#*:}
    x0=$(xacts)
    r=$(run 2 64 "$p")
    x1=$(xacts)
    l=$(run 1 1 "$p")
    RPS[$n]="${RPS[$n]:-} $(echo "$r" | sed -E 's/.*rps=([0-9.]+).*/\1/')"
    P99[$n]="${P99[$n]:-} $(echo "$l" | sed -E 's/.*p99_us=([0-9]+).*/\1/')"
    [ "$n" = postgres ] && xact_rate="$xact_rate $(( (x1 - x0) / dur ))" && c1_rate=$(echo "$l" | sed -E 's/.*rps=([0-9]+).*/\1/')
  done
  db_load "$c1_rate" $((dur + 2)) & loader=$!
  l=$(run 1 1 "$SL")
  kill $loader 2>/dev/null; wait $loader 2>/dev/null
  P99[control]="${P99[control]:-} $(echo "$l" | sed -E 's/.*p99_us=([0-9]+).*/\1/')"
done
best() { echo $1 | tr ' ' '\n' | sort -g | tail -1; }
low() { echo $1 | tr ' ' '\n' | sort -g | head -1; }
printf "%-9s %12s %10s\n" target "rps(c=64)" "p99us(c=1)"
for n in direct sled postgres; do printf "%-9s %12s %10s\n" $n "$(best "${RPS[$n]}")" "$(low "${P99[$n]}")"; done
printf "%-9s %12s %10s\n" sled+db - "$(low "${P99[control]}")"
python3 - "$(best "${RPS[sled]}")" "$(best "${RPS[postgres]}")" "$(low "${P99[sled]}")" "$(low "${P99[postgres]}")" "$(low "${P99[direct]}")" \
  "$(metric tollgate_store_statements_per_request)" "$(metric tollgate_store_statements_total)" "$(best "$xact_rate")" "$(low "${P99[control]}")" <<'PY'
import sys
s, p, s99, p99, d99 = (float(x) for x in sys.argv[1:6])
per_request, statements, xact_rate = float(sys.argv[6] or 0), float(sys.argv[7] or 0), float(sys.argv[8] or 0)
c99 = float(sys.argv[9] or 0)
added_s, added_p, added_c = max(s99 - d99, 1.0), max(p99 - d99, 1.0), max(c99 - d99, 1.0)
print("postgres/sled throughput=%.2f added_p99 postgres=%dus sled=%dus ratio=%.2f" % (p / s, added_p, added_s, added_p / added_s))
print("added_p99 sled with the same database load beside it=%dus; postgres/that=%.2f" % (added_c, added_p / added_c))
print("statements per relayed request=%.5f (total %d); PostgreSQL transactions/s at %.0f req/s: %.1f" % (per_request, statements, p, xact_rate))
PY
