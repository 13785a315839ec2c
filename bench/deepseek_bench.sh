#!/usr/bin/env bash
# DeepSeek benchmark (printed; not part of the test suite): KV bytes per token and decode
# time per token at 4K / 32K / 112K context for
#   v3       DeepSeek-V3's attention shape (MLA: hidden 7168, 128 heads, q_lora 1536,
#            kv_lora 512, qk_nope 128, qk_rope 64, v_head 128), absorbed decode;
#   gqa      a GQA model of the same hidden size and layer count (64 query heads and 8 KV
#            heads of 128, Llama-3-70B's ratio);
#   v32      DeepSeek-V3.2 (the same MLA plus the lightning indexer: 64 heads of 128,
#            index_topk 2048), sparse decode (DSA);
#   v32dense the same weights with index_topk beyond the context: dense MLA decode.
# Scaled down to what a small machine holds: LAYERS (default 1) decoder layers, each a
# dense SwiGLU layer of 2048 (no experts: the MoE part of a decode step does not depend on
# the context), vocabulary 1024; the attention of every layer is the real model's. The
# context is not prefilled: deepseek_bench fills the KV cache with random rows and times
# one-token steps at the context's end (bench/deepseek_bench.cpp).
#
#   bench/deepseek_bench.sh WORK_DIR [BUILD_DIR]     (BUILD_DIR default: build-bench)
#
# TTFT: BENCH_ARGS="--prefill 512" prefills each CTX for real in chunks of 512 tokens;
# BENCH_ARGS="--chunk-at 512 --ttft 4096,32768,114688" with CTX="0,2048,4096,32768,114688"
# times one 512-token chunk at each CTX position and estimates the TTFT of each --ttft
# length from them (bench/deepseek_bench.cpp says how).
#
# Environment: CTX (default "4096,32768,114688"), STEPS (3), THREADS (1), KV_DTYPE
# (bf16), LAYERS (1), MODELS ("v3 gqa v32 v32dense"), SMALL=1 (hidden 1024, 16 heads,
# kv_lora 128, indexer 8 heads of 64, index_topk 256: a smoke run). Models are generated
# under WORK_DIR and reused (about 0.4 GB each at the full shape). Run on a quiet machine:
# the load average is printed on every line.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
work="${1:?usage: bench/deepseek_bench.sh WORK_DIR [BUILD_DIR]}"
build="${2:-$repo/build-bench}"
ctx="${CTX:-4096,32768,114688}"
steps="${STEPS:-3}"
threads="${THREADS:-1}"
kv_dtype="${KV_DTYPE:-bf16}"
layers="${LAYERS:-1}"
models="${MODELS:-v3 gqa v32 v32dense}"
cmake -S "$repo" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DINFERA_BUILD_BENCH=ON >/dev/null
ninja -C "$build" -j2 deepseek_bench >/dev/null
bench="$build/deepseek_bench"
py=python3
"$py" -c "import numpy" 2>/dev/null || py=/usr/bin/python3

if [[ "${SMALL:-0}" == 1 ]]; then
  hidden=1024 mla="--heads 16 --q-lora-rank 256 --kv-lora-rank 128 --qk-nope-dim 64 --qk-rope-dim 32 --v-head-dim 64"
  gqa="--heads 8 --kv-heads 2" indexer="--index-heads 8 --index-head-dim 64 --index-topk 256" tag=small
else
  hidden=7168 mla="--heads 128 --q-lora-rank 1536 --kv-lora-rank 512 --qk-nope-dim 128 --qk-rope-dim 64 --v-head-dim 128"
  gqa="--heads 64 --kv-heads 8 --head-dim 128" indexer="--index-heads 64 --index-head-dim 128 --index-topk 2048" tag=full
fi
common="--hidden $hidden --layers $layers --ffn 2048 --vocab 1024 --dtype bf16 --max-pos 131072 --seed 1"
mkdir -p "$work"
gen() {  # gen NAME ARGS...: a generated model under WORK_DIR (kept for later runs)
  local dir="$work/$tag-L$layers-$1"
  shift
  [ -f "$dir/config.json" ] || "$py" "$repo/tools/gen_model.py" "$dir" "$@" >/dev/null
  echo "$dir"
}
# shellcheck disable=SC2086
v3=$(gen v3 --arch deepseek_v3 $common $mla --first-dense "$layers" --no-mtp)
# shellcheck disable=SC2086
v32=$(gen v32 --arch deepseek_v32 $common $mla $indexer --first-dense "$layers" --no-mtp)
# shellcheck disable=SC2086
gqa_dir=$(gen gqa --arch llama $common $gqa)
# Dense MLA on V3.2's weights: the same files, index_topk beyond any context.
dense="$work/$tag-L$layers-v32dense"
if [ ! -f "$dense/config.json" ]; then
  mkdir -p "$dense"
  for f in "$v32"/*; do [ "$(basename "$f")" = config.json ] || ln -sf "$f" "$dense/"; done
  "$py" - "$v32/config.json" "$dense/config.json" <<'EOF'
import json, sys
c = json.load(open(sys.argv[1]))
c["index_topk"] = 1 << 30
json.dump(c, open(sys.argv[2], "w"), indent=2)
EOF
fi

echo "machine: $(nproc) cores, $threads threads; KV cache $kv_dtype; $layers layer(s), hidden $hidden ($tag shapes)"
for m in $models; do
  case "$m" in
    v3) dir=$v3 ;;
    gqa) dir=$gqa_dir ;;
    v32) dir=$v32 ;;
    v32dense) dir=$dense ;;
    *) echo "unknown model '$m'" >&2; exit 2 ;;
  esac
  # shellcheck disable=SC2086
  "$bench" "$dir" --name "$m" --ctx "$ctx" --steps "$steps" --threads "$threads" --kv-dtype "$kv_dtype" ${BENCH_ARGS:-}
done
