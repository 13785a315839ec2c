#!/usr/bin/env bash
# A/B of speculative decoding through `infera run` on the built-in trained hybrid
# (models/infera-default): for each binary, alternating rounds of --speculative
# none / ngram / mtp on a repetitive prompt (greedy, 1 thread), the median tokens/s and the
# speedup over `none` of the same binary, plus acceptance and tokens per step. Every
# speculative run's tokens are checked against the same binary's plain run.
#
#   bench/spec_hybrid_ab.sh BIN_A [BIN_B]     (e.g. an older build's infera, then build/infera)
# Environment: ROUNDS (default 5), GEN (default 256), MODEL (default models/infera-default).
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
model="${MODEL:-$here/models/infera-default}"
prompt="The LORD is my shepherd; I shall not want. He maketh me to lie down in green pastures: he leadeth me beside the still waters. The LORD is my shepherd; I shall not want. He maketh me to lie down in green pastures"
ROUNDS="${ROUNDS:-5}" GEN="${GEN:-256}" MODEL="$model" PROMPT="$prompt" python3 - "$@" <<'PY'
import json, os, statistics, subprocess, sys
bins, rounds, gen = sys.argv[1:], int(os.environ["ROUNDS"]), os.environ["GEN"]
methods = ["none", "ngram", "mtp"]
runs = {(b, m): [] for b in bins for m in methods}
for _ in range(rounds):
    for m in methods:
        for b in bins:
            out = subprocess.run([b, "run", "-m", os.environ["MODEL"], "-p", os.environ["PROMPT"], "-n", gen,
                                  "--temp", "0", "--ignore-eos", "-t", "1", "--speculative", m, "--json"],
                                 check=True, capture_output=True, text=True).stdout
            runs[(b, m)].append(json.loads(out))
print(f"load: {os.getloadavg()[0]:.2f}  rounds: {rounds}  generated: {gen}")
for b in bins:
    base = statistics.median(r["generated_tokens_per_s"] for r in runs[(b, "none")])
    for m in methods:
        rs = runs[(b, m)]
        tps = statistics.median(r["generated_tokens_per_s"] for r in rs)
        spec = rs[0].get("speculative") or {}
        same = all(r["ids"] == runs[(b, "none")][0]["ids"] for r in rs)
        print(f"{b}  {m:5s}  {tps:8.1f} tok/s  x{tps / base:4.2f}  acceptance {spec.get('acceptance_rate', 0):.2f}"
              f"  tokens/step {spec.get('tokens_per_step', 0):.2f}  same tokens as none: {same}")
PY
