#!/usr/bin/env bash
# Infera quantized schemes vs llama.cpp block formats on the same (random, TinyLlama-shaped)
# weights: prompt and generation tokens/s at 1 and 2 threads, Infera/llama.cpp ratios, and
# each decode's fraction of the memory-bandwidth roofline.
#
#   bench/quant_bench.sh [BUILD_DIR] [WORK_DIR]        (BUILD_DIR: absolute or repo-relative)
#
# Environment: PROMPT_TOKENS (64), GEN_TOKENS (32), REPEATS (2: best of), THREADS ("1 2"),
# INFERA_QUANT_REPACK=0 to measure the zero-copy path (kernels on the mapped files), AVX2=1 to
# compare the two engines on AVX2 alone (Infera's avx2 path, llama.cpp's haswell variant; the
# overlay that makes llama.cpp load it is kept in WORK_DIR), AVX2=vnni against llama.cpp's
# alderlake variant (AVX-VNNI) instead.
#
# Roofline: bytes actually read per generated token = every weight tensor except the token
# embedding table (one row of it is read) — for Infera the safetensors tensors, for llama.cpp
# the GGUF file minus token_embd; ceiling = `infera sysinfo --bandwidth` at that thread count
# (huge-page buffer, four prefetched zmm streams), the better of a check before and one after
# the runs. fraction = gen t/s x bytes/token / ceiling. Repeats alternate the engines.
#
# Needs: BUILD_DIR/infera, /usr/bin/python3 with numpy (tools/gen_model.py), node with
# tests/conformance/node_modules. Printed only; not a test. On a shared machine run it when
# `uptime` shows a low load (printed with the table) and repeat: numbers move with other load.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
build="${1:-$repo/build}"
case "$build" in /*) ;; *) build="$(pwd)/$build" ;; esac
work="${2:-/tmp/infera_quant_bench}"
infera="$build/infera"
prompt_tokens="${PROMPT_TOKENS:-64}"
gen_tokens="${GEN_TOKENS:-32}"
repeats="${REPEATS:-2}"
threads_list="${THREADS:-1 2}"
py=/usr/bin/python3
[ -x "$infera" ] || { echo "error: $infera not found (build the infera target, pass BUILD_DIR)" >&2; exit 1; }
mkdir -p "$work"
cd "$work"
# shellcheck source=bench/llama_overlay.sh
source "$repo/bench/llama_overlay.sh"
[ "${AVX2:-0}" != 0 ] && avx2_only

[ -f tl/config.json ] || $py "$repo/tools/gen_model.py" tl --preset tinyllama
# w4a8g128: W4A8 with group 128 (the common AWQ/GPTQ choice, 4.125 instead of 4.5 bits per
# weight). It reads fewer bytes than Q4_0, so its ratio is not a same-bits comparison.
schemes="w8a8 w4a8 w4a16 w4a8g128"
for s in $schemes; do
  # Embeddings/head quantized too (--embed-head scheme): the same tensors llama.cpp's
  # Q8_0/Q4_0 files quantize.
  scheme="${s%g128}"; group=32; [ "$s" = "$scheme" ] || group=128
  [ -f "$s/config.json" ] || "$infera" quantize tl "$s" --scheme "$scheme" --group-size "$group" --embed-head scheme > "$s.quantize.txt"
done
for t in q8_0 q4_0; do
  [ -f "tl_$t.gguf" ] || "$infera" convert tl --to gguf "tl_$t.gguf" --type "$t" > /dev/null
done

# Bytes read per generated token (see the header).
infera_bytes() {  # model dir
  $py - "$1" <<'PY'
import glob, json, struct, sys
total = 0
for path in glob.glob(sys.argv[1] + "/*.safetensors"):
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    for name, t in header.items():
        if name == "__metadata__" or name.startswith("model.embed_tokens."):
            continue
        total += t["data_offsets"][1] - t["data_offsets"][0]
print(total)
PY
}
gguf_bytes() {  # file, bytes per 32 weights of its block type
  $py - "$1" "$2" tl/config.json <<'PY'
import json, os, sys
cfg = json.load(open(sys.argv[3]))
embed = cfg["vocab_size"] * cfg["hidden_size"] // 32 * int(sys.argv[2])
print(os.path.getsize(sys.argv[1]) - embed)
PY
}
field() { $py -c "import json,sys; print(json.load(sys.stdin)[sys.argv[1]])" "$1"; }
best() { $py -c "import sys; print(max(float(v) for v in sys.argv[1:]))" "$@"; }

declare -A ceiling prompt gen bytes
# The ceiling: the best of the bandwidth check before and after the runs (it moves by ~10%
# between runs on a shared machine; the roofline should be against what a core can read).
bw_before="$("$infera" sysinfo --bandwidth --json)"
for s in $schemes; do bytes[$s]="$(infera_bytes "$s")"; done
bytes[q8_0]="$(gguf_bytes tl_q8_0.gguf 34)"
bytes[q4_0]="$(gguf_bytes tl_q4_0.gguf 18)"

prompt_ids="[1$(for i in $(seq 2 "$prompt_tokens"); do printf ',1000'; done)]"
load_before="$(uptime | sed 's/.*load average: //')"
# Repeats alternate the engines (every Infera scheme, then llama.cpp, then again), so a slow
# drift of the machine's speed reaches both sides alike; each keeps its best run.
declare -A ps_all gs_all
for threads in $threads_list; do
  for r in $(seq "$repeats"); do
    for s in $schemes; do
      out="$("$infera" run -m "$s" --prompt-ids "$prompt_ids" -n "$gen_tokens" --temp 0 --ignore-eos --json -t "$threads" 2>/dev/null)"
      ps_all[$s,$threads]+=" $(echo "$out" | field prompt_tokens_per_s)"; gs_all[$s,$threads]+=" $(echo "$out" | field generated_tokens_per_s)"
    done
    for t in q8_0 q4_0; do
      out="$("${nlc_node[@]}" "$repo/bench/quant_llamacpp.mjs" "tl_$t.gguf" "$threads" "$prompt_tokens" "$gen_tokens")"
      ps_all[$t,$threads]+=" $(echo "$out" | field prompt_tokens_per_s)"; gs_all[$t,$threads]+=" $(echo "$out" | field gen_tokens_per_s)"
    done
  done
  for key in $schemes q8_0 q4_0; do
    # shellcheck disable=SC2086  # the lists are space-separated numbers
    prompt[$key,$threads]="$(best ${ps_all[$key,$threads]})"; gen[$key,$threads]="$(best ${gs_all[$key,$threads]})"
  done
done
load_after="$(uptime | sed 's/.*load average: //')"
bw_after="$("$infera" sysinfo --bandwidth --json)"
for threads in $threads_list; do
  ceiling[$threads]="$($py -c "
import json, sys
t = sys.argv[1]
bs = [json.loads(j)['read_bandwidth_gbs'] for j in sys.argv[2:]]
print(max(b.get(t, max(b.values())) for b in bs))" "$threads" "$bw_before" "$bw_after")"
done

echo "TinyLlama shape, $prompt_tokens-token prompt, $gen_tokens generated, best of $repeats; INFERA_QUANT_REPACK=${INFERA_QUANT_REPACK:-1}"
echo "infera kernel path: $("$infera" sysinfo --json | $py -c "import json,sys; print(json.load(sys.stdin)['kernel_path'])")"
echo "llama.cpp $(llama_variant tl_q4_0.gguf)"
echo "load average before: $load_before; after: $load_after"
for threads in $threads_list; do echo "read bandwidth ceiling, $threads thread(s): ${ceiling[$threads]} GB/s"; done
printf '%-16s %3s %10s %9s %11s %9s %7s %9s\n' "engine/format" thr "prompt t/s" "vs ref" "gen t/s" "vs ref" "GB/tok" "roofline"
row() {  # name key ref threads
  local name=$1 key=$2 ref=$3 t=$4
  $py - "$name" "$t" "${prompt[$key,$t]}" "${gen[$key,$t]}" "${bytes[$key]}" "${ceiling[$t]}" \
      "${prompt[$ref,$t]:-}" "${gen[$ref,$t]:-}" <<'PY'
import sys
name, t, p, g, b, c, rp, rg = sys.argv[1:9]
p, g, b, c = float(p), float(g), float(b), float(c)
vp = "%.2fx" % (p / float(rp)) if rp else ""
vg = "%.2fx" % (g / float(rg)) if rg else ""
print("%-16s %3s %10.1f %9s %11.2f %9s %7.3f %8.0f%%" % (name, t, p, vp, g, vg, b / 1e9, 100 * g * b / 1e9 / c))
PY
}
for threads in $threads_list; do
  row "infera w8a8" w8a8 q8_0 "$threads"
  row "llama.cpp q8_0" q8_0 "" "$threads"
  row "infera w4a8" w4a8 q4_0 "$threads"
  row "infera w4a16" w4a16 q4_0 "$threads"
  row "infera w4a8 g128" w4a8g128 q4_0 "$threads"
  row "llama.cpp q4_0" q4_0 "" "$threads"
done
echo "vs ref: Infera / llama.cpp (w8a8 vs q8_0, w4a8 and w4a16 vs q4_0). Goals (issue 3): w4a8 gen >= 1.20x and >= 75% roofline; w8a8 prompt >= 1.50x."
