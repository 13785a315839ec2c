#!/usr/bin/env bash
# Installs what Infera needs to build and test on Debian 12, from Debian packages only.
# Usage: scripts/install-deps.sh [--test]   (--test adds nginx, chromium and the npm packages of the
# conformance, browser and structured-output tests)
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi

pkgs=(build-essential cmake ninja-build ccache pkg-config git
      nlohmann-json3-dev libcpp-httplib-dev libboost-dev libcli11-dev libpcre2-dev libxxhash-dev libutf8proc-dev
      libspdlog-dev libfmt-dev libyaml-cpp-dev libssl-dev
      libgtest-dev libgmock-dev libbenchmark-dev python3 python3-numpy nodejs npm
      openmpi-bin libopenmpi-dev curl clang-format)
missing=()
for p in "${pkgs[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
# Node.js 18+ may come from another source than Debian's package; accept any.
if command -v node >/dev/null 2>&1 && command -v npm >/dev/null 2>&1; then
  missing=("${missing[@]/nodejs}"); missing=("${missing[@]/npm}")
fi
filtered=()
for p in "${missing[@]}"; do [ -n "$p" ] && filtered+=("$p"); done
if [ ${#filtered[@]} -gt 0 ]; then
  echo "installing Debian packages: ${filtered[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${filtered[@]}"
fi

if [ "${1:-}" = "--test" ]; then
  # nginx: tests/hostile/nginx_gateway.mjs runs examples/nginx.conf in front of the server.
  if ! command -v nginx >/dev/null 2>&1 && [ ! -x /usr/sbin/nginx ]; then
    echo "installing Debian packages: nginx openssl"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq nginx openssl
  fi
  # chromium: tests/browser/console.mjs drives the web console in it, headless.
  if ! command -v chromium >/dev/null 2>&1; then
    echo "installing Debian packages: chromium"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq chromium
  fi
  node_major=$(node -p 'process.versions.node.split(".")[0]' 2>/dev/null || echo 0)
  if [ "$node_major" -lt 20 ]; then
    echo "warning: Node.js $(node --version 2>/dev/null) found; the conformance tests need Node.js >= 20 (node-llama-cpp)" >&2
  fi
  # Conformance references (pinned): llama.cpp through node-llama-cpp, HF tokenizers and
  # Jinja in JavaScript, the official OpenAI client.
  cd "$here/tests/conformance"
  # npm install (not npm ci): the lock pins every version, and npm ci rejects a lock
  # that omits other platforms' optional prebuilt binaries of node-llama-cpp.
  npm install --no-audit --no-fund --loglevel=error
  # The browser tests' driver (puppeteer-core, pinned; it uses the chromium above).
  cd "$here/tests/browser"
  npm ci --no-audit --no-fund --loglevel=error
  # Structured outputs: ajv + ajv-formats validate every constrained output (pinned).
  cd "$here/tests/structured"
  npm ci --no-audit --no-fund --loglevel=error
fi
