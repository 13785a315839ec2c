#!/usr/bin/env bash
# Engine benchmark (printed; not part of the test suite):
#  1. throughput at 1/4/16 concurrent sequences on stories260K and on a randomly
#     initialized TinyLlama-shaped model (1.1B, bf16);
#  2. long context on a small generated model (llama, 2 layers, hidden 256, GQA 2 query
#     heads / 1 KV head of 64, max_position_embeddings 131072): time to first token of
#     4K, 32K and 112K-token prompts with prefill chunks 512 and 2048, TTFT per prompt
#     token, and the peak RSS of each run next to the planner's estimate (model/planner.h:
#     weights + KV + activations + runtime reserve) with the ratio; one process per run, so
#     each peak is that run's alone. Then a fit TTFT(L) = a L + b L^2 (linear work plus
#     causal attention) through the two shorter lengths, and the longest length measured
#     against its prediction;
#  3. KV cache dtype at 32K: f32 / bf16 / int8 prefill, decode ms per token over the whole
#     cache, peak memory.
#
#   bench/runtime_bench.sh [BUILD_DIR]          (default: build-bench)
# Environment: THREADS (default: all cores); PARTS (default "throughput long kvdtype");
# LONG_LENGTHS (default "4096 32768 114688"), LONG_CHUNKS (default "512 2048");
# TINY_GEN (TinyLlama generated tokens per sequence, default 32), TINY_TTFT (TinyLlama
# long prompts, default none: minutes per prompt); KEEP_MODEL=1 keeps the generated models;
# MODEL_TMP (default /tmp).
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
build="${1:-$here/build-bench}"
threads="${THREADS:-$(nproc)}"
parts="${PARTS:-throughput long kvdtype}"
long_lengths="${LONG_LENGTHS:-4096 32768 114688}"
long_chunks="${LONG_CHUNKS:-512 2048}"
cmake -S "$here" -B "$build" -G Ninja -DINFERA_BUILD_BENCH=ON >/dev/null
ninja -C "$build" -j2 runtime_bench >/dev/null
bench="$build/runtime_bench"

py=python3
"$py" -c "import numpy" 2>/dev/null || py=/usr/bin/python3
tmp="$(mktemp -d "${MODEL_TMP:-/tmp}/infera-runtime-bench.XXXXXX")"
if [[ "${KEEP_MODEL:-0}" != 1 ]]; then trap 'rm -rf "$tmp"' EXIT; fi
has() { [[ " $parts " == *" $1 "* ]]; }
load() { echo "# load: $(uptime | sed 's/.*load average/load average/')"; }

if has throughput; then
  echo "== stories260K =="
  load
  "$bench" "$here/../shared/models/stories260K" --name stories260K --threads "$threads" \
    --prompt 32 --gen 128 --ttft "${STORIES_TTFT:-}" --chunks 512,2048
  echo
  echo "== TinyLlama-shaped (random weights, generated into $tmp/tinyllama) =="
  "$py" "$here/tools/gen_model.py" "$tmp/tinyllama" --preset tinyllama >/dev/null
  load
  "$bench" "$tmp/tinyllama" --name tinyllama-1.1B-random --threads "$threads" \
    --prompt 32 --gen "${TINY_GEN:-32}" --ttft "${TINY_TTFT:-}" --chunks 512,2048
  echo
fi

if has long || has kvdtype; then
  "$py" "$here/tools/gen_model.py" "$tmp/long" --arch llama --layers 2 --hidden 256 --heads 2 --kv-heads 1 \
    --head-dim 64 --ffn 768 --vocab 512 --dtype f32 --max-pos 131072 >/dev/null
fi

if has long; then
  echo "== long context: llama 2 layers, hidden 256, 2 query heads / 1 KV head x 64, f32 (generated into $tmp/long) =="
  rows="$tmp/long_rows.txt"
  : >"$rows"
  header_done=0
  for len in $long_lengths; do
    for chunk in $long_chunks; do
      out="$("$bench" "$tmp/long" --name long --threads "$threads" --concurrency "" --ttft "$len" --chunks "$chunk")"
      if [[ $header_done == 0 ]]; then
        echo "$out" | grep -E '^(#|##|prompt)'
        header_done=1
      fi
      row="$(echo "$out" | tail -1)"
      echo "$row   [$(uptime | sed 's/.*load average: //')]"
      echo "$row" >>"$rows"
    done
  done
  echo
  echo "## TTFT growth: fit T(L) = a L + b L^2 through the two shortest lengths (per chunk), longest against it;"
  echo "## on wall time (TTFT) and on the process's CPU time (less sensitive to a loaded machine)"
  for chunk in $long_chunks; do
    for col in 3 7; do
      awk -v chunk="$chunk" -v col="$col" '
        $2 == chunk { n++; L[n] = $1; T[n] = $col }
        END {
          what = col == 3 ? "wall" : "cpu "
          if (n < 3) { print "chunk " chunk ": need three lengths"; exit }
          # a L1 + b L1^2 = T1, a L2 + b L2^2 = T2
          det = L[1] * L[2] * L[2] - L[2] * L[1] * L[1]
          b = (L[1] * T[2] - L[2] * T[1]) / det
          a = (T[1] - b * L[1] * L[1]) / L[1]
          pred = a * L[n] + b * L[n] * L[n]
          printf "chunk %-5d %s: a = %.1f us/token, b = %.3g us/token^2; %d tokens: predicted %.0f ms, measured %.0f ms, ratio %.2f (<= ~1.1: linear plus attention)\n",
                 chunk, what, a * 1e3, b * 1e3, L[n], pred, T[n], T[n] / pred
        }' "$rows"
    done
  done
  echo
fi

if has kvdtype; then
  echo "== KV cache dtype: 32K-token prompt, chunk 2048, then 32 decode steps over the cache (same model) =="
  for dtype in f32 bf16 int8; do
    out="$("$bench" "$tmp/long" --name long --threads "$threads" --concurrency "" --ttft 32768 --chunks 2048 \
      --ttft-gen 33 --kv-dtype "$dtype")"
    [[ $dtype == f32 ]] && echo "$out" | grep -E '^prompt'
    echo "$(echo "$out" | tail -1)   kv $dtype [$(uptime | sed 's/.*load average: //')]"
  done
fi
