# Sourced by the bench scripts: write_gateway_config FILE DIR NAME LISTEN ADMIN UPSTREAM_PORT EXTRA
# writes a tollgate config serving alpha-5.5 from the nginx upstream with the bench key (its
# group translates: a messages client reaches alpha-5.5 too);
# EXTRA is more top-level JSON members, each followed by a comma ("" for none).
write_gateway_config() {
  cat > "$1" <<YAML
{"pingora": {"threads": 2, "pid_file": "$2/$3.pid", "upgrade_sock": "$2/$3.sock"},
 "listen": "127.0.0.1:$4", "data_dir": "$2/$3-data",
 "admin": {"listen": "127.0.0.1:$5", "token": "perf-admin-token-000000000001"},
 "providers": [{"name": "up", "protocol": "openai", "base_url": "http://127.0.0.1:$6", "api_key": "up-openai-key", "models": ["alpha-5.5"]}],
 "groups": {"default": {"platforms": ["openai", "anthropic"], "translate": true}},
 "prices": {"alpha-5.5": {"input": 1.0, "output": 2.0}},
 $7
 "keys": [{"key": "sk-bench-0000000000000000000001", "name": "bench", "group": "default", "balance": 1000000000.0}]}
YAML
}
