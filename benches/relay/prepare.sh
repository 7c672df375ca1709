# Sourced by the relay bench scripts (run.sh, rounds.sh, instructions.sh), from the repository
# root, with `here` set to benches/relay and the Debian packages each needs beyond nginx, wrk and
# cmake as arguments: installs what is missing, builds tollgate's release binary and the bare
# Pingora proxy (bare/, its build cached), and defines `bare` (that proxy's binary) and `port`
# (a free loopback port).
prepare_missing=""
for tool in nginx wrk cmake "$@"; do command -v "$tool" >/dev/null || prepare_missing=1; done
[ -z "$prepare_missing" ] || { apt-get update -qq && apt-get install -y nginx wrk cmake "$@"; } >/dev/null 2>&1
cargo build --release --bin tollgate >/dev/null 2>&1 || { echo "release build failed"; exit 1; }
bare_dir="${XDG_CACHE_HOME:-$HOME/.cache}/tollgate-perf-bare-target"
bare="$bare_dir/release/bare-pingora"
CARGO_TARGET_DIR="$bare_dir" cargo build --release --manifest-path "$here/bare/Cargo.toml" >/dev/null 2>&1 || { echo "bare Pingora build failed"; exit 1; }
port() { python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])'; }
# bench_tool DIR BIN: the bench crate benches/DIR (its own workspace, never the test build) built
# once into ~/.cache/tollgate-DIR-target; prints the path of its binary BIN.
bench_tool() {
  local dir="${XDG_CACHE_HOME:-$HOME/.cache}/tollgate-$1-target"
  CARGO_TARGET_DIR="$dir" cargo build --release --manifest-path "benches/$1/Cargo.toml" >/dev/null 2>&1 || { echo "benches/$1 build failed" >&2; return 1; }
  echo "$dir/release/$2"
}
