#!/usr/bin/env bash
# DeepSeek speed against llama.cpp on the same weights: Infera W4A8 vs llama.cpp Q4_0
# (and W8A8 vs Q8_0 with SCHEMES="w4a8 w8a8"), prompt processing and generation tokens/s
# at 1 and 2 threads, best of REPEATS runs with the engines alternating.
#
# The model is a generated deepseek_v3 checkpoint small enough for a small machine, with
# DeepSeek-V2-Lite's attention (16 heads, kv_lora 512, qk_nope 128, qk_rope 64, v_head 128,
# hidden 2048) plus a q_lora of 768 (llama.cpp's deepseek2 takes a checkpoint without q_lora
# only at V2-Lite's 26-27 layers), 6 layers (the first dense, SwiGLU 5632), 64 routed
# experts of 768 with 6 active and 2 shared, sigmoid routing, vocabulary 32000, bf16:
# about 1.7 B parameters, 0.23 B active per token.
# Infera's side is `infera quantize --scheme w4a8 --recipe uniform --group-size 32
# --embed-head scheme` (every quantizable matrix in the scheme, as Q4_0 puts them; the
# router, norms and kv_b_proj stay float: docs/quantization.md); llama.cpp's is
# `infera convert --to gguf --type q4_0` (deepseek2, kv_b split into attn_k_b / attn_v_b,
# both Q4_0), run through node-llama-cpp (bench/quant_llamacpp.mjs).
#
#   bench/deepseek_llamacpp.sh WORK_DIR [BUILD_DIR]      (BUILD_DIR default: build)
#
# Environment: THREADS ("1 2"), PROMPT (128), GEN (32), REPEATS (2), SCHEMES ("w4a8"),
# LAYERS (6), EXPERTS (64), SMALL=1 (hidden 512, 2 layers, 8 experts: a smoke run).
# Models are generated under WORK_DIR and reused (about 3.5 GB bf16 + 1 GB per quantized
# copy). Printed only; not a test. Run on a quiet machine: the load average is printed on
# every line.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
work="${1:?usage: bench/deepseek_llamacpp.sh WORK_DIR [BUILD_DIR]}"
build="$(cd "${2:-$repo/build}" && pwd)"
infera="$build/infera"
[ -x "$infera" ] || { echo "no infera binary at $infera (build it, or pass BUILD_DIR)" >&2; exit 1; }
py=python3
"$py" -c "import numpy" 2>/dev/null || py=/usr/bin/python3
threads_list="${THREADS:-1 2}"
prompt_n="${PROMPT:-128}"
gen_n="${GEN:-32}"
repeats="${REPEATS:-2}"
schemes="${SCHEMES:-w4a8}"
if [[ "${SMALL:-0}" == 1 ]]; then
  name=dsl-small shape="--hidden 512 --layers 2 --heads 4 --q-lora-rank 128 --experts 8 --experts-per-tok 2 --moe-ffn 256 --ffn 1024 --vocab 4096"
else
  name=dsl shape="--hidden 2048 --layers ${LAYERS:-6} --heads 16 --q-lora-rank 768 --experts ${EXPERTS:-64} \
--experts-per-tok 6 --moe-ffn 768 --ffn 5632 --vocab 32000"
fi
mkdir -p "$work"
cd "$work"
echo "machine: $(nproc) cores; $(uptime)"
# shellcheck disable=SC2086
[ -f "$name/config.json" ] || "$py" "$repo/tools/gen_model.py" "$name" --arch deepseek_v3 --dtype bf16 $shape \
  --kv-lora-rank 512 --qk-nope-dim 128 --qk-rope-dim 64 --v-head-dim 128 --n-shared 2 --first-dense 1 \
  --max-pos 4096 --seed 21 --no-mtp >/dev/null
ref_of() { case "$1" in w8a8) echo q8_0 ;; *) echo q4_0 ;; esac; }
formats=""
for s in $schemes; do
  [ -f "${name}_$s/config.json" ] || "$infera" quantize "$name" "${name}_$s" --scheme "$s" --recipe uniform \
    --group-size 32 --embed-head scheme >"${name}_$s.quantize.txt" 2>/dev/null
  f="$(ref_of "$s")"
  [[ " $formats " == *" $f "* ]] || formats="$formats $f"
done
for f in $formats; do
  [ -f "${name}_$f.gguf" ] || "$infera" convert "$name" "${name}_$f.gguf" --to gguf --type "$f" >/dev/null
done

json_field() { "$py" -c "import json,sys; d=json.load(sys.stdin); print($1)"; }
prompt_ids="[1$(for _ in $(seq 2 "$prompt_n"); do printf ',1000'; done)]"
load() { cut -d' ' -f1-3 /proc/loadavg; }
echo "$name: $prompt_n-token prompt, $gen_n generated, best of $repeats (engines alternating); ISA path: $("$infera" sysinfo --json 2>/dev/null | json_field "d['kernel_path']" 2>/dev/null || echo '?')"
printf '%-16s %3s %11s %9s %9s %9s  %s\n' "engine/format" thr "prompt t/s" "gen t/s" "prompt x" "gen x" "(load after)"
for threads in $threads_list; do
  declare -A gen=() prompt=()
  for _ in $(seq "$repeats"); do
    for f in $formats; do
      out="$(node "$repo/bench/quant_llamacpp.mjs" "${name}_$f.gguf" "$threads" "$prompt_n" "$gen_n")"
      p="$(echo "$out" | json_field "d['prompt_tokens_per_s']")"
      g="$(echo "$out" | json_field "d['gen_tokens_per_s']")"
      prompt[$f]="$("$py" -c "print(max(float(x) for x in '$p ${prompt[$f]:-0}'.split()))")"
      gen[$f]="$("$py" -c "print(max(float(x) for x in '$g ${gen[$f]:-0}'.split()))")"
    done
    for s in $schemes; do
      out="$("$infera" run -m "${name}_$s" --prompt-ids "$prompt_ids" -n "$gen_n" --temp 0 --ignore-eos --json \
        -t "$threads" 2>/dev/null | tail -1)"
      p="$(echo "$out" | json_field "d['prompt_tokens_per_s']")"
      g="$(echo "$out" | json_field "d['generated_tokens_per_s']")"
      prompt[$s]="$("$py" -c "print(max(float(x) for x in '$p ${prompt[$s]:-0}'.split()))")"
      gen[$s]="$("$py" -c "print(max(float(x) for x in '$g ${gen[$s]:-0}'.split()))")"
    done
  done
  for f in $formats; do
    printf '%-16s %3s %11.1f %9.2f %9s %9s  %s\n' "llama.cpp $f" "$threads" "${prompt[$f]}" "${gen[$f]}" "" "" "$(load)"
  done
  for s in $schemes; do
    f="$(ref_of "$s")"
    printf '%-16s %3s %11.1f %9.2f %8.2fx %8.2fx  %s\n' "infera $s" "$threads" "${prompt[$s]}" "${gen[$s]}" \
      "$("$py" -c "print(${prompt[$s]} / ${prompt[$f]})")" "$("$py" -c "print(${gen[$s]} / ${gen[$f]})")" "$(load)"
  done
  unset gen prompt
done
echo "x: Infera / llama.cpp (w4a8 vs q4_0, w8a8 vs q8_0). Goals (issue 17): generation >= 1.3x, prompt >= 1.5x."
