#!/usr/bin/env bash
# Speculative decoding benchmark (printed, not a test; docs/speculative.md has a run):
#   1. n-gram drafts on stories260K (trained) with story text that repeats itself;
#   2. n-gram drafts on a generated Llama (TinyLlama-shaped with TINY=1, else a 52M one)
#      with the prompt P + its own greedy continuation + P, then oracle drafts of known
#      accuracy on the same model (speedup of the verify path at a given acceptance);
#   3. MTP drafts on a generated qwen3_5_moe (random weights: a random MTP head rarely
#      agrees with the trunk, so this measures the cost of drafting and verifying);
#   4. MTP drafts (and n-gram) on the built-in trained hybrid, models/infera-default,
#      when it exists.
# Every row also checks that the tokens equal the non-speculative run (greedy).
#
#   bench/spec_bench.sh [BUILD_DIR]     (default: build-bench)
# Environment: THREADS (default: all cores), GEN (generated tokens, default 64),
# TINY=1 for the 1.1B TinyLlama preset, MODEL_TMP (default /tmp).
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
build="${1:-$here/build-bench}"
threads="${THREADS:-$(nproc)}"
gen="${GEN:-64}"
cmake -S "$here" -B "$build" -G Ninja -DINFERA_BUILD_BENCH=ON >/dev/null
ninja -C "$build" -j2 spec_bench >/dev/null
bench="$build/spec_bench"
py=python3
"$py" -c "import numpy" 2>/dev/null || py=/usr/bin/python3
tmp="$(mktemp -d "${MODEL_TMP:-/tmp}/infera-spec.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
story="Once upon a time, there was a little girl named Lily. She liked to play in the park. Once upon a time, there was a little girl named Lily. She liked to"

"$bench" "$here/../shared/models/stories260K" --name stories260K --method ngram --k 1,2,4 --gen "$gen" \
  --threads 1 --text "$story"

if [[ "${TINY:-0}" == 1 ]]; then
  "$py" "$here/tools/gen_model.py" "$tmp/llama" --preset tinyllama >/dev/null
  name=tinyllama-1.1B-random
else
  "$py" "$here/tools/gen_model.py" "$tmp/llama" --arch llama --hidden 512 --layers 8 --heads 8 --kv-heads 4 \
    --ffn 1408 --vocab 32000 --dtype bf16 --seed 3 >/dev/null
  name=llama-52M-random
fi
"$bench" "$tmp/llama" --name "$name" --method ngram --k 2,4 --gen "$gen" --threads "$threads" --self-repeat --prompt 24
# A random model does not repeat its context, so prompt lookup finds (almost) nothing to
# draft above; the verify machinery's speedup at known per-token draft accuracies:
for p in 0.6 0.9; do
  "$bench" "$tmp/llama" --name "$name" --k 1,2,4 --gen "$gen" --threads "$threads" --prompt 24 --oracle "$p"
done
rm -rf "$tmp/llama"

"$py" "$here/tools/gen_model.py" "$tmp/hybrid" --arch qwen3_5_moe --hidden 512 --layers 8 --heads 8 --kv-heads 2 \
  --head-dim 64 --experts 16 --experts-per-tok 2 --moe-ffn 256 --shared-ffn 512 --vocab 32000 --dtype bf16 --seed 7 >/dev/null
"$bench" "$tmp/hybrid" --name qwen3_5_moe-random --method mtp --k 1,2,3 --gen "$gen" --threads "$threads" --prompt 24

default_hybrid="$here/models/infera-default"
if [[ -d "$default_hybrid" ]]; then
  text="In the beginning God created the heaven and the earth. And the earth was without form, and void"
  "$bench" "$default_hybrid" --name infera-default --method mtp --k 1,2,3 --gen "$gen" --threads 1 --text "$text"
  "$bench" "$default_hybrid" --name infera-default --method ngram --k 2,4 --gen "$gen" --threads 1 --text "$text"
else
  echo "(models/infera-default not found: no trained MTP head to measure)"
fi
