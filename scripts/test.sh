#!/usr/bin/env bash
# The whole test suite, set-up included. Beside the Rust toolchain the tests need
# redis-server and redis-cli (the Redis store's tests start private servers and clusters),
# Chromium with its WebDriver (the dashboard's browser test), and python3 with venv (the
# ResourceSync reference client, installed by its test into a venv with pip), and Prosody (the
# XMPP server the XMPP bridge's test starts): installed here with apt-get when missing.
# Then `cargo test`, with any arguments given to this script.
set -euo pipefail
cd "$(dirname "$0")/.."

missing=()
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
command -v redis-cli >/dev/null 2>&1 || missing+=(redis-tools)
command -v chromium >/dev/null 2>&1 || missing+=(chromium)
command -v prosody >/dev/null 2>&1 || missing+=(prosody)
command -v chromedriver >/dev/null 2>&1 || missing+=(chromium-driver)
# The ResourceSync reference client (Python resync) runs from a venv the test makes.
command -v python3 >/dev/null 2>&1 || missing+=(python3)
python3 -c 'import ensurepip' >/dev/null 2>&1 || missing+=(python3-venv)
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing what the tests need: ${missing[*]}"
  bash scripts/apt-install.sh "${missing[@]}"
fi

exec cargo test "$@"
