# Sourced by the bench scripts: write_gateway_config FILE DIR NAME LISTEN ADMIN UPSTREAM_PORT EXTRA
# writes a tollgate config serving alpha-5.5 from the nginx upstream with the bench key (its
# group translates: a messages client reaches alpha-5.5 too);
# EXTRA is more top-level JSON members, each followed by a comma ("" for none); GROUP_EXTRA (an
# optional 8th argument) more members of the key's group, each preceded by a comma (e.g.
# `, "guardrails": ["secrets"]`).
# PERF_PROVIDER picks the kind of provider serving alpha-5.5 (default openai): anthropic (a
# native messages provider), gemini (a generate-content provider), bedrock (InvokeModel, every
# request SigV4-signed; the model named anthropic.claude-bench-v1:0 upstream) or vertex
# (rawPredict with a service-account token from the upstream's /token; claude-bench@1
# upstream). The key's group takes all three client protocols and translates.
bench_provider() { # UPSTREAM_PORT DIR
  case "${PERF_PROVIDER:-openai}" in
    gemini) echo "{\"name\": \"up\", \"protocol\": \"gemini\", \"base_url\": \"http://127.0.0.1:$1\", \"api_key\": \"up-gemini-key\", \"models\": [\"alpha-5.5\"]}" ;;
    anthropic) echo "{\"name\": \"up\", \"protocol\": \"anthropic\", \"base_url\": \"http://127.0.0.1:$1\", \"api_key\": \"up-anthropic-key\", \"models\": [\"alpha-5.5\"]}" ;;
    bedrock) echo "{\"name\": \"up\", \"protocol\": \"bedrock\", \"region\": \"us-east-1\", \"endpoint_url\": \"http://127.0.0.1:$1\", \"aws\": {\"access_key_id\": \"AKIDBENCH\", \"secret_access_key\": \"bench-secret\"}, \"models\": [{\"name\": \"alpha-5.5\", \"upstream\": \"anthropic.claude-bench-v1:0\"}]}" ;;
    vertex)
      python3 - "$1" "$2/vertex-sa.json" <<'PY'
import json, os, sys
sa = json.load(open(os.path.join(os.getcwd(), "tests", "fixtures", "vertex-sa.json")))
sa["token_uri"] = "http://127.0.0.1:%s/token" % sys.argv[1]
json.dump(sa, open(sys.argv[2], "w"))
PY
      echo "{\"name\": \"up\", \"protocol\": \"vertex\", \"project\": \"bench\", \"location\": \"us-east5\", \"credentials_file\": \"$2/vertex-sa.json\", \"base_url\": \"http://127.0.0.1:$1\", \"models\": [{\"name\": \"alpha-5.5\", \"upstream\": \"claude-bench@1\"}]}" ;;
    *) echo "{\"name\": \"up\", \"protocol\": \"openai\", \"base_url\": \"http://127.0.0.1:$1\", \"api_key\": \"up-openai-key\", \"models\": [\"alpha-5.5\"]}" ;;
  esac
}
write_gateway_config() {
  local provider; provider=$(bench_provider "$6" "$2")
  cat > "$1" <<YAML
{"pingora": {"threads": 2, "pid_file": "$2/$3.pid", "upgrade_sock": "$2/$3.sock"},
 "listen": "127.0.0.1:$4", "data_dir": "$2/$3-data",
 "admin": {"listen": "127.0.0.1:$5", "token": "perf-admin-token-000000000001"},
 "providers": [$provider],
 "groups": {"default": {"platforms": ["openai", "anthropic", "gemini"], "translate": true${8:-}}},
 "prices": {"alpha-5.5": {"input": 1.0, "output": 2.0}},
 $7
 "keys": [{"key": "sk-bench-0000000000000000000001", "name": "bench", "group": "default", "balance": 1000000000.0${9:-}}]}
YAML
}
