#!/usr/bin/env bash
# Infera vs llama.cpp on the same weights, side by side, in one run (issue: engine
# foundation benchmark). Generates a TinyLlama-shaped model (hidden 2048, 22 layers, 32
# heads, 4 KV heads, FFN 5632, vocab 32000, bf16), converts it to GGUF (bf16 or f16: the
# same bits per weight), and prints prompt processing (512-token prompt) and generation
# (128 tokens) tokens/s at 1 and 2 threads for both engines, the ratios, and Infera's
# generation speed as a fraction of the memory-bandwidth roofline (measured bandwidth /
# weight bytes read per token) with the GB/s it read. The kernel paths that ran (`infera
# sysinfo`) and the load average before and after are printed with the figures.
#
#   bench/compare_llamacpp.sh [WORK_DIR]      (default: /tmp/infera-bench; ~2.5 GB per dtype)
#
# Environment: INFERA (the binary; default build/infera), DTYPE=bf16|f16 (default bf16),
# SOURCE=hf|gguf (what Infera reads: the Hugging Face directory, bf16 only, or the GGUF file
# llama.cpp reads; default hf for bf16, gguf for f16), THREADS (default "1 2"), REPEATS
# (default 2: each figure is the best of that many runs, the two engines alternating), PP /
# TG (prompt / generated tokens).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
work=${1:-/tmp/infera-bench}
infera=${INFERA:-$root/build/infera}
python=python3
/usr/bin/python3 -c "import numpy" 2>/dev/null && python=/usr/bin/python3
DTYPE=${DTYPE:-bf16}
case "$DTYPE" in bf16) SOURCE=${SOURCE:-hf} ;; f16) SOURCE=${SOURCE:-gguf} ;; *) echo "DTYPE must be bf16 or f16" >&2; exit 2 ;; esac
if [ "$DTYPE" = f16 ] && [ "$SOURCE" = hf ]; then echo "SOURCE=hf is bf16 only (the generated checkpoint is bf16)" >&2; exit 2; fi
THREADS=${THREADS:-1 2}
REPEATS=${REPEATS:-2}
mkdir -p "$work"
model="$work/tinyllama-bf16"
gguf="$work/tinyllama-$DTYPE.gguf"
[ -f "$model/config.json" ] || "$python" "$root/tools/gen_model.py" "$model" --preset tinyllama >/dev/null
[ -f "$gguf" ] || "$infera" convert "$model" --to gguf "$gguf" --type "$DTYPE" >/dev/null
infera_model=$model
[ "$SOURCE" = gguf ] && infera_model=$gguf
PP=${PP:-512}
TG=${TG:-128}
ids=$("$python" -c "
s=7; out=[]
for _ in range($PP):
    s=(s*1103515245+12345)%2147483648; out.append(300+s%20000)
print(out)")
echo "load before: $(uptime | sed 's/.*load average: //')"
sysinfo=$("$infera" sysinfo --json)
echo "$sysinfo" | "$python" -c "
import json, sys; j = json.load(sys.stdin)
print('kernel path:', j['kernel_path'])
for d, p in j.get('float_matmul', {}).items(): print(f'  {d} matmul: {p}')"
bw=$("$infera" sysinfo --bandwidth --json)
weights_per_token=$("$python" -c "
import json; c=json.load(open('$model/config.json'))
H=c['hidden_size']; F=c['intermediate_size']; L=c['num_hidden_layers']; V=c['vocab_size']
nh=c['num_attention_heads']; nkv=c['num_key_value_heads']; hd=H//nh
per_layer = H*nh*hd + 2*H*nkv*hd + nh*hd*H + 3*H*F
print((L*per_layer + V*H) * 2)")
echo "$DTYPE weights; Infera reads $infera_model, llama.cpp $gguf; best of $REPEATS"
printf '%-10s %-8s %14s %14s\n' engine threads "prompt tok/s" "gen tok/s"
best() { "$python" -c "import sys; print(max(float(a) for a in sys.argv[1:]))" "$@"; }
declare -A res
for t in $THREADS; do
  ipp=() itg=() lpp=() ltg=()
  for _ in $(seq "$REPEATS"); do
    j=$("$infera" run -m "$infera_model" --prompt-ids "$ids" -n "$TG" --temp 0 --ignore-eos --json -t "$t" 2>/dev/null |
      tail -1)
    ipp+=("$(echo "$j" | "$python" -c "import json,sys; print(json.load(sys.stdin)['prompt_tokens_per_s'])")")
    itg+=("$(echo "$j" | "$python" -c "import json,sys; print(json.load(sys.stdin)['generated_tokens_per_s'])")")
    j=$(node "$root/bench/llamacpp_speed.mjs" "$gguf" "$t" "$PP" "$TG")
    lpp+=("$(echo "$j" | "$python" -c "import json,sys; print(json.load(sys.stdin)['prompt_tokens_per_s'])")")
    ltg+=("$(echo "$j" | "$python" -c "import json,sys; print(json.load(sys.stdin)['generated_tokens_per_s'])")")
  done
  res[infera_pp_$t]=$(best "${ipp[@]}")
  res[infera_tg_$t]=$(best "${itg[@]}")
  res[llama_pp_$t]=$(best "${lpp[@]}")
  res[llama_tg_$t]=$(best "${ltg[@]}")
  printf '%-10s %-8s %14.1f %14.2f   (runs: %s / %s)\n' infera "$t" "${res[infera_pp_$t]}" "${res[infera_tg_$t]}" \
    "${ipp[*]}" "${itg[*]}"
  printf '%-10s %-8s %14.1f %14.2f   (runs: %s / %s)\n' llama.cpp "$t" "${res[llama_pp_$t]}" "${res[llama_tg_$t]}" \
    "${lpp[*]}" "${ltg[*]}"
done
echo
for t in $THREADS; do
  "$python" - "$t" "${res[infera_pp_$t]}" "${res[infera_tg_$t]}" "${res[llama_pp_$t]}" "${res[llama_tg_$t]}" \
    "$weights_per_token" "$bw" "$DTYPE" <<'PY'
import json, sys
t, ipp, itg, lpp, ltg, wpt, bw, dt = sys.argv[1], *map(float, sys.argv[2:7]), json.loads(sys.argv[7]), sys.argv[8]
gbs = bw["read_bandwidth_gbs"].get(t) or max(bw["read_bandwidth_gbs"].values())
roof = gbs * 1e9 / wpt
print(f"{dt} threads {t}: prompt infera/llama.cpp = {ipp/lpp:.2f}x, generation infera/llama.cpp = {itg/ltg:.2f}x, "
      f"generation = {itg/roof*100:.0f}% of roofline ({itg*wpt/1e9:.1f} of {gbs:.1f} GB/s; "
      f"{wpt/1e9:.2f} GB per token = {roof:.1f} tok/s; llama.cpp {ltg*wpt/1e9:.1f} GB/s)")
PY
done
echo "load after: $(uptime | sed 's/.*load average: //')"
