#!/usr/bin/env bash
# Pre-quantized checkpoints (docs/quantization.md, "Pre-quantized checkpoints") against
# Infera's own scheme of the same bits on the same weights: prompt and generation tokens/s
# of each format as loaded (converted to the native schemes at load) next to `infera
# quantize`'s output of the float model.
#
#   bench/prequant_bench.sh [BUILD_DIR] [WORK_DIR]        (BUILD_DIR: absolute or repo-relative)
#
# Pairs (format -> what it runs as, and the native checkpoint it is compared with):
#   fp8-block        -> W8A8 (requantized per row)              vs infera w8a8
#   fp8-block/w8a16  -> W8A16 (e4m3 decoded in the kernel)      vs infera w8a8
#   ct-w8a8          -> W8A8 (int8 in place)                    vs infera w8a8
#   slim-w8a8-dyn    -> W8A8 (msModelSlim W8A8_DYNAMIC in place) vs infera w8a8
#   ct-w4a16         -> W4A16 g128 (exact)                      vs infera w4a16 g128
#   ct-w4a16-asym    -> W4A16 g128 (exact, zeros as a term)     vs infera w4a16 g128
#   gptq, awq        -> W4A16 g128 (exact, AWQ zeros as a term) vs infera w4a16 g128
#   gptq/w4a8        -> W4A8 g128 (INFERA_PREQUANT_SCHEME=w4a8) vs infera w4a8 g128
#   slim-w4a8        -> W4A8 g128 (msModelSlim W4A8_DYNAMIC)     vs infera w4a8 g128
# Models: SHAPE=tinyllama (tools/gen_model.py --preset tinyllama, 1.1B) and a Qwen3-MoE shape
# (MOE_ARGS); SHAPE=medium the same widths with 4 layers; SHAPE=small a 4-layer, 512-wide
# llama instead (a quick check). Environment:
# PROMPT_TOKENS (64), GEN_TOKENS (32), REPEATS (2: best of), THREADS (2), MODELS ("llama moe").
# Needs BUILD_DIR/infera and /usr/bin/python3 with numpy. Printed only; not a test; on a shared
# machine run it at low load and repeat. The goal (issue 19): a loaded format within 10% of
# the native scheme of the same bits.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
build="${1:-$repo/build}"
case "$build" in /*) ;; *) build="$(pwd)/$build" ;; esac
work="${2:-/tmp/infera_prequant_bench}"
infera="$build/infera"
prompt_tokens="${PROMPT_TOKENS:-64}"
gen_tokens="${GEN_TOKENS:-32}"
repeats="${REPEATS:-2}"
threads="${THREADS:-2}"
shape="${SHAPE:-tinyllama}"
models="${MODELS:-llama moe}"
py=/usr/bin/python3
[ -x "$infera" ] || { echo "error: $infera not found (build the infera target, pass BUILD_DIR)" >&2; exit 1; }
mkdir -p "$work"
cd "$work"

if [ "$shape" = tinyllama ]; then
  llama_args="--preset tinyllama"
  moe_args="${MOE_ARGS:---arch qwen3_moe --hidden 1024 --layers 8 --heads 16 --kv-heads 4 --head-dim 64 --experts 32 --experts-per-tok 4 --moe-ffn 512 --vocab 8192}"
elif [ "$shape" = medium ]; then  # the same widths, 4 layers: each run a few seconds
  llama_args="--preset tinyllama --layers 4"
  moe_args="${MOE_ARGS:---arch qwen3_moe --hidden 1024 --layers 4 --heads 16 --kv-heads 4 --head-dim 64 --experts 32 --experts-per-tok 4 --moe-ffn 512 --vocab 8192}"
else
  llama_args="--arch llama --hidden 512 --layers 4 --heads 8 --kv-heads 4 --head-dim 64 --ffn 1536 --vocab 2048"
  moe_args="${MOE_ARGS:---arch qwen3_moe --hidden 512 --layers 4 --heads 8 --kv-heads 4 --head-dim 64 --experts 16 --experts-per-tok 2 --moe-ffn 256 --vocab 2048}"
fi

field() { $py -c "import json,sys; print(json.load(sys.stdin)[sys.argv[1]])" "$1"; }
best() { $py -c "import sys; print(max(float(v) for v in sys.argv[1:]))" "$@"; }
prompt_ids="[1$(for i in $(seq 2 "$prompt_tokens"); do printf ',5'; done)]"

echo "shape $shape, $prompt_tokens-token prompt, $gen_tokens generated, $threads thread(s), best of $repeats"
echo "load average: $(uptime | sed 's/.*load average: //'), kernel path: $("$infera" sysinfo 2>/dev/null | sed -n 's/^kernel path: *//p')"
printf '%-10s %-22s %10s %9s %9s %9s\n' model checkpoint "prompt t/s" "vs native" "gen t/s" "vs native"
for m in $models; do
  src="${shape}_$m"
  args="$llama_args"; [ "$m" = moe ] && args="$moe_args"
  # shellcheck disable=SC2086  # args is a list of options
  [ -f "$src/config.json" ] || $py "$repo/tools/gen_model.py" "$src" $args --dtype bf16 > /dev/null
  for n in w8a8 w4a16 w4a8; do
    g=32; [ "$n" != w8a8 ] && g=128
    [ -f "${src}_native_$n/config.json" ] || "$infera" quantize "$src" "${src}_native_$n" --scheme "$n" --group-size "$g" > /dev/null
  done
  for f in fp8-block ct-w8a8 ct-w4a16; do
    [ -f "${src}_$f/config.json" ] || $py "$repo/tools/prequant_write.py" "$src" "${src}_$f" --format "$f" > /dev/null
  done
  [ -f "${src}_ct-w4a16-asym/config.json" ] ||
    $py "$repo/tools/prequant_write.py" "$src" "${src}_ct-w4a16-asym" --format ct-w4a16 --asym > /dev/null
  for f in gptq awq slim-w8a8-dynamic slim-w4a8; do
    [ -f "${src}_$f/config.json" ] || $py "$repo/tools/prequant_write_gptq_awq_slim.py" "$src" "${src}_$f" --format "$f" --group-size 128 > /dev/null
  done
  declare -A ps gs
  # checkpoint|environment|native reference
  runs="native_w8a8|-|native_w8a8 fp8-block|-|native_w8a8 fp8-block|INFERA_PREQUANT_FP8=w8a16|native_w8a8
        ct-w8a8|-|native_w8a8 slim-w8a8-dynamic|-|native_w8a8 native_w4a16|-|native_w4a16 ct-w4a16|-|native_w4a16
        ct-w4a16-asym|-|native_w4a16 gptq|-|native_w4a16 awq|-|native_w4a16 native_w4a8|-|native_w4a8 gptq|INFERA_PREQUANT_SCHEME=w4a8|native_w4a8
        slim-w4a8|-|native_w4a8"
  for r in $(seq "$repeats"); do
    for run in $runs; do
      IFS='|' read -r c e _ <<< "$run"
      [ "$e" = - ] && e=INFERA_BENCH_UNUSED=1
      out="$(env "$e" "$infera" run -m "${src}_$c" --prompt-ids "$prompt_ids" -n "$gen_tokens" --temp 0 --ignore-eos --json -t "$threads" 2>/dev/null)"
      ps[$run]+=" $(echo "$out" | field prompt_tokens_per_s)"; gs[$run]+=" $(echo "$out" | field generated_tokens_per_s)"
    done
  done
  for run in $runs; do
    IFS='|' read -r c e ref <<< "$run"
    label="$c"; [ "$e" != - ] && label="$c/${e#*=}"
    refrun="$ref|-|$ref"
    # shellcheck disable=SC2086
    p="$(best ${ps[$run]})"; g="$(best ${gs[$run]})"; rp="$(best ${ps[$refrun]})"; rg="$(best ${gs[$refrun]})"
    $py -c "import sys; m,c,p,g,rp,rg=sys.argv[1:]; p,g,rp,rg=map(float,(p,g,rp,rg)); print('%-10s %-22s %10.1f %8.2fx %9.2f %8.2fx' % (m, c, p, p/rp, g, g/rg))" \
      "$m" "$label" "$p" "$g" "$rp" "$rg"
  done
  unset ps gs
done
