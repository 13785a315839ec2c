#!/usr/bin/env bash
# Builds Infera with sanitizers in a build folder of its own and runs the tests there.
#   scripts/sanitize.sh [ctest args...]          AddressSanitizer + UndefinedBehaviorSanitizer
#                                                (./build-asan), the whole unit suite
#   scripts/sanitize.sh --tsan [ctest args...]   ThreadSanitizer (./build-tsan), the engine
#                                                (test_runtime) and server (test_server) tests
# Extra arguments go to ctest (e.g. -R 'OpenAiApi|Jinja' to run a subset), with --tsan to
# the test binaries (e.g. --gtest_filter='HttpServer.*'). SANITIZE_TARGETS="test_chat
# test_io" builds (and, for ASan, runs) only those test binaries. Any report fails
# the run (UBSan does not recover; ASan checks leaks at exit). Not part of the default test
# run: a sanitized build and run take several times as long.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
mode=asan
if [ "${1:-}" = "--tsan" ]; then
  mode=tsan
  shift
fi
export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$root}"
export CCACHE_NOHASHDIR="${CCACHE_NOHASHDIR:-true}"
generator=()
command -v ninja >/dev/null 2>&1 && generator=(-G Ninja)
if [ "$mode" = asan ]; then
  dir=build-asan
  # GCC 12 warns falsely about libstdc++'s std::regex internals when they are instrumented
  # (-Wmaybe-uninitialized in regex_automaton.h); the plain build has no such warning.
  flags="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer -Wno-maybe-uninitialized"
  export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1:strict_string_checks=1:detect_stack_use_after_return=1}"
  export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
  export LSAN_OPTIONS="${LSAN_OPTIONS:-suppressions=$root/scripts/lsan_suppressions.txt}"
else
  dir=build-tsan
  flags="-fsanitize=thread -fno-omit-frame-pointer"
  # libgomp is not instrumented: its barriers look like races to TSan, so reports from
  # inside OpenMP parallel regions are suppressed (scripts/tsan_suppressions.txt says why);
  # the engine's own threads (scheduler, HTTP workers, queues) stay under test.
  export TSAN_OPTIONS="${TSAN_OPTIONS:-halt_on_error=1:second_deadlock_stack=1:history_size=7:suppressions=$root/scripts/tsan_suppressions.txt}"
  # The engine sizes its own regions (base/threads.cpp, which does not read this); any
  # other OpenMP code runs on one thread.
  export OMP_NUM_THREADS=1
fi
if [ ! -f "$dir/CMakeCache.txt" ]; then
  # -O1 -g: fast enough to run the suite, accurate stacks; a build type of its own so that
  # no -O2/-O3 of another type is added on top.
  cmake -S . -B "$dir" "${generator[@]}" -DCMAKE_BUILD_TYPE=Sanitize \
    -DCMAKE_CXX_FLAGS_SANITIZE="-O1 -g $flags" -DCMAKE_EXE_LINKER_FLAGS_SANITIZE="$flags" \
    -DCMAKE_SHARED_LINKER_FLAGS_SANITIZE="$flags"
fi
if [ "$mode" = asan ] && [ -n "${SANITIZE_TARGETS:-}" ]; then
  # shellcheck disable=SC2086
  cmake --build "$dir" -j "$(nproc)" --target $SANITIZE_TARGETS
  for t in $SANITIZE_TARGETS; do "$dir/$t" "$@"; done
elif [ "$mode" = asan ]; then
  cmake --build "$dir" -j "$(nproc)"
  # Tests whose ranks run under mpirun: Open MPI leaks by design at MPI_Finalize (its
  # plugins are unloaded, so the stacks cannot even be named for a suppression); they run
  # with the leak check off, every other check on. Tests that measure resident memory (peak
  # RSS against the planner's figure, RSS growth against the KV cache's bytes, a rank's
  # weights against one over its ranks) see ASan's shadow, redzones and quarantine too;
  # they run in the normal build only.
  mpi='^(MpiCommunicator|MpiRanks|TpRun|ServeTp)[.]'
  rss='PlannerMeasured[.]WithinTenPercentOfPeakRss|EngineStories[.]LongContextMemoryFollowsUsedTokens|TpRun[.].*PerRankWeightMemory'
  status=0
  ctest --test-dir "$dir" -L unit -E "$mpi|$rss" -j "$(nproc)" --output-on-failure --timeout 1800 "$@" || status=1
  ASAN_OPTIONS="$ASAN_OPTIONS:detect_leaks=0" ctest --test-dir "$dir" -L unit -R "$mpi" -E "$rss" -j "$(nproc)" \
    --output-on-failure --timeout 1800 "$@" || status=1
  exit $status
else
  cmake --build "$dir" -j "$(nproc)" --target test_runtime test_server infera
  # On one CPU: the engine sizes its OpenMP regions by the CPUs it may use, so it then starts
  # no OpenMP workers, whose stacks TSan cannot always restore to apply the suppression
  # (tests that ask for more threads still get them).
  pin=()
  if command -v taskset >/dev/null 2>&1; then
    pin=(taskset -c "$(taskset -pc $$ | sed 's/.*: *//; s/[-,].*//')")
  fi
  # Extra arguments go to the test binaries here (e.g. --gtest_filter=HttpServer.*).
  "${pin[@]}" "$dir/test_runtime" "$@"
  "${pin[@]}" "$dir/test_server" "$@"
fi
