#!/usr/bin/env bash
# MoE benchmark: Infera W4A8 / W4A16 / W8A8 vs llama.cpp Q4_0 / Q8_0 on the same random
# weights, for a Qwen3.5-MoE-shaped hybrid (Gated DeltaNet + gated attention, 3 linear
# layers per full-attention layer, 64 experts / 8 active, expert FFN 512, a shared expert,
# an MTP head) and a Qwen3-MoE-shaped model (64 experts / 8 active, expert FFN 768).
#
#   bench/moe_bench.sh WORK_DIR [BUILD_DIR]
#
# Prints, per model and thread count: prompt and generation tokens/s of each engine/format,
# Infera/llama.cpp ratios (w4a8, w4a16 vs q4_0; w8a8 vs q8_0), and Infera's generation as a
# fraction of the roofline: tokens/s x bytes read per token / bandwidth (`infera sysinfo
# --bandwidth`, same thread count); bytes read per token (active experts' share of the expert tensors, router, shared
# expert, attention / linear attention, head, one embedding row; MTP not counted). Then
# n-gram and MTP speculative decoding on repetitive prompts (see spec_random; and the
# trained models/infera-default, float and W8A8, on repeated text): speedup over plain
# decoding, acceptance, tokens per step, and a check that the greedy tokens are identical.
#
# Models are generated under WORK_DIR (not the repo) and reused on later runs: with the
# defaults ~10 GB of disk per model family; each run maps at most ~2 GB. Environment:
#   THREADS ("1 2"), PROMPT (128), GEN (32), REPEATS (2: best of, engines alternating), SPEC_GEN (64), SPEC_CTX (192),
#   Q35_LAYERS (8), Q3_LAYERS (6), EXPERTS (64), HIDDEN (2048), VOCAB (32000),
#   PARTS ("models spec": the speed tables, the speculative runs),
#   SMALL=1   tiny shapes (hidden 512, 16 experts, 2-4 layers): a smoke run in a minute.
# Needs BUILD_DIR/infera (default: build), /usr/bin/python3 with numpy, node with
# tests/conformance/node_modules. Printed only; not a test. Run on a quiet machine: numbers
# move with other load (`uptime` is printed beside them).
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
work="${1:?usage: bench/moe_bench.sh WORK_DIR [BUILD_DIR]}"
build="$(cd "${2:-$repo/build}" && pwd)"
infera="$build/infera"
[ -x "$infera" ] || { echo "no infera binary at $infera (build it, or pass BUILD_DIR)" >&2; exit 1; }
py=python3
"$py" -c "import numpy" 2>/dev/null || py=/usr/bin/python3
threads_list="${THREADS:-1 2}"
prompt_n="${PROMPT:-128}"
gen_n="${GEN:-32}"
repeats="${REPEATS:-2}"
parts="${PARTS:-models spec}"
spec_gen="${SPEC_GEN:-64}"
if [[ "${SMALL:-0}" == 1 ]]; then
  hidden=512 experts=16 vocab=4096 q35_layers=4 q3_layers=2 q35_attn="--heads 8 --kv-heads 2 --head-dim 64"
  q35_lin="--lin-k-heads 4 --lin-v-heads 8 --lin-dk 64 --lin-dv 64" q3_attn="--heads 8 --kv-heads 2 --head-dim 64"
  q35_ffn=256 q3_ffn=256
else
  hidden="${HIDDEN:-2048}" experts="${EXPERTS:-64}" vocab="${VOCAB:-32000}"
  q35_layers="${Q35_LAYERS:-8}" q3_layers="${Q3_LAYERS:-6}"
  # Qwen3.5-35B-A3B's attention and linear-attention shapes; Qwen3-30B-A3B's attention.
  q35_attn="--heads 16 --kv-heads 2 --head-dim 256"
  q35_lin="--lin-k-heads 16 --lin-v-heads 32 --lin-dk 128 --lin-dv 128"
  q3_attn="--heads 32 --kv-heads 4 --head-dim 128"
  q35_ffn=512 q3_ffn=768
fi
mkdir -p "$work"
cd "$work"
echo "machine: $(nproc) cores; $(uptime)"

# Bytes read per decoded token by the trunk of a model directory (see the header).
bytes_per_token() {
  "$py" - "$1" <<'EOF'
import glob, json, re, struct, sys
d = sys.argv[1]
cfg = json.load(open(d + "/config.json"))
tc = cfg.get("text_config", cfg)
E, k, V = tc["num_experts"], tc["num_experts_per_tok"], tc["vocab_size"]
tied = cfg.get("tie_word_embeddings", tc.get("tie_word_embeddings", False))
total = 0.0
for f in glob.glob(d + "/*.safetensors"):
    with open(f, "rb") as fh:
        n = struct.unpack("<Q", fh.read(8))[0]
        header = json.loads(fh.read(n))
    for name, t in header.items():
        if name == "__metadata__" or name.startswith("mtp.") or ".visual." in name:
            continue
        size = t["data_offsets"][1] - t["data_offsets"][0]
        if re.search(r"\.mlp\.experts\.", name):
            size *= k / E  # only the active experts' rows are read
        elif "embed_tokens" in name and not tied:
            size /= V      # one row per token
        total += size
print(int(total))
EOF
}

json_field() { "$py" -c "import json,sys; d=json.load(sys.stdin); print($1)"; }

# better KEY PROMPT GEN: keeps the larger of each in prompt[KEY] / gen[KEY] (the caller's arrays).
better() {
  if [ -z "${gen[$1]:-}" ] || awk -v a="$3" -v b="${gen[$1]}" 'BEGIN {exit !(a > b)}'; then gen[$1]="$3"; fi
  if [ -z "${prompt[$1]:-}" ] || awk -v a="$2" -v b="${prompt[$1]}" 'BEGIN {exit !(a > b)}'; then prompt[$1]="$2"; fi
}

# The ceiling: the best of a bandwidth check at the start and one just before each table's
# thread count (it moves by ~10% between checks on a shared machine; the roofline should be
# against what a core can read), as bench/quant_bench.sh does.
bandwidth_json="$("$infera" sysinfo --bandwidth --json 2>/dev/null | tail -1)"
bandwidth() {
  local now; now="$("$infera" sysinfo --bandwidth --json 2>/dev/null | tail -1)"
  "$py" -c "
import json, sys
t = sys.argv[1]
bs = [json.loads(j)['read_bandwidth_gbs'] for j in sys.argv[2:]]
print(max(b.get(t, max(b.values())) for b in bs))" "$1" "$bandwidth_json" "$now"
}

prompt_ids="[1$(for i in $(seq 2 "$prompt_n"); do printf ',1000'; done)]"

bench_family() {
  local name="$1" arch="$2" gen_args="$3"
  echo
  echo "== $name ($arch) =="
  [ -f "$name/config.json" ] || "$py" "$repo/tools/gen_model.py" "$name" --arch "$arch" --dtype bf16 $gen_args >/dev/null
  for s in w4a8 w4a16 w8a8; do
    # Embeddings/head quantized too (--embed-head scheme), as llama.cpp's files do; the
    # hybrid keeps its router, shared-expert gate and GDN gates (in_proj_b/a) as stored.
    [ -f "${name}_$s/config.json" ] || "$infera" quantize "$name" "${name}_$s" --scheme "$s" --group-size 32 \
      --embed-head scheme > "${name}_$s.quantize.txt" 2>/dev/null
    tail -1 "${name}_$s.quantize.txt" | sed "s/^/  $s: /"
  done
  for t in q4_0 q8_0; do
    [ -f "${name}_$t.gguf" ] || "$infera" convert "$name" "${name}_$t.gguf" --to gguf --type "$t" >/dev/null
  done
  printf '%-16s %3s %11s %9s %8s %10s %9s  %s\n' "engine/format" thr "prompt t/s" "gen t/s" "GB/tok" "roofline" "gen/llama" "(load)"
  for threads in $threads_list; do
    local bw; bw="$(bandwidth "$threads")"
    # Best of $repeats per engine/format, the engines alternating (every llama.cpp format,
    # then every Infera scheme, then again), so a drift of the machine reaches both alike.
    declare -A gen=() prompt=()
    local r f s out p g
    for r in $(seq "$repeats"); do
      for f in q4_0 q8_0; do
        out="$(node "$repo/bench/quant_llamacpp.mjs" "${name}_$f.gguf" "$threads" "$prompt_n" "$gen_n")"
        p="$(echo "$out" | json_field "'%.1f' % d['prompt_tokens_per_s']")"
        g="$(echo "$out" | json_field "'%.2f' % d['gen_tokens_per_s']")"
        better "$f" "$p" "$g"
      done
      for s in w4a8 w4a16 w8a8; do
        out="$("$infera" run -m "${name}_$s" --prompt-ids "$prompt_ids" -n "$gen_n" --temp 0 --ignore-eos --json -t "$threads" 2>/dev/null | tail -1)"
        p="$(echo "$out" | json_field "'%.1f' % d['prompt_tokens_per_s']")"
        g="$(echo "$out" | json_field "'%.2f' % d['generated_tokens_per_s']")"
        better "$s" "$p" "$g"
      done
    done
    for f in q4_0 q8_0; do
      printf '%-16s %3s %11s %9s %8s %10s %9s  %s\n' "llama.cpp $f" "$threads" "${prompt[$f]}" "${gen[$f]}" "" "" "" "$(cut -d' ' -f1-3 /proc/loadavg)"
    done
    for s in w4a8 w4a16 w8a8; do
      local dir="${name}_$s" bytes frac ref
      p="${prompt[$s]}"; g="${gen[$s]}"
      bytes="$(bytes_per_token "$dir")"
      frac="$(awk -v g="$g" -v b="$bytes" -v bw="$bw" 'BEGIN {printf "%.0f%%", 100 * g * b / (bw * 1e9)}')"
      ref="${gen[q4_0]}"; [ "$s" = w8a8 ] && ref="${gen[q8_0]}"
      printf '%-16s %3s %11s %9s %8.3f %10s %8.2fx  %s\n' "infera $s" "$threads" "$p" "$g" \
        "$(awk -v b="$bytes" 'BEGIN {print b / 1e9}')" "$frac" "$(awk -v g="$g" -v r="$ref" 'BEGIN {print g / r}')" \
        "$(cut -d' ' -f1-3 /proc/loadavg)"
    done
    echo "  (bandwidth at $threads thread(s): $bw GB/s; gen/llama: w4a8, w4a16 vs q4_0, w8a8 vs q8_0)"
  done
}

# Speculative decoding on `dir` with the prompt given as infera run options ($3...):
# plain greedy, then each method; speedup, acceptance, tokens per step, same tokens.
spec_run() {
  local dir="$1" methods="$2"
  shift 2
  local threads; threads="$(echo $threads_list | awk '{print $NF}')"
  echo
  echo "speculative decoding, $(basename "$dir"), $threads thread(s), $SPEC_NOTE:"
  printf '  %-8s %9s %9s %11s %10s %8s\n' method "gen t/s" speedup acceptance "tok/step" "same ids"
  local base_out base_g base_ids
  base_out="$("$infera" run -m "$dir" "$@" -n "$spec_gen" --temp 0 --ignore-eos --json -t "$threads" 2>/dev/null | tail -1)"
  base_g="$(echo "$base_out" | json_field "'%.2f' % d['generated_tokens_per_s']")"
  base_ids="$(echo "$base_out" | json_field "d['ids']")"
  printf '  %-8s %9s %9s %11s %10s %8s\n' none "$base_g" 1.00x - 1.00 -
  for m in $methods; do
    local out g acc tps ids
    out="$("$infera" run -m "$dir" "$@" -n "$spec_gen" --temp 0 --ignore-eos --json -t "$threads" \
      --speculative "$m" 2>/dev/null | tail -1)"
    g="$(echo "$out" | json_field "'%.2f' % d['generated_tokens_per_s']")"
    acc="$(echo "$out" | json_field "'%.0f%%' % (100 * d['speculative']['acceptance_rate'])")"
    tps="$(echo "$out" | json_field "'%.2f' % d['speculative']['tokens_per_step']")"
    ids="$(echo "$out" | json_field "d['ids']")"
    printf '  %-8s %9s %8.2fx %11s %10s %8s\n' "$m" "$g" "$(awk -v a="$g" -v b="$base_g" 'BEGIN {print a / b}')" "$acc" "$tps" \
      "$([ "$ids" = "$base_ids" ] && echo yes || echo NO)"
  done
}

# Random-weight models do not copy their context (no induction heads), so a prompt that
# repeats itself is not enough: the prompt is P + the model's own greedy continuation of P
# (SPEC_CTX tokens). Greedy decoding of a random model often falls into cycles there, which
# prompt lookup can draft; a random MTP head rarely agrees with the trunk (acceptance ~0:
# this measures the drafting and verification cost).
spec_random() {
  local dir="$1" methods="$2"
  local p="[1,2301,517,88,1902,733,405,215,1677,340,2999,128,811,60,3120,1405,976,2222,301,1544,90,2711,1033,455]"
  local cont; cont="$("$infera" run -m "$dir" --prompt-ids "$p" -n "${SPEC_CTX:-192}" --temp 0 --ignore-eos --json -t 1 2>/dev/null | tail -1 | json_field "','.join(map(str, d['ids']))")"
  SPEC_NOTE="prompt = 24 ids + the model's greedy continuation (${SPEC_CTX:-192})" spec_run "$dir" "$methods" --prompt-ids "${p%]},${cont}]"
}

has() { [[ " $parts " == *" $1 "* ]]; }
if has models; then
bench_family q35moe qwen3_5_moe "--hidden $hidden --layers $q35_layers $q35_attn $q35_lin --full-attn-interval 4 \
  --experts $experts --experts-per-tok 8 --moe-ffn $q35_ffn --shared-ffn $q35_ffn --vocab $vocab --seed 11"
bench_family q3moe qwen3_moe "--hidden $hidden --layers $q3_layers $q3_attn --experts $experts --experts-per-tok 8 \
  --moe-ffn $q3_ffn --vocab $vocab --seed 12"
fi
has spec || exit 0
spec_random q35moe_w4a8 "ngram mtp"
spec_random q3moe_w4a8 "ngram"
# The trained tiny hybrid (qwen3_5_moe with an MTP head), float and W8A8, on text that
# repeats itself: what a real model's drafts look like.
default_model="$repo/models/infera-default"
if [ -f "$default_model/config.json" ]; then
  [ -f default_w8a8/config.json ] || "$infera" quantize "$default_model" default_w8a8 --scheme w8a8 >/dev/null 2>&1
  text="Once upon a time there was a little robot named Bolt. Bolt liked to count the stars. Once upon a time there was a little robot named Bolt. Bolt liked to count the stars. Once upon a time there was"
  SPEC_NOTE="repetitive text prompt" spec_run "$default_model" "ngram mtp" -p "$text"
  SPEC_NOTE="repetitive text prompt" spec_run "$work/default_w8a8" "ngram mtp" -p "$text"
else
  echo "(models/infera-default not found: no trained MTP head to measure)"
fi
