#!/usr/bin/env bash
# A/B of the Gated DeltaNet kernels on whole models: the same binary with
# INFERA_GDN_KERNELS=ref (the scalar reference loops, i.e. the pre-SIMD kernels) and with
# the dispatched SIMD paths. Alternating runs, best of N per mode (the machine is shared).
#   bench/gdn_ab.sh [infera binary] [model dir] [n-predict] [threads] [runs] [prompt file]
# Prints decode and prefill tokens/s per mode and the SIMD/ref ratios, with the load, and
# the least CPU time (user + sys) of a whole run per mode: on a busy machine wall-clock rates
# swing with the other processes, CPU seconds much less.
set -euo pipefail
BIN=${1:-build/infera}
MODEL=${2:-models/infera-default}
N=${3:-128}
THREADS=${4:-1}
RUNS=${5:-5}
PROMPT_FILE=${6:-}
if [[ -z "$PROMPT_FILE" ]]; then
  PROMPT_FILE=$(mktemp)
  PROMPT_TMP=$PROMPT_FILE
  echo "Once upon a time, there was a little girl named Lily. She loved to play outside in the sun with her dog." > "$PROMPT_FILE"
fi
declare -A best_gen best_pre best_cpu
for mode in ref simd; do best_gen[$mode]=0; best_pre[$mode]=0; best_cpu[$mode]=1e9; done
CPU_FILE=$(mktemp)
trap 'rm -f "$CPU_FILE" ${PROMPT_TMP:-}' EXIT
echo "load before: $(uptime | sed 's/.*load average: //')"
for ((i = 0; i < RUNS; i++)); do
  for mode in ref simd; do
    if [[ $mode == ref ]]; then export INFERA_GDN_KERNELS=ref; else unset INFERA_GDN_KERNELS; fi
    out=$(/usr/bin/time -f "%U %S" -o "$CPU_FILE" "$BIN" run -m "$MODEL" -f "$PROMPT_FILE" -n "$N" -t "$THREADS" \
          --temp 0 --json 2>/dev/null)
    best_cpu[$mode]=$(python3 -c "u, s = open('$CPU_FILE').read().split(); print(min(float(u) + float(s), ${best_cpu[$mode]}))")
    read -r gen pre < <(python3 -c 'import json,sys; d=json.loads(sys.argv[1]); print(d["generated_tokens_per_s"], d["prompt_tokens_per_s"])' "$out")
    best_gen[$mode]=$(python3 -c "print(max($gen, ${best_gen[$mode]}))")
    best_pre[$mode]=$(python3 -c "print(max($pre, ${best_pre[$mode]}))")
  done
done
unset INFERA_GDN_KERNELS
echo "load after:  $(uptime | sed 's/.*load average: //')"
python3 - "${best_gen[ref]}" "${best_gen[simd]}" "${best_pre[ref]}" "${best_pre[simd]}" "$MODEL" "$THREADS" \
  "${best_cpu[ref]}" "${best_cpu[simd]}" <<'PY'
import sys
gr, gs, pr, ps, model, t = float(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4]), sys.argv[5], sys.argv[6]
cr, cs = float(sys.argv[7]), float(sys.argv[8])
print(f"{model}, {t} thread(s), best of runs")
print(f"  decode  tok/s: ref {gr:8.1f}  simd {gs:8.1f}  ratio {gs / gr:5.2f}x")
print(f"  prefill tok/s: ref {pr:8.1f}  simd {ps:8.1f}  ratio {ps / pr:5.2f}x")
print(f"  CPU s per run: ref {cr:8.2f}  simd {cs:8.2f}  ratio {cr / cs:5.2f}x")
PY
