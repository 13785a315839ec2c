#!/usr/bin/env bash
# Infera vs llama.cpp on the SAME GGUF files (`infera run -m FILE.gguf` against node-llama-cpp
# 3.22.1 loading that file): prompt and generation tokens/s per tensor type and thread count,
# and the Infera / llama.cpp ratios. The ISA path Infera's kernels take is printed first.
#
#   bench/gguf_bench.sh [BUILD_DIR] [WORK_DIR]
#
# Environment: MODEL_ARGS (tools/gen_model.py shape; default "--preset tinyllama"; SHAPE=moe
# picks a Qwen3-30B-A3B-like MoE instead: 64 experts / 8 active, expert FFN 768, 6 layers),
# LAYERS (decoder layers of the default shapes: TinyLlama's 22, the MoE's 6; e.g. LAYERS=4 for
# a quick run whose lm_head is a third of the weights; WORK_DIR should then differ per depth),
# TYPES ("q4_k_m q6_k q8_0": f32 f16 bf16 q8_0 q4_0 are written by `infera convert --to gguf`,
# q2_k q3_k_m q4_k_m q5_k_m q6_k iq4_xs by llama.cpp's own llama_model_quantize from the f16 file, through
# tests/conformance/llama_quantize.c and the libllama node-llama-cpp ships), PROMPT_TOKENS (64),
# GEN_TOKENS (32), THREADS ("1 2"), REPEATS (2: best of, engines alternating), MMAP (1; 0
# passes --no-mmap: Infera's weights read into memory before its prompt is timed, as
# llama.cpp's repacked weights are, so page faults of a first touch are not in its prompt time).
# NO_AMX=1 compares the two engines without AMX on a CPU that has it: Infera with INFERA_AMX=0,
# llama.cpp from an overlay of tests/conformance/node_modules in WORK_DIR without its
# sapphirerapids CPU variant (the one with ggml's AMX repacking), so it loads its next best
# (AVX-512 VNNI / BF16). AVX2=1 compares them on AVX2 alone: Infera with INFERA_ISA=avx2,
# llama.cpp from an overlay without any variant that has AVX-512 or AVX-VNNI (so its haswell
# one); AVX2=vnni keeps its alderlake variant (AVX-VNNI), for a CPU that has AVX-VNNI. The
# llama.cpp CPU variant loaded is printed.
# Printed only; not a test. Numbers move with other load on a shared machine: the load
# average is printed before and after.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
build="${1:-$repo/build}"
case "$build" in /*) ;; *) build="$(pwd)/$build" ;; esac
work="${2:-/tmp/infera_gguf_bench}"
infera="$build/infera"
if [ "${SHAPE:-}" = moe ]; then
  default_args="--arch qwen3_moe --hidden 2048 --layers 6 --heads 32 --kv-heads 4 --head-dim 128 --experts 64 \
--experts-per-tok 8 --moe-ffn 768 --vocab 32000 --dtype bf16 --seed 12"
else
  default_args="--preset tinyllama"
fi
[ -n "${LAYERS:-}" ] && default_args="$default_args --layers $LAYERS"
model_args="${MODEL_ARGS:-$default_args}"
types="${TYPES:-q4_k_m q6_k q8_0}"
prompt_tokens="${PROMPT_TOKENS:-64}"
gen_tokens="${GEN_TOKENS:-32}"
threads_list="${THREADS:-1 2}"
repeats="${REPEATS:-2}"
mmap_flag=()
[ "${MMAP:-1}" = 0 ] && mmap_flag=(--no-mmap)
py=/usr/bin/python3
[ -x "$infera" ] || { echo "error: $infera not found (build the infera target, pass BUILD_DIR)" >&2; exit 1; }
mkdir -p "$work"
cd "$work"
# shellcheck disable=SC2086
[ -f model/config.json ] || $py "$repo/tools/gen_model.py" model $model_args > /dev/null
libllama="$repo/tests/conformance/node_modules/@node-llama-cpp/linux-x64/bins/linux-x64/libllama.v0.5.0.so"
llama_ftype() {  # llama.cpp's llama_ftype numbers
  case "$1" in q2_k) echo 10 ;; q3_k_m) echo 12 ;; q4_k_m) echo 15 ;; q5_k_m) echo 17 ;; q6_k) echo 18 ;; iq4_xs) echo 30 ;; *) echo "" ;; esac
}
for t in $types; do
  [ -f "model_$t.gguf" ] && continue
  ft="$(llama_ftype "$t")"
  if [ -z "$ft" ]; then
    "$infera" convert model --to gguf "model_$t.gguf" --type "$t" > /dev/null
    continue
  fi
  [ -f model_f16.gguf ] || "$infera" convert model --to gguf model_f16.gguf --type f16 > /dev/null
  [ -x llama_quantize ] || cc -O1 -o llama_quantize "$repo/tests/conformance/llama_quantize.c" -ldl
  ./llama_quantize "$libllama" model_f16.gguf "model_$t.gguf" "$ft" > "quantize_$t.log" 2>&1 ||
    { echo "error: llama_model_quantize to $t failed (quantize_$t.log)" >&2; exit 1; }
done
prompt="$($py -c "
s = 7; ids = []
for _ in range($prompt_tokens):
    s = (s * 1103515245 + 12345) % 2147483648; ids.append(300 + s % 20000)
print(ids)")"
field() { $py -c "import json,sys; print(json.loads(sys.stdin.read().strip().splitlines()[-1])[sys.argv[1]])" "$1"; }
best() { $py -c "import sys; print(max(float(v) for v in sys.argv[1:]))" "$@"; }

# shellcheck source=bench/llama_overlay.sh
source "$repo/bench/llama_overlay.sh"
if [ "${AVX2:-0}" != 0 ]; then
  avx2_only
elif [ "${NO_AMX:-0}" = 1 ]; then
  export INFERA_AMX=0
  llama_overlay nlc_noamx sapphirerapids
fi
first_type="${types%% *}"
echo "llama.cpp $(llama_variant "model_$first_type.gguf")"
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "infera weights: $([ "${MMAP:-1}" = 0 ] && echo "read into memory (--no-mmap)" || echo mapped)"
"$infera" sysinfo 2>/dev/null | grep -i -E "^(cpu features|kernel path|bf16 matmul|f16 matmul|gguf matmul|quantized matmul)" || true
$py -c "import json; c = json.load(open('model/config.json')); print('model:', c['model_type'], 'hidden', c['hidden_size'], \
'layers', c['num_hidden_layers'], 'experts', c.get('num_experts', 0), 'vocab', c['vocab_size'])"
# Generation against the read roofline: the weight bytes a token reads (Infera's
# weight_bytes_per_token; llama.cpp reads the same tensors of the same file) times tokens/s,
# against `infera sysinfo --bandwidth` at that thread count, measured in each repeat beside the
# two engines' runs (this figure moves from run to run on a shared machine; best of each).
printf "%-6s %-7s %14s %14s %14s %14s %9s %9s %11s %11s %11s %8s %8s\n" type threads "infera pp t/s" \
  "llama pp t/s" "infera tg t/s" "llama tg t/s" "pp ratio" "tg ratio" "infera GB/s" "llama GB/s" "probe GB/s" \
  "infera %" "llama %"
for t in $types; do
  for th in $threads_list; do
    ipp=(); itg=(); lpp=(); ltg=(); probe=()
    for _ in $(seq "$repeats"); do
      out="$("$infera" run -m "model_$t.gguf" --prompt-ids "$prompt" -n "$gen_tokens" --temp 0 --ignore-eos --json \
        -t "$th" "${mmap_flag[@]}" 2> /dev/null)"
      ipp+=("$(echo "$out" | field prompt_tokens_per_s)")
      itg+=("$(echo "$out" | field generated_tokens_per_s)")
      bytes="$(echo "$out" | field weight_bytes_per_token)"
      out="$("${nlc_node[@]}" "$repo/bench/llamacpp_speed.mjs" "$work/model_$t.gguf" "$th" "$prompt_tokens" "$gen_tokens")"
      lpp+=("$(echo "$out" | field prompt_tokens_per_s)")
      ltg+=("$(echo "$out" | field generated_tokens_per_s)")
      probe+=("$("$infera" sysinfo --bandwidth --json 2> /dev/null | $py -c \
        "import json,sys; print(json.load(sys.stdin)['read_bandwidth_gbs'][sys.argv[1]])" "$th")")
    done
    a="$(best "${ipp[@]}")" b="$(best "${lpp[@]}")" c="$(best "${itg[@]}")" d="$(best "${ltg[@]}")"
    e="$(best "${probe[@]}")"
    $py -c "import sys; a,b,c,d,e,n=map(float,sys.argv[3:]); g,h=n*c/1e9,n*d/1e9; print(f'{sys.argv[1]:<6} {sys.argv[2]:<7} \
{a:14.2f} {b:14.2f} {c:14.2f} {d:14.2f} {a/b:8.2f}x {c/d:8.2f}x {g:11.1f} {h:11.1f} {e:11.1f} {100*g/e:7.0f}% {100*h/e:7.0f}%')" \
      "$t" "$th" "$a" "$b" "$c" "$d" "$e" "$bytes"
  done
done
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
