#!/usr/bin/env bash
# Runs every fuzz target of tests/fuzz.rs for FUZZ_SECONDS each (default 60), outside the
# normal test run: bash scripts/fuzz.sh [FILTER]
set -euo pipefail
cd "$(dirname "$0")/.."
export FUZZ_SECONDS="${FUZZ_SECONDS:-60}"
cargo test --release --test fuzz -- --ignored --nocapture --test-threads 1 "${1:-fuzz_}"
