#!/usr/bin/env bash
# The whole test suite: system packages, the agent CLIs from npm, formatting and lints (rustfmt,
# clippy with warnings as errors), Rust unit + integration tests (one `cargo test` build), fuzz
# targets, then the SDK compatibility suite and the console's browser tests (headless Chromium) in
# a virtualenv against the binaries that build made, with the OTLP trace tests between them.
set -euo pipefail
cd "$(dirname "$0")/.."

SUDO=""
if [ "$(id -u)" != "0" ] && command -v sudo >/dev/null 2>&1; then SUDO="sudo"; fi
need=()
command -v cmake >/dev/null 2>&1 || need+=(cmake)
[ -f /etc/ssl/certs/ca-certificates.crt ] || need+=(ca-certificates)
command -v python3 >/dev/null 2>&1 || need+=(python3)
python3 -m venv --help >/dev/null 2>&1 || need+=(python3-venv)
# A real PostgreSQL server for the fleet tests (tests/store/fleet_store.rs starts its own in a temp dir).
ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || need+=(postgresql)
# Headless Chromium and its driver for the console's browser tests (tests/console), and
# libfaketime to start a gateway just before a UTC midnight.
command -v chromium >/dev/null 2>&1 || need+=(chromium)
command -v chromedriver >/dev/null 2>&1 || need+=(chromium-driver)
[ -f /usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1 ] || need+=(faketime)
if [ ${#need[@]} -gt 0 ]; then
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq "${need[@]}" python3-venv
fi

echo "== Python tools (.venv: SDKs, pytest, the S3 server for the storage tests)"
if [ ! -x .venv/bin/python ] || ! .venv/bin/python -c 'import sys' 2>/dev/null; then
  rm -rf .venv
  python3 -m venv .venv
fi
.venv/bin/pip install -q --disable-pip-version-check -r tests/sdk/requirements.txt
export TOLLGATE_S3_SERVER="$PWD/.venv/bin/moto_server"

echo "== Agent CLIs from npm (Claude Code, Codex, Gemini CLI) for tests/gateway/agent_clis.rs"
# Pinned: the versions the tests were written against. Node (20 or newer) from Debian's packages
# when the machine has none.
AGENT_CLIS="${TOLLGATE_AGENT_CLI_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/tollgate/agent-clis}"
AGENT_PACKAGES=(@anthropic-ai/claude-code@2.1.197 @openai/codex@0.169.0 @google/gemini-cli@0.61.0)
if ! command -v npm >/dev/null 2>&1; then
  export DEBIAN_FRONTEND=noninteractive
  { $SUDO apt-get update -qq && $SUDO apt-get install -y -qq nodejs npm; } || true
fi
if command -v npm >/dev/null 2>&1 \
  && npm install --prefix "$AGENT_CLIS" --no-audit --no-fund --loglevel=error "${AGENT_PACKAGES[@]}" >/dev/null; then
  export TOLLGATE_AGENT_CLIS="$AGENT_CLIS/node_modules/.bin"
  export TOLLGATE_AGENT_CLIS_REQUIRED=1
  echo "installed into $AGENT_CLIS: ${AGENT_PACKAGES[*]} (node $(node --version))"
else
  echo "agent CLI tests will be SKIPPED: npm is missing or could not install ${AGENT_PACKAGES[*]}"
fi

echo "== The openai, ws and @modelcontextprotocol/sdk npm packages for tests/sdk/test_media.py, test_realtime.py and test_mcp_gateway.py (the JavaScript SDK's images, speech and realtime clients; the MCP TypeScript SDK's client)"
JS_SDK="${TOLLGATE_JS_SDK_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/tollgate/js-sdk}"
if command -v npm >/dev/null 2>&1 \
  && npm install --prefix "$JS_SDK" --no-audit --no-fund --loglevel=error openai@7.57.0 ws@8.23.0 @modelcontextprotocol/sdk@1.32.2 >/dev/null; then
  export TOLLGATE_JS_SDK="$JS_SDK/node_modules"
  export TOLLGATE_JS_SDK_REQUIRED=1
else
  echo "the JavaScript SDK tests will be SKIPPED: npm is missing or could not install openai@7.57.0 ws@8.23.0 @modelcontextprotocol/sdk@1.32.2"
fi

echo "== oidc-provider from npm for tests/sdk/test_identity.py (a real OpenID Connect provider)"
OIDC="${TOLLGATE_OIDC_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/tollgate/oidc}"
if command -v npm >/dev/null 2>&1 \
  && npm install --prefix "$OIDC" --no-audit --no-fund --loglevel=error oidc-provider@9.13.3 >/dev/null; then
  export TOLLGATE_OIDC_MODULES="$OIDC/node_modules"
  export TOLLGATE_OIDC_REQUIRED=1
else
  echo "the identity tests will be SKIPPED: npm is missing or could not install oidc-provider@9.13.3"
fi

echo "== The stripe npm package: its test-header helper signs the webhook events of the payment tests"
STRIPE_JS="${TOLLGATE_STRIPE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/tollgate/stripe}"
if command -v npm >/dev/null 2>&1 \
  && npm install --prefix "$STRIPE_JS" --no-audit --no-fund --loglevel=error stripe@23.1.0 >/dev/null; then
  export TOLLGATE_STRIPE_MODULES="$STRIPE_JS/node_modules"
else
  echo "the payment tests will FAIL: npm is missing or could not install stripe@23.1.0"
fi

echo "== LiteLLM's price table (model_prices_and_context_window) from its PyPI wheel, for the price feed tests"
LITELLM="${TOLLGATE_LITELLM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/tollgate/litellm}"
mkdir -p "$LITELLM"
if [ ! -s "$LITELLM/model_prices_and_context_window_backup.json" ]; then
  .venv/bin/pip download -q --disable-pip-version-check --no-deps litellm==1.110.2 -d "$LITELLM"
  .venv/bin/python - "$LITELLM" <<'PY'
import glob, sys, zipfile
wheel = glob.glob(sys.argv[1] + "/litellm-1.110.2-*.whl")[0]
with zipfile.ZipFile(wheel) as z, open(sys.argv[1] + "/model_prices_and_context_window_backup.json", "wb") as out:
    out.write(z.read("litellm/model_prices_and_context_window_backup.json"))
PY
  rm -f "$LITELLM"/litellm-*.whl
fi
export TOLLGATE_LITELLM_PRICES="$LITELLM/model_prices_and_context_window_backup.json"

# A CI build starts from nothing: incremental caches (a GiB here) would only take disk. With the
# debug-info settings of Cargo.toml's dev profile, the whole build takes about 3 GiB.
if [ "${CI:-}" = "true" ]; then export CARGO_INCREMENTAL=0; fi

echo "== cargo fmt --check, cargo clippy -D warnings"
cargo fmt --version >/dev/null 2>&1 || rustup component add rustfmt
cargo clippy --version >/dev/null 2>&1 || rustup component add clippy
cargo fmt --all -- --check
cargo clippy --locked --all-targets -- -D warnings 2>&1

echo "== cargo test"
cargo test --locked 2>&1

echo "== fuzz targets (fuzz/), a bounded run each where cargo-fuzz and a nightly toolchain exist"
if [ "${TOLLGATE_FUZZ:-1}" != "0" ] && cargo fuzz --version >/dev/null 2>&1 && rustup toolchain list 2>/dev/null | grep -q '^nightly'; then
  for target in sse_scanner body_fields video_request config handover_message; do
    (cd fuzz && cargo +nightly fuzz run -O "$target" -- -max_total_time="${TOLLGATE_FUZZ_SECS:-20}" -rss_limit_mb=4096) 2>&1 | tail -3
  done
else
  echo "fuzzing skipped: needs cargo-fuzz (cargo install cargo-fuzz) and a nightly toolchain (rustup toolchain install nightly); TOLLGATE_FUZZ=0 skips it"
fi

echo "== SDK compatibility suite"
TOLLGATE_BIN_DIR="$PWD/target/debug" .venv/bin/python -m pytest -q tests/sdk

echo "== Traces over OTLP to a real receiver (http/protobuf and gRPC)"
TOLLGATE_BIN_DIR="$PWD/target/debug" .venv/bin/python -m pytest -q tests/otlp

echo "== Console in headless Chromium (screenshots in target/console-screenshots/)"
TOLLGATE_BIN_DIR="$PWD/target/debug" .venv/bin/python -m pytest -q tests/console

echo "== The manual's examples (README.md, docs/) against the bundled configuration and mock"
TOLLGATE_BIN_DIR="$PWD/target/debug" .venv/bin/python -m pytest -q tests/docs
