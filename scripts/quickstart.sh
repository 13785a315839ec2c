#!/usr/bin/env bash
# Installs dependencies, builds Infera and serves the built-in default model on
# 127.0.0.1:8000 (extra arguments go to `infera serve`, e.g. --port 8080).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
scripts/install-deps.sh
scripts/build.sh
exec build/infera serve "$@"
