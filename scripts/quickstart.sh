#!/usr/bin/env bash
# Installs dependencies, builds Infera and runs the built-in default model.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
scripts/install-deps.sh
scripts/build.sh
exec build/infera run -p "${1:-In the beginning}" -n "${2:-64}"
