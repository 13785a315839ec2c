#!/usr/bin/env bash
# Tensor parallel on one host: decode tokens/s at TP 1 and TP 2 (one thread per rank, so
# TP 2 uses two cores where TP 1 uses one), collectives and bytes per generated token, and
# the share of decode time rank 0 spends inside collectives, with the merged sync (one
# broadcast per step, 2 all-reduces per layer, one gather) and the textbook sequence
# (--tp-textbook-sync). Also EP 2 on a qwen3_moe model, and TP / EP on a Qwen3.5-MoE
# hybrid (Gated DeltaNet + gated attention + experts with a shared expert).
#
#   bench/tp_bench.sh [BUILD_DIR] [WORK_DIR]
#
# Needs BUILD_DIR/infera built with MPI (OpenMPI) and /usr/bin/python3 with numpy
# (tools/gen_model.py). Printed only; not a test. Numbers move with other load on the machine.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
build="${1:-$repo/build}"
work="${2:-/tmp/infera_tp_bench}"
infera="$build/infera"
gen_tokens="${GEN_TOKENS:-64}"
mkdir -p "$work"

# ~220 MB of bf16 weights: decode is memory-bound, as on real models.
[ -f "$work/llama/config.json" ] || /usr/bin/python3 "$repo/tools/gen_model.py" "$work/llama" --arch llama \
  --hidden 1024 --layers 8 --heads 16 --kv-heads 8 --head-dim 64 --ffn 2816 --vocab 8192 --dtype bf16 > /dev/null
[ -f "$work/moe/config.json" ] || /usr/bin/python3 "$repo/tools/gen_model.py" "$work/moe" --arch qwen3_moe \
  --hidden 512 --layers 6 --heads 8 --kv-heads 4 --head-dim 64 --experts 16 --experts-per-tok 2 --moe-ffn 512 \
  --vocab 8192 --dtype bf16 > /dev/null
[ -f "$work/hybrid/config.json" ] || /usr/bin/python3 "$repo/tools/gen_model.py" "$work/hybrid" --arch qwen3_5_moe \
  --hidden 512 --layers 8 --heads 8 --kv-heads 4 --head-dim 64 --lin-k-heads 4 --lin-v-heads 8 --experts 16 \
  --experts-per-tok 2 --moe-ffn 512 --shared-ffn 512 --vocab 8192 --no-mtp --dtype bf16 > /dev/null

uptime
prompt="[$(seq -s, 1 32)]"
# One line of the table from `infera run --json`'s last line.
cat > "$work/row.py" <<'PY'
import json, os, sys
label, base_file = sys.argv[1], sys.argv[2]
j = json.load(sys.stdin)
p = j.get("parallel")
tps = j["generated_tokens_per_s"]
if not p:  # the one-process row: the base of this model's ratios
    with open(base_file, "w") as f:
        f.write(str(tps))
base = float(open(base_file).read()) if os.path.exists(base_file) else 0.0
ratio = f"{tps / base:6.2f}x" if base > 0 else "      -"
if p:
    hwm = max(r["vm_hwm_kib"] for r in p["ranks"]) / 1024
    print(f"{label:<32} {tps:9.1f} {ratio} {p['decode_collectives_per_token']:11.1f} "
          f"{p['decode_bytes_per_token']:12.0f} {100 * p['decode_comm_share']:10.1f}% {hwm:9.0f}")
else:
    print(f"{label:<32} {tps:9.1f} {ratio} {0:11.1f} {0:12.0f} {0:10.1f}% {'-':>9}")
PY
run() {  # model, label, extra args
  "$infera" run -m "$work/$1" --prompt-ids "$prompt" -n "$gen_tokens" --temp 0 --ignore-eos --json -t 1 $3 \
    2> /dev/null | tail -1 | /usr/bin/python3 "$work/row.py" "$2" "$work/$1.tp1_tps"
}

printf "%-32s %9s %7s %11s %12s %11s %9s\n" "config" "tok/s" "vs TP1" "coll/token" "bytes/token" "comm share" "MiB/rank"
run llama "llama TP1"                    ""
run llama "llama TP2 merged"             "--tp 2"
run llama "llama TP2 textbook"           "--tp 2 --tp-textbook-sync"
run llama "llama TP4 merged (4 ranks)"   "--tp 4"
run moe   "qwen3_moe TP1"                ""
run moe   "qwen3_moe EP2"                "--ep 2"
run moe   "qwen3_moe EP2 all-to-all"     "--ep-dispatch all-to-all --ep 2"
run moe   "qwen3_moe TP2 (EP2 experts)"  "--tp 2 --ep 2"
run moe   "qwen3_moe TP2 (split experts)" "--tp 2"
run hybrid "qwen3_5_moe TP1"               ""
run hybrid "qwen3_5_moe TP2 (split experts)" "--tp 2"
run hybrid "qwen3_5_moe EP2"               "--ep 2"
run hybrid "qwen3_5_moe EP2 all-to-all"    "--ep-dispatch all-to-all --ep 2"
run hybrid "qwen3_5_moe TP2 + EP2"         "--tp 2 --ep 2"
uptime
