#!/usr/bin/env bash
# How many instructions the hub spends on 1,000-change requests on the Redis store, counted by
# callgrind: a count moves by a few per cent between runs where a timed rate on a shared
# machine moves by a third.
#
#     bash scripts/hub-instructions.sh [HUB_BINARY] [REQUESTS]
#
# Starts a private redis-server (127.0.0.1, a free port, nothing saved) and the hub under
# `valgrind --tool=callgrind` (default binary: target/release/changehub; build it first),
# POSTs REQUESTS (default 40) bodies of 1,000 changes one after the other, each to new
# resources, waits until the batcher has published them all, stops the hub and prints the
# instructions counted in the web layer's connections, the store's group commit and the
# batcher (startup and idle ticks are left out), then the functions of the ingest path with
# their inclusive counts. The count moves between runs with how the batcher's reads fall
# (one read or two per request), so compare two binaries over two runs each, alternating.
# Needs valgrind (installed with apt-get when missing), redis-server, curl and python3.
# Takes about 30 s.
set -euo pipefail
cd "$(dirname "$0")/.."
bin="${1:-target/release/changehub}"
requests="${2:-40}"
missing=()
command -v valgrind >/dev/null 2>&1 || missing+=(valgrind)
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
command -v curl >/dev/null 2>&1 || missing+=(curl)
[ ${#missing[@]} -eq 0 ] || bash scripts/apt-install.sh "${missing[@]}"
[ -x "$bin" ] || { echo "no hub binary at $bin (cargo build --release)" >&2; exit 1; }

dir="$(mktemp -d)"
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
redis_port="$(free_port)"
hub_port="$(free_port)"
redis-server --port "$redis_port" --bind 127.0.0.1 --save '' --appendonly no \
  --dir "$dir" --daemonize yes --pidfile "$dir/redis.pid" >/dev/null
hub_pid=""
cleanup() {
  [ -n "$hub_pid" ] && kill "$hub_pid" 2>/dev/null || true
  [ -f "$dir/redis.pid" ] && kill "$(cat "$dir/redis.pid")" 2>/dev/null || true
  rm -rf "$dir"
}
trap cleanup EXIT

python3 - "$dir" "$requests" <<'EOF'
import json, sys
out, n = sys.argv[1], int(sys.argv[2])
for k in range(n):
    changes = [{"loc": f"http://example.com/resource/{k * 1000 + i}", "change": "updated",
                "hash": "md5:1e0d5cb8ef6ba40c99b14c0237be735e", "length": 1234,
                "type": "text/plain"} for i in range(1000)]
    with open(f"{out}/body{k}.json", "w") as f:
        json.dump(changes, f)
EOF

RUST_LOG=warn valgrind --tool=callgrind --callgrind-out-file="$dir/callgrind.out" \
  --collect-atstart=no --toggle-collect='*serve_connection*' \
  --toggle-collect='*group::call*' --toggle-collect='*Batcher*' \
  "$bin" serve --listen "127.0.0.1:$hub_port" --data-dir "$dir/data" \
  --channel bench=bench-token --admin-token admin --max-body 67108864 \
  --redis "redis://127.0.0.1:$redis_port" >"$dir/hub.log" 2>&1 &
hub_pid=$!
base="http://127.0.0.1:$hub_port"
for _ in $(seq 600); do curl -sf "$base/readyz" >/dev/null && break; sleep 0.2; done
curl -sf "$base/readyz" >/dev/null || { cat "$dir/hub.log" >&2; exit 1; }
for k in $(seq 0 $((requests - 1))); do
  curl -sf -o /dev/null -H 'Authorization: Bearer bench-token' \
    -H 'Content-Type: application/json' --data-binary "@$dir/body$k.json" \
    "$base/channels/bench/changes"
done
published() {
  curl -s -H 'Authorization: Bearer admin' "$base/api/channels" |
    python3 -c 'import json,sys; print(json.load(sys.stdin)[0]["published"])' 2>/dev/null || echo 0
}
for _ in $(seq 600); do [ "$(published)" -ge $((requests * 1000)) ] && break; sleep 0.2; done
kill -INT "$hub_pid"
wait "$hub_pid" || true
hub_pid=""
total="$(awk '/^totals:/{print $2}' "$dir/callgrind.out")"
echo "instructions: $total for $requests requests of 1,000 changes ($((total / requests / 1000)) per change)"
callgrind_annotate --inclusive=yes --threshold=100 "$dir/callgrind.out" 2>/dev/null |
  grep -E "parse_body|from_wire|NewChange::validate|log::Request::new|Batcher::run::|render_notification|log::range::|log::decode_entry " |
  sed -E 's/ \([^)]*\)//; s/\[[^]]*\]//; s/\?\?\?://' | head -12
