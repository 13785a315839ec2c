#!/usr/bin/env bash
# Installs what the tests need, builds, and runs every test (unit + conformance).
# Usage: scripts/test.sh [ctest args...]   e.g. scripts/test.sh -L unit
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
scripts/install-deps.sh --test
scripts/build.sh
cd build
ctest --output-on-failure -j "$(nproc)" "$@"
