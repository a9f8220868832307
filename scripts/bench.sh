#!/usr/bin/env bash
# The benchmark of issue 13: every figure against a baseline from the same run, written to
# BENCHMARKS.md (see benches/suite.rs). Installs nginx, wrk and redis with apt-get when missing,
# raises the open-file limit (10,000 subscribers and websockets), then
# `cargo bench --bench suite` with any arguments given to this script.
# Environment: BENCH_SCALE (0.1: a quick run), BENCH_BEFORE_BIN (an older changehub binary,
# measured in the same run), BENCH_HUB_BIN, BENCH_BEFORE_LABEL and BENCH_HUB_LABEL (how the
# report names those binaries), BENCH_REPORT, BENCH_RETAINED (10000000: 10⁷ retained).
set -euo pipefail
cd "$(dirname "$0")/.."

missing=()
command -v nginx >/dev/null 2>&1 || [ -x /usr/sbin/nginx ] || missing+=(nginx-light)
command -v wrk >/dev/null 2>&1 || missing+=(wrk)
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
{ command -v redis-benchmark && command -v redis-cli; } >/dev/null 2>&1 || missing+=(redis-tools)
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing what the benchmark needs: ${missing[*]}"
  # nginx-light is gone from newer Debian releases: nginx then.
  bash scripts/apt-install.sh "${missing[@]}" ||
    bash scripts/apt-install.sh "${missing[@]/nginx-light/nginx}"
fi

ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)"
export PATH="$PATH:/usr/sbin:/sbin"
export BENCH_COMMAND="bash scripts/bench.sh${*:+ $*}"
exec cargo bench --bench suite "$@"
