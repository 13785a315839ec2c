#!/usr/bin/env bash
# Engine benchmark: throughput at 1/4/16 concurrent sequences and time to first token
# for 4K/32K prompts with prefill chunks 512/2048, on stories260K and on a randomly
# initialized TinyLlama-shaped model (1.1B, bf16) generated into a temporary folder.
# Printed only; not part of the test suite.
#
#   bench/runtime_bench.sh [BUILD_DIR]          (default: build-bench)
# Environment: THREADS (default: all cores), TINY_GEN / TINY_TTFT to shorten the
# TinyLlama runs, KEEP_MODEL=1 to keep the generated model, MODEL_TMP (default /tmp).
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
build="${1:-$here/build-bench}"
threads="${THREADS:-$(nproc)}"
cmake -S "$here" -B "$build" -G Ninja -DINFERA_BUILD_BENCH=ON >/dev/null
ninja -C "$build" -j2 runtime_bench >/dev/null
bench="$build/runtime_bench"

echo "== stories260K =="
"$bench" "$here/../shared/models/stories260K" --name stories260K --threads "$threads" \
  --prompt 32 --gen 128 --ttft "${STORIES_TTFT:-4096,32768}" --chunks 512,2048

py=python3
"$py" -c "import numpy" 2>/dev/null || py=/usr/bin/python3
tiny="$(mktemp -d "${MODEL_TMP:-/tmp}/infera-tinyllama.XXXXXX")"
if [[ "${KEEP_MODEL:-0}" != 1 ]]; then trap 'rm -rf "$tiny"' EXIT; fi
echo "== TinyLlama-shaped (random weights, generated into $tiny) =="
"$py" "$here/tools/gen_model.py" "$tiny" --preset tinyllama >/dev/null
"$bench" "$tiny" --name tinyllama-1.1B-random --threads "$threads" \
  --prompt 32 --gen "${TINY_GEN:-32}" --ttft "${TINY_TTFT:-4096,32768}" --chunks 512,2048
