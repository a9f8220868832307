#!/usr/bin/env bash
# Installs the Debian packages named as arguments, with sudo when not root: what
# scripts/test.sh and scripts/bench.sh found missing. Exits 1 when it cannot.
set -euo pipefail
[ $# -gt 0 ] || exit 0
sudo=""
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1; then
    sudo="sudo"
  else
    echo "please install these Debian packages (as root): $*" >&2
    exit 1
  fi
fi
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq "$@"
