#!/usr/bin/env bash
# The whole test suite again, built with AddressSanitizer, UBSan and LeakSanitizer
# (-DSTRATA_SANITIZE=ON; UB is fatal there), what .ci/run calls after tools/test.sh.
# Every test is told it runs sanitized (STRATA_TEST_SANITIZED=1, from tests/CMakeLists.txt)
# and picks smaller shapes where it would otherwise be slow (test_stream).
#
#   tools/test_sanitized.sh          SAN_BUILD=dir to build elsewhere (default build-asan)
# Exit status: ctest's (0 when every test passed or was skipped).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${SAN_BUILD:-build-asan}
bash tools/setup.sh
echo "test_sanitized.sh: the whole suite with ASan + UBSan + LSan, built in $build" >&2
cmake -S . -B "$build" -DSTRATA_SANITIZE=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$build" -j"$(nproc)"

# A finding aborts the process, so the test fails; leaks are findings too.
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1
export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
# OpenMP threads that spin while they wait make a run 10x slower when the two cores are
# shared (measured: a 30-step train took 34.5 s with spinning, 3.2 s passive, under load);
# the sanitizers look at memory, not at scheduling, so they wait passively here.
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}

# Excluded, because they measure the process's resident memory against a budget or an
# estimate: ASan's shadow memory, redzones and quarantine make RSS meaningless (the
# sanitized strata refuses offload_bench's 32 MiB --host-budget: its own resident size at
# start leaves too little for the store).
#   prof_mem       estimate vs measured peak RSS within 10%
#   offload_bench  rss_peak_bytes <= 1.1 x --host-budget
exclude='^(prof_mem|offload_bench)$'
cd "$build"
ctest --output-on-failure -j1 --timeout 600 -E "$exclude"
