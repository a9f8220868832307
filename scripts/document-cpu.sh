#!/usr/bin/env bash
# The hub's CPU for a Change List it does not hold rendered: a closed list of 10,000 changes
# read while the closed-list cache is too small to keep it (every read a miss), and the topic
# of 5,000 changes after each new change (every read a new rendering).
#
#     bash scripts/document-cpu.sh [HUB_BINARY] [embedded|redis]
#
# Starts the hub (default binary: target/release/changehub; build it first) with
# `--cache-size 16` on a fresh embedded store, or on a private redis-server (127.0.0.1, a free
# port, nothing saved), fills channel `bench` with 205,000 changes (20 closed lists and a topic
# of 5,000), reads every closed list once, then each 3 times more, and prints the hub's CPU
# (from /proc) per closed-list read; then posts one change and reads the topic, 40 times,
# and prints the CPU per read less that of the posts alone (40 posts measured first).
# Needs curl and python3 (and redis-server for redis). Takes about a minute.
set -euo pipefail
cd "$(dirname "$0")/.."
bin="${1:-target/release/changehub}"
store="${2:-embedded}"
[ -x "$bin" ] || { echo "no hub binary at $bin (cargo build --release)" >&2; exit 1; }

dir="$(mktemp -d)"
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
hub_pid=""
cleanup() {
  [ -n "$hub_pid" ] && kill "$hub_pid" 2>/dev/null || true
  [ -f "$dir/redis.pid" ] && kill "$(cat "$dir/redis.pid")" 2>/dev/null || true
  rm -rf "$dir"
}
trap cleanup EXIT

python3 - "$dir" <<'EOF'
import json, sys
changes = [{"loc": f"http://example.com/resource/{i}", "change": "updated",
            "hash": "md5:1e0d5cb8ef6ba40c99b14c0237be735e", "length": 1234,
            "type": "text/plain"} for i in range(1000)]
open(sys.argv[1] + "/body.json", "w").write(json.dumps(changes))
open(sys.argv[1] + "/one.json", "w").write(json.dumps(changes[:1]))
EOF

store_args=()
if [ "$store" = redis ]; then
  redis_port="$(free_port)"
  redis-server --port "$redis_port" --bind 127.0.0.1 --save '' --appendonly no \
    --dir "$dir" --daemonize yes --pidfile "$dir/redis.pid" >/dev/null
  store_args=(--redis "redis://127.0.0.1:$redis_port")
fi
hub_port="$(free_port)"
RUST_LOG=warn "$bin" serve --listen "127.0.0.1:$hub_port" --data-dir "$dir/data" \
  --channel bench=bench-token --admin-token admin --max-body 67108864 --cache-size 16 \
  "${store_args[@]}" >"$dir/hub.log" 2>&1 &
hub_pid=$!
base="http://127.0.0.1:$hub_port"
for _ in $(seq 100); do curl -sf "$base/readyz" >/dev/null && break; sleep 0.1; done
curl -sf "$base/readyz" >/dev/null || { cat "$dir/hub.log" >&2; exit 1; }

post() {
  curl -sf -o /dev/null -H 'Authorization: Bearer bench-token' \
    -H 'Content-Type: application/json' --data-binary "@$dir/$1" "$base/channels/bench/changes"
}
for _ in $(seq 205); do post body.json; done
published() {
  curl -s -H 'Authorization: Bearer admin' "$base/api/channels" |
    python3 -c 'import json,sys; print(json.load(sys.stdin)[0]["published"])' 2>/dev/null || echo 0
}
for _ in $(seq 300); do [ "$(published)" -ge 205000 ] && break; sleep 0.2; done

cpu_ticks() { awk '{print $14 + $15}' "/proc/$hub_pid/stat"; }
per() { python3 -c "import os; print(f'{($1) / os.sysconf(\"SC_CLK_TCK\") / $2 * 1000:.2f}')"; }
closed() { curl -sf -o /dev/null "$base/channels/bench/changelist/$(($1 * 10000 + 1))-$(($1 * 10000 + 10000)).xml"; }

for k in $(seq 0 19); do closed "$k"; done
c0="$(cpu_ticks)"
for _ in 1 2 3; do for k in $(seq 0 19); do closed "$k"; done; done
c1="$(cpu_ticks)"
echo "closed list of 10,000 changes, not kept: $(per "$c1 - $c0" 60) ms of hub CPU per read"

c0="$(cpu_ticks)"
for _ in $(seq 40); do post one.json; done
c1="$(cpu_ticks)"
for _ in $(seq 40); do
  post one.json
  curl -sf -o /dev/null "$base/channels/bench/changelist.xml"
done
c2="$(cpu_ticks)"
echo "topic of 5,000 changes after a new one: $(per "($c2 - $c1) - ($c1 - $c0)" 40) ms of hub CPU per read"
