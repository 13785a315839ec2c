#!/usr/bin/env bash
# Infera vs llama.cpp on the same weights, side by side, in one run (issue: engine
# foundation benchmark). Generates a TinyLlama-shaped model (hidden 2048, 22 layers, 32
# heads, 4 KV heads, FFN 5632, vocab 32000, bf16), converts it to GGUF bf16 (same bits per
# weight), and prints prompt processing (512-token prompt) and generation (128 tokens)
# tokens/s at 1 and 2 threads for both engines, the ratios, and Infera's generation speed
# as a fraction of the memory-bandwidth roofline (measured bandwidth / weight bytes read
# per token).
#
#   bench/compare_llamacpp.sh [WORK_DIR]      (default: /tmp/infera-bench; ~2.5 GB)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
work=${1:-/tmp/infera-bench}
infera="$root/build/infera"
python=python3
/usr/bin/python3 -c "import numpy" 2>/dev/null && python=/usr/bin/python3
mkdir -p "$work"
model="$work/tinyllama-bf16"
gguf="$work/tinyllama-bf16.gguf"
[ -f "$model/config.json" ] || "$python" "$root/tools/gen_model.py" "$model" --preset tinyllama >/dev/null
[ -f "$gguf" ] || "$infera" convert "$model" --to gguf "$gguf" --type bf16 >/dev/null
PP=${PP:-512}
TG=${TG:-128}
ids=$("$python" -c "
s=7; out=[]
for _ in range($PP):
    s=(s*1103515245+12345)%2147483648; out.append(300+s%20000)
print(out)")
bw=$("$infera" sysinfo --bandwidth --json)
weights_per_token=$("$python" -c "
import json; c=json.load(open('$model/config.json'))
H=c['hidden_size']; F=c['intermediate_size']; L=c['num_hidden_layers']; V=c['vocab_size']
nh=c['num_attention_heads']; nkv=c['num_key_value_heads']; hd=H//nh
per_layer = H*nh*hd + 2*H*nkv*hd + nh*hd*H + 3*H*F
print((L*per_layer + V*H) * 2)")
printf '%-8s %-8s %14s %14s\n' engine threads "prompt tok/s" "gen tok/s"
declare -A res
for t in 1 2; do
  j=$("$infera" run -m "$model" --prompt-ids "$ids" -n "$TG" --temp 0 --ignore-eos --json -t "$t" 2>/dev/null | tail -1)
  res[infera_pp_$t]=$(echo "$j" | "$python" -c "import json,sys; print(json.load(sys.stdin)['prompt_tokens_per_s'])")
  res[infera_tg_$t]=$(echo "$j" | "$python" -c "import json,sys; print(json.load(sys.stdin)['generated_tokens_per_s'])")
  printf '%-8s %-8s %14.1f %14.2f\n' infera "$t" "${res[infera_pp_$t]}" "${res[infera_tg_$t]}"
  j=$(node "$root/bench/llamacpp_speed.mjs" "$gguf" "$t" "$PP" "$TG")
  res[llama_pp_$t]=$(echo "$j" | "$python" -c "import json,sys; print(json.load(sys.stdin)['prompt_tokens_per_s'])")
  res[llama_tg_$t]=$(echo "$j" | "$python" -c "import json,sys; print(json.load(sys.stdin)['generated_tokens_per_s'])")
  printf '%-8s %-8s %14.1f %14.2f\n' llama.cpp "$t" "${res[llama_pp_$t]}" "${res[llama_tg_$t]}"
done
echo
for t in 1 2; do
  "$python" - "$t" "${res[infera_pp_$t]}" "${res[infera_tg_$t]}" "${res[llama_pp_$t]}" "${res[llama_tg_$t]}" "$weights_per_token" "$bw" <<'PY'
import json, sys
t, ipp, itg, lpp, ltg, wpt, bw = sys.argv[1], *map(float, sys.argv[2:7]), json.loads(sys.argv[7])
gbs = bw["read_bandwidth_gbs"].get(t) or max(bw["read_bandwidth_gbs"].values())
roof = gbs * 1e9 / wpt
print(f"threads {t}: prompt infera/llama.cpp = {ipp/lpp:.2f}x, generation infera/llama.cpp = {itg/ltg:.2f}x, "
      f"generation = {itg/roof*100:.0f}% of roofline ({gbs:.1f} GB/s / {wpt/1e9:.2f} GB per token = {roof:.1f} tok/s)")
PY
done
