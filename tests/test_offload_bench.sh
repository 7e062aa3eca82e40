#!/usr/bin/env bash
# test_offload_bench.sh - strata bench offload end to end, small: one JSON object with the
# issue's figures; with a tmpfs path and a disk path the state is split in proportion to
# the probed bandwidth (within 10%); resident memory within the host budget + 10%; the
# bench's files removed; clear errors for bad input.
set -u
S=${STRATA_BIN:?STRATA_BIN not set}
T=$(mktemp -d /tmp/strata-test-offload-XXXXXX)
fail=0
check() { if ! eval "$1"; then echo "FAIL: $2"; fail=1; fi; }
command -v jq >/dev/null || { echo "jq not installed: skipped"; exit 77; }
mkdir -p "$T/disk"
SHM=""
if [ -d /dev/shm ] && [ "$(stat -f -c %T /dev/shm)" = "tmpfs" ]; then SHM=$(mktemp -d /dev/shm/strata-test-XXXXXX); fi
P2=${SHM:-$T/disk2}
mkdir -p "$P2"

# 36 MiB: the store, one subgroup's buffers and the program itself (its resident size at start, with
# OpenBLAS, oneDNN and GSL loaded, about 12 MiB), which the bench counts inside the budget
"$S" bench offload --path "$P2" --path "$T/disk" --params 40M --host-budget 36MiB --probe-bytes 64MiB --steps 2 \
  --json >"$T/out.json" 2>"$T/err.txt"
rc=$?
check '[ $rc -eq 0 ]' "bench offload failed: $(tail -3 "$T/err.txt")"
J="$T/out.json"
check 'jq -e ".bench == \"offload\" and .paths == 2 and .subgroups >= 100 and .step_s > 0 and .read_bytes > 0 and .write_bytes > 0 and .read_gbps > 0 and .write_gbps > 0 and .compute_s > 0 and .io_time_s > 0 and .io_time_serial_s >= .io_time_overlapped_s and .io_ratio > 0 and .overlap_ratio > 0 and (.cache_hit_rate >= 0)" "$J" >/dev/null' \
  "the figures: $(cat "$J")"
check 'jq -e "all(.path[]; .probe_read_gbps > 0 and .probe_write_gbps > 0 and .probe_mixed_gbps > 0 and .split_weight > 0)" "$J" >/dev/null' \
  "per-path probe figures: $(cat "$J")"
# the split follows the weights (the probe's bandwidth) within 10%
check 'jq -e "(.path | map(.split_weight) | add) as \$w | all(.path[]; (.share / (.split_weight / \$w)) as \$r | \$r > 0.9 and \$r < 1.1)" "$J" >/dev/null' \
  "the split does not follow the probed bandwidth: $(jq -c "[.path[] | {share, split_weight}]" "$J")"
check 'jq -e ".rss_peak_bytes <= 1.1 * .host_budget_bytes" "$J" >/dev/null' \
  "resident memory over the budget + 10%: $(jq -c "{rss_peak_bytes, host_budget_bytes}" "$J")"
check '[ -z "$(find "$P2" "$T/disk" -type f)" ]' "files left behind: $(find "$P2" "$T/disk" -type f)"

"$S" bench offload --params 1M >"$T/e1" 2>&1; rc=$?
check '[ $rc -eq 2 ] && grep -q -- "--path" "$T/e1"' "no path: rc $rc $(cat "$T/e1")"
"$S" bench offload --path "$T/missing" --params 1M --no-probe >"$T/e2" 2>&1; rc=$?
check '[ $rc -eq 1 ] && grep -q "$T/missing" "$T/e2"' "a missing directory is named: rc $rc $(cat "$T/e2")"
"$S" bench offload --path "$T/disk" --params 10 >"$T/e3" 2>&1; rc=$?
check '[ $rc -eq 2 ]' "absurd --params accepted: rc $rc"

for bad in "--states 4bit" "--grad f16" "--steps 0" "--host-budget 1MiB" "--frobnicate 1"; do
  "$S" bench offload --path "$T/disk" --params 1M --no-probe $bad >"$T/e4" 2>&1; rc=$?
  check '[ $rc -eq 2 ] && grep -q -- "${bad%% *}" "$T/e4"' "bad option '$bad': rc $rc $(cat "$T/e4")"
done

[ -n "$SHM" ] && rm -rf "$SHM"
if [ $fail -eq 0 ]; then rm -rf "$T"; echo "offload_bench: pass"; else echo "offload_bench: FAILED (kept $T)"; fi
exit $fail
