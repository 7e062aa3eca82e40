#!/usr/bin/env bash
# Build the libFuzzer harnesses (tests/fuzz/fuzz_<parser>.c; clang, ASan + UBSan, UB fatal)
# and run each for SECONDS (default 60), one after another, one process on one core.
# Prints per harness: executions, coverage (cov = edges, ft = features, from libFuzzer's
# final stats), new corpus units and crashes. A crash leaves its input in
# BUILD/fuzz/artifacts/<parser>/; turn it into a fixed bug and a file under
# tests/fuzz/regress/<parser>/ (replayed by the regress test of the ordinary suite).
#
#   tools/fuzz.sh [SECONDS]        FUZZ_ONLY=safetensors,llmc to run some; FUZZ_BUILD=dir
#   FUZZ_RUNS=N [FUZZ_SEED=S]      a reproducible run (CI): N executions per harness from
#                                  seed S (default 1), SECONDS only as a cap; the same
#                                  binary then explores the same inputs on every machine,
#                                  so CI passes or fails on the code, not on luck
# Exit status: 0 when no harness crashed, 1 when one did, 2 when the build failed.
set -uo pipefail
cd "$(dirname "$0")/.."
secs=${1:-60}
build=${FUZZ_BUILD:-build-fuzz}
jobs=${FUZZ_JOBS:-$(nproc)}
if ! command -v clang >/dev/null; then
  echo "fuzz.sh: clang not found (tools/setup.sh installs clang and libclang-rt-14-dev)" >&2
  exit 2
fi
echo "fuzz.sh: building the harnesses in $build (clang, -fsanitize=fuzzer,address,undefined)" >&2
CC=clang cmake -S . -B "$build" -DSTRATA_FUZZ=ON -DBUILD_TESTING=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null || exit 2
harnesses=()
for src in tests/fuzz/fuzz_*.c; do
  h=$(basename "$src" .c); h=${h#fuzz_}
  if [ -n "${FUZZ_ONLY:-}" ] && [[ ",$FUZZ_ONLY," != *",$h,"* ]]; then continue; fi
  harnesses+=("$h")
done
targets=(); for h in "${harnesses[@]}"; do targets+=(--target "fuzz_$h"); done
cmake --build "$build" -j"$jobs" "${targets[@]}" >"$build/fuzz-build.log" 2>&1 || {
  tail -30 "$build/fuzz-build.log" >&2; echo "fuzz.sh: build failed (log: $build/fuzz-build.log)" >&2; exit 2; }

export ASAN_OPTIONS=${ASAN_OPTIONS:-abort_on_error=1:detect_leaks=1:allocator_may_return_null=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}
det=()
if [ -n "${FUZZ_RUNS:-}" ]; then
  det=(-runs="$FUZZ_RUNS" -seed="${FUZZ_SEED:-1}")
  echo "fuzz.sh: $FUZZ_RUNS executions per harness from seed ${FUZZ_SEED:-1} (at most ${secs} s each), one at a time, from $(date -u +%FT%TZ)"
else
  echo "fuzz.sh: ${secs} s per harness, one at a time, from $(date -u +%FT%TZ)"
fi
printf '%-16s %12s %8s %8s %8s %8s  %s\n' harness executions cov ft units crashes log
status=0
for h in "${harnesses[@]}"; do
  work="$build/fuzz/corpus/$h" art="$build/fuzz/artifacts/$h" log="$build/fuzz/$h.log"
  mkdir -p "$work" "$art" "tests/fuzz/regress/$h"
  before=$(find "$art" -type f | wc -l)
  # new inputs go to the first (build) directory; the committed seeds and regression
  # inputs are read only
  dict=(); [ -f "tests/fuzz/$h.dict" ] && dict=(-dict="tests/fuzz/$h.dict") # JSON keys and tokens
  "$build/fuzz/fuzz_$h" "$work" "tests/fuzz/corpus/$h" "tests/fuzz/regress/$h" -max_total_time="$secs" "${det[@]}" "${dict[@]}" \
    -print_final_stats=1 -timeout=10 -rss_limit_mb=2048 -artifact_prefix="$art/" >"$log" 2>&1 &
  pid=$!
  wait $pid
  rc=$?
  rm -rf "/dev/shm/strata-fuzz-$pid" "/tmp/strata-fuzz-$pid" # the harness's input files (fuzz_common.h)
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  last=$(grep -E '^#[0-9]+' "$log" | tail -1)
  cov=$(sed -n 's/.* cov: \([0-9]*\).*/\1/p' <<<"$last")
  ft=$(sed -n 's/.* ft: \([0-9]*\).*/\1/p' <<<"$last")
  units=$(find "$work" -type f | wc -l)
  crashes=$(( $(find "$art" -type f | wc -l) - before ))
  if [ $rc -ne 0 ] && [ $crashes -eq 0 ]; then crashes=1; fi
  [ $crashes -gt 0 ] && status=1
  printf '%-16s %12s %8s %8s %8s %8s  %s\n' "$h" "${execs:-?}" "${cov:-?}" "${ft:-?}" "$units" "$crashes" "$log"
  if [ $crashes -gt 0 ]; then
    grep -m3 -E 'ERROR: |runtime error|fuzz: ' "$log" | sed 's/^/    /'
    ls "$art" | sed "s|^|    artifact: $art/|"
  fi
done
echo "fuzz.sh: done $(date -u +%FT%TZ); $([ $status -eq 0 ] && echo 'no crash' || echo 'CRASHES: see above')"
exit $status
