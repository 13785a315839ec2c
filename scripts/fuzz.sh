#!/usr/bin/env bash
# Builds the libFuzzer targets of fuzz/ with clang (ASan + UBSan, ./build-fuzz) and runs each
# for a set time, starting from the seed corpus in fuzz/corpus/<target>/ (new inputs go to
# build-fuzz/corpus/<target>/, crashes to build-fuzz/artifacts/<target>/).
# Usage: scripts/fuzz.sh [seconds per target, default 60] [target ...]   (targets: openai_request
#        chat_template tokenizer safetensors gguf config deploy_yaml output_parser constraint)
# Exits 1 when a target found a crash, a leak or a timeout; reproduce one with
#   build-fuzz/fuzz/fuzz_<target> build-fuzz/artifacts/<target>/crash-...
# and turn it into a unit test. Not part of the default test run (it takes minutes).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
seconds=${1:-60}
shift || true
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(openai_request chat_template tokenizer safetensors gguf config deploy_yaml output_parser constraint)
export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$root}"
generator=()
command -v ninja >/dev/null 2>&1 && generator=(-G Ninja)
if [ ! -f build-fuzz/CMakeCache.txt ]; then
  cmake -S . -B build-fuzz "${generator[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_COMPILER=clang++ \
    -DINFERA_BUILD_FUZZ=ON -DINFERA_BUILD_TESTS=OFF
fi
cmake --build build-fuzz -j "$(nproc)" --target "${targets[@]/#/fuzz_}"
failed=()
for t in "${targets[@]}"; do
  mkdir -p "build-fuzz/corpus/$t" "build-fuzz/artifacts/$t"
  seeds="fuzz/corpus/$t"
  [ -d "$seeds" ] || seeds=""
  dict=()
  [ -f "fuzz/$t.dict" ] && dict=(-dict="fuzz/$t.dict")
  echo "== fuzz_$t for ${seconds} s"
  # -rss_limit_mb: a parser that takes gigabytes for a small input is a finding too.
  if ! "build-fuzz/fuzz/fuzz_$t" "build-fuzz/corpus/$t" $seeds "${dict[@]}" -max_total_time="$seconds" \
      -max_len=65536 -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
      -artifact_prefix="build-fuzz/artifacts/$t/" 2>"build-fuzz/fuzz_$t.log"; then
    failed+=("$t")
    tail -40 "build-fuzz/fuzz_$t.log"
  fi
  grep -E "stat::number_of_executed_units|stat::peak_rss_mb" "build-fuzz/fuzz_$t.log" || true
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzzing found problems in: ${failed[*]} (inputs in build-fuzz/artifacts/)" >&2
  exit 1
fi
echo "fuzzing: no crash in ${targets[*]} (${seconds} s each)"
