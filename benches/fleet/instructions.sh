#!/usr/bin/env bash
# User-space instructions per relayed request of a node on PostgreSQL against the same build on
# sled (issue 46 point 5: at most 1.05x), counted by callgrind exactly as
# benches/relay/instructions.sh counts them: that script's `tollgate` row is the sled node and its
# `other` row the same binary with `store.postgres` set, against a PostgreSQL server this script
# starts in a temporary directory (as the `postgres` user when run as root). Both count the same
# load's work to its end (see `settle`).
# TOLLGATE_CG_KEEP=DIR keeps the callgrind outputs for callgrind_annotate.
# Usage, from the repository root: bash benches/fleet/instructions.sh
set -u
[ -d /usr/lib/postgresql ] || { apt-get update -qq && apt-get install -y postgresql; } >/dev/null 2>&1
pgbin="$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1)"
dir="$(mktemp -d -t tollgate-fleet-instr.XXXX)"; chmod 755 "$dir"
as_pg() { if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi; }
[ "$(id -u)" = 0 ] && chown postgres:postgres "$dir"
DB=$(python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])')
as_pg "$pgbin/initdb" -D "$dir/data" -U postgres -A trust --no-sync -E UTF8 >/dev/null
as_pg "$pgbin/postgres" -D "$dir/data" -p "$DB" -k "$dir" -c listen_addresses=127.0.0.1 >"$dir/pg.log" 2>&1 &
trap 'as_pg "$pgbin/pg_ctl" -D "$dir/data" stop -m fast >/dev/null 2>&1; rm -rf "$dir"' EXIT
for _ in $(seq 1 100); do as_pg "$pgbin/pg_isready" -q -h 127.0.0.1 -p "$DB" && break; sleep 0.2; done
as_pg "$pgbin/createdb" -h 127.0.0.1 -p "$DB" -U postgres tollgate
# A node on PostgreSQL books its journal and ships its request log a sync round (1 s) after the
# requests: the count starts once the warm-up's records are in the database and stops once the
# counted requests' are (both tables unchanged for 1.5 s); the sled node waits alike.
rows() { as_pg "$pgbin/psql" -h 127.0.0.1 -p "$DB" -U postgres -tAc "SELECT (SELECT count(*) FROM usage_records) + (SELECT count(*) FROM request_log)" tollgate 2>/dev/null; }
settle() { local a b; a=$(rows); while sleep 1.5; b=$(rows); [ "$a" != "$b" ]; do a=$b; done; }
export -f rows settle as_pg; export pgbin DB
PERF_SETTLE=settle \
PERF_OTHER_BIN="$PWD/target/release/tollgate" \
PERF_OTHER_EXTRA="\"store\": {\"postgres\": {\"url\": \"postgres://postgres@127.0.0.1:$DB/tollgate\"}, \"node_id\": \"bench-1\"}," \
  bash "$(dirname "$0")/../relay/instructions.sh" | sed -e 's/^tollgate /sled     /' -e 's/^other    /postgres /'
