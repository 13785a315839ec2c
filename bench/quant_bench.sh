#!/usr/bin/env bash
# Infera quantized schemes vs llama.cpp block formats on the same (random, TinyLlama-shaped)
# weights: prompt and generation tokens/s at 1 and 2 threads, and the fraction of the
# machine's memory bandwidth the decode reaches (weight bytes per token x tokens/s).
#
#   bench/quant_bench.sh [BUILD_DIR] [WORK_DIR]
#
# Needs: BUILD_DIR/infera, /usr/bin/python3 with numpy (tools/gen_model.py), node with
# tests/conformance/node_modules. Printed only; not a test. On a shared machine, run it
# when the machine is quiet and repeat: numbers move with other load.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
build="${1:-$repo/build}"
work="${2:-/tmp/infera_quant_bench}"
infera="$build/infera"
prompt_tokens="${PROMPT_TOKENS:-64}"
gen_tokens="${GEN_TOKENS:-32}"
mkdir -p "$work"
cd "$work"

[ -f tl/config.json ] || /usr/bin/python3 "$repo/tools/gen_model.py" tl --preset tinyllama
for s in w8a8 w4a8 w4a16; do
  # Embeddings/head quantized too (--embed-head scheme): the same tensors llama.cpp's
  # Q8_0/Q4_0 files quantize.
  [ -f "$s/config.json" ] || "$infera" quantize tl "$s" --scheme "$s" --group-size 32 --embed-head scheme > "$s.quantize.txt"
  tail -1 "$s.quantize.txt" | sed "s/^/$s: /"
done
for t in q8_0 q4_0; do
  [ -f "tl_$t.gguf" ] || "$infera" convert tl --to gguf "tl_$t.gguf" --type "$t"
done

prompt_ids="[1$(for i in $(seq 2 "$prompt_tokens"); do printf ',1000'; done)]"
bw="$("$infera" sysinfo 2>/dev/null | grep -io '[0-9.]* GB/s' | head -1 | grep -o '[0-9.]*' || true)"
printf '%-22s %7s %12s %12s %12s\n' "engine/format" threads "prompt t/s" "gen t/s" "GB/s (gen)"
for threads in 1 2; do
  for s in bf16 w8a8 w4a8 w4a16; do
    dir="$s"; [ "$s" = bf16 ] && dir=tl
    out="$("$infera" run -m "$dir" --prompt-ids "$prompt_ids" -n "$gen_tokens" --temp 0 --ignore-eos --json -t "$threads" 2>/dev/null)"
    p="$(echo "$out" | /usr/bin/python3 -c 'import json,sys; print("%.1f" % json.load(sys.stdin)["prompt_tokens_per_s"])')"
    g="$(echo "$out" | /usr/bin/python3 -c 'import json,sys; print("%.2f" % json.load(sys.stdin)["generated_tokens_per_s"])')"
    bytes="$(du -sb --apparent-size "$dir"/*.safetensors | awk '{s+=$1} END {print s}')"
    printf '%-22s %7s %12s %12s %12.1f\n' "infera $s" "$threads" "$p" "$g" "$(awk -v g="$g" -v b="$bytes" 'BEGIN {print g * b / 1e9}')"
  done
  for t in q8_0 q4_0; do
    out="$(node "$repo/bench/quant_llamacpp.mjs" "tl_$t.gguf" "$threads" "$prompt_tokens" "$gen_tokens")"
    p="$(echo "$out" | /usr/bin/python3 -c 'import json,sys; print("%.1f" % json.load(sys.stdin)["prompt_tokens_per_s"])')"
    g="$(echo "$out" | /usr/bin/python3 -c 'import json,sys; print("%.2f" % json.load(sys.stdin)["gen_tokens_per_s"])')"
    bytes="$(stat -c %s "tl_$t.gguf")"
    printf '%-22s %7s %12s %12s %12.1f\n' "llama.cpp $t" "$threads" "$p" "$g" "$(awk -v g="$g" -v b="$bytes" 'BEGIN {print g * b / 1e9}')"
  done
done
[ -n "$bw" ] && echo "machine bandwidth (infera sysinfo): $bw GB/s; roofline fraction = GB/s (gen) / that"
