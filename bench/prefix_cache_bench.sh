#!/usr/bin/env bash
# Prefix caching on an agent-like conversation (docs/runtime.md, "Hybrid models: state
# checkpoints" and "Disk tier"): a long first message, then turns that each add an answer
# and the next question. Time to first token of every turn with the cache off, in memory,
# and from disk after a restart (a fresh `infera serve` over the same --cache-dir), on a
# generated Qwen3.5-MoE-shaped model; also the checkpoint bytes per cached token.
#
#   bench/prefix_cache_bench.sh BUILD_DIR [FIRST_TOKENS] [TURN_TOKENS] [TURNS]
#
# Defaults: 12000, 300 and 10 (the issue's conversation). On a small machine scale them
# down (e.g. 3000 300 10). Prompts are token ids sent to /v1/completions, so no tokenizer
# is involved; each request generates one token (its latency is the TTFT).
#
# OFF_TURNS lists the turns the cache-off server answers (default: all). A cold prefill of
# 12K tokens and more takes minutes on a small machine, and the off server recomputes the
# whole conversation every turn; OFF_TURNS=none skips it and the summary compares each turn
# with the first message's cold prefill (the memory run's turn 0), which is shorter than
# the turn's own context and so gives ratios that are upper bounds.
#
# PART=interval measures --prefix-checkpoint-interval instead (the default was chosen with
# it): for each interval in INTERVALS (default "0 512 1024 2048 4096") a fresh server gets a
# document of FIRST_TOKENS tokens (its TTFT: the cold prefill, checkpoints included), then
# prompts that share the document's first 30%, 45%, 60%, 75% and 90% and go on with 64 new
# tokens (an edited or regenerated message: each resumes from the deepest checkpoint
# before its divergence). One line per interval: cold TTFT, mean TTFT of the divergent
# prompts, mean tokens recomputed, checkpoints and their bytes.
set -euo pipefail

BUILD=${1:?usage: bench/prefix_cache_bench.sh BUILD_DIR [FIRST_TOKENS] [TURN_TOKENS] [TURNS]}
FIRST=${2:-12000}
TURN=${3:-300}
TURNS=${4:-10}
THREADS=${THREADS:-2}
INFERA=$(cd "$BUILD" && pwd)/infera
ROOT=$(cd "$(dirname "$0")/.." && pwd)
WORK=$(mktemp -d /tmp/infera_prefix_bench.XXXXXX)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$WORK"' EXIT

MODEL=$WORK/model
# Qwen3.5-MoE-shaped: 8 layers (6 Gated DeltaNet, 2 full attention), GDN 8 key / 16 value
# heads of 128, 16 experts top-4 (as in docs/hybrid.md's bench model, hidden 512).
/usr/bin/python3 "$ROOT/tools/gen_model.py" "$MODEL" --arch qwen3_5_moe --hidden 512 --layers 8 --heads 8 --kv-heads 2 \
  --head-dim 128 --lin-k-heads 8 --lin-v-heads 16 --lin-dk 128 --lin-dv 128 --experts 16 --experts-per-tok 4 \
  --moe-ffn 256 --shared-ffn 256 --vocab 4096 --dtype bf16 --max-pos 32768 --no-mtp > /dev/null

PORT=$((20000 + RANDOM % 20000))
serve() {  # serve LOG ARGS...: starts the server, waits until it is ready
  local log=$1
  shift
  "$INFERA" serve --model "$MODEL" --threads "$THREADS" --port "$PORT" --kv-cache-memory 2GiB \
    --max-input-len 30000 "$@" > "$log" 2>&1 &
  SERVER=$!
  for _ in $(seq 600); do
    curl -sf "http://127.0.0.1:$PORT/ready" > /dev/null 2>&1 && return 0
    sleep 0.1
  done
  echo "server did not start:" >&2
  cat "$log" >&2
  exit 1
}
stop() {
  kill -TERM "$SERVER"
  wait "$SERVER" || true
}

converse() {  # converse LABEL [TURNS_TO_SEND]: runs the conversation, prints one line per turn sent
  python3 - "$PORT" "$FIRST" "$TURN" "$TURNS" "$1" "${2:-all}" << 'EOF'
import json, random, sys, time, urllib.request
port, first, turn, turns, label = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
send = None if sys.argv[6] == "all" else {int(x) for x in sys.argv[6].split(",") if x}
rng = random.Random(1)
ids = [rng.randrange(10, 4000) for _ in range(first)]
for t in range(turns + 1):
    if t > 0:
        ids += [rng.randrange(10, 4000) for _ in range(turn)]
    if send is not None and t not in send:
        continue
    body = json.dumps({"prompt": ids, "max_tokens": 1, "temperature": 0}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", body,
                                 {"Content-Type": "application/json"})
    t0 = time.perf_counter()
    with urllib.request.urlopen(req, timeout=3600) as r:
        resp = json.load(r)
    dt = time.perf_counter() - t0
    cached = resp["usage"].get("prompt_tokens_details", {}).get("cached_tokens", 0)
    print(f"{label}\t{t}\t{len(ids)}\t{cached}\t{dt * 1000:.0f}", flush=True)
EOF
}

metric() {  # metric NAME: its value from /metrics
  curl -s "http://127.0.0.1:$PORT/metrics" | awk -v n="$1" '$1 ~ "^"n"\\{" {print $2}'
}

diverge() {  # diverge LABEL: the document, then the divergent prompts; prints one line
  python3 - "$PORT" "$FIRST" "$1" << 'EOF'
import json, random, sys, time, urllib.request
port, first, label = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
rng = random.Random(1)
doc = [rng.randrange(10, 4000) for _ in range(first)]
def send(ids):
    body = json.dumps({"prompt": ids, "max_tokens": 1, "temperature": 0}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", body,
                                 {"Content-Type": "application/json"})
    t0 = time.perf_counter()
    with urllib.request.urlopen(req, timeout=3600) as r:
        resp = json.load(r)
    cached = resp["usage"].get("prompt_tokens_details", {}).get("cached_tokens", 0)
    return (time.perf_counter() - t0) * 1000, len(ids) - cached
cold, _ = send(doc)
ttft, recomputed = [], []
for frac in (0.30, 0.45, 0.60, 0.75, 0.90):
    ids = doc[: int(first * frac)] + [rng.randrange(10, 4000) for _ in range(64)]
    ms, n = send(ids)
    ttft.append(ms)
    recomputed.append(n)
print(f"{label}\t{cold:.0f}\t{sum(ttft) / len(ttft):.0f}\t{sum(recomputed) / len(recomputed):.0f}", end="\t", flush=True)
EOF
}

echo "# model: generated qwen3_5_moe (hidden 512, 8 layers, bf16); first message $FIRST tokens, $TURNS turns of $TURN"
echo "# threads $THREADS, load $(cut -d' ' -f1-3 /proc/loadavg), $("$INFERA" --version 2>/dev/null | head -1), $("$INFERA" sysinfo 2>/dev/null | grep -m1 "kernel path" | tr -s ' ')"
if [ "${PART:-turns}" = interval ]; then
  printf "interval\tcold_ttft_ms\tdiverged_ttft_ms\trecomputed\tcheckpoints\tcheckpoint_bytes\n"
  for I in ${INTERVALS:-0 512 1024 2048 4096}; do
    serve "$WORK/interval$I.log" --prefix-checkpoint-interval "$I"
    diverge "$I"
    printf "%s\t%s\n" "$(metric infera_prefix_cache_checkpoints)" "$(metric infera_prefix_cache_checkpoint_bytes)"
    stop
  done
  grep -m1 "recurrent-state checkpoints" "$WORK/interval0.log" | sed 's/^/# /' || true
  exit 0
fi
printf "mode\tturn\tprompt\tcached\tttft_ms\n"
OFF_TURNS=${OFF_TURNS:-all}
if [ "$OFF_TURNS" != none ]; then
  serve "$WORK/off.log" --no-prefix-cache
  converse off "$OFF_TURNS" | tee -a "$WORK/table"
  stop
fi
serve "$WORK/mem.log" --cache-dir "$WORK/cache" --cache-disk-size 4GiB
converse memory | tee -a "$WORK/table"
echo "# checkpoint bytes now: $(metric infera_prefix_cache_checkpoint_bytes), checkpoints: $(metric infera_prefix_cache_checkpoints)"
grep -m1 "recurrent-state checkpoints" "$WORK/mem.log" | sed 's/^/# /' || true
stop
echo "# disk tier after shutdown: $(du -sb "$WORK/cache" | cut -f1) bytes in $(ls "$WORK/cache" | wc -l) files"
serve "$WORK/disk.log" --cache-dir "$WORK/cache" --cache-disk-size 4GiB
converse disk | tee -a "$WORK/table"
echo "# disk reads: $(metric infera_prefix_cache_disk_reads_total) entries, $(metric infera_prefix_cache_disk_read_bytes_total) bytes"
stop
# The disk's sequential read bandwidth for comparison (a fresh 256 MiB file, page cache dropped when allowed).
dd if=/dev/urandom of="$WORK/bw" bs=1M count=256 status=none
sync
echo 3 > /proc/sys/vm/drop_caches 2> /dev/null || true
echo "# disk read bandwidth: $(dd if="$WORK/bw" of=/dev/null bs=1M 2>&1 | tail -1)"
# TTFT of each turn as a share of the cold prefill of its context: the off server's for the
# turns it answered, else the first message's cold prefill (memory run, turn 0: a bound).
python3 - "$WORK/table" << 'EOF'
import sys
rows = [l.split("\t") for l in open(sys.argv[1]) if l.strip()]
ttft = {(r[0], int(r[1])): float(r[4]) for r in rows}
cold0 = ttft.get(("off", 0), ttft.get(("memory", 0)))
print("# turn\tcold_ms\tmemory_share\tdisk_share")
for t in sorted({k[1] for k in ttft}):
    cold = ttft.get(("off", t), cold0)
    if t == 0:  # the first message: only the restarted server has it cached (on disk)
        print(f"# 0\t{cold:.0f}\t-\t{100 * ttft[('disk', 0)] / cold:.1f}%" if ("disk", 0) in ttft else "", end="")
        print()
        continue
    mem, disk = ttft.get(("memory", t)), ttft.get(("disk", t))
    share = lambda v: f"{100 * v / cold:.1f}%" if v is not None else "-"
    print(f"# {t}\t{cold:.0f}{'' if ('off', t) in ttft else ' (turn 0)'}\t{share(mem)}\t{share(disk)}")
EOF
