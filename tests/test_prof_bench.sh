#!/usr/bin/env bash
# test_prof_bench.sh - strata bench trace, tiny: it runs, traces odd steps and not even
# ones, and prints the medians and the overhead as one JSON object whose numbers agree
# with each other (overhead = traced / untraced - 1). The figure itself is measured at full size for
# docs/BENCHMARKS.md; here only that the benchmark works.
set -u
S=${STRATA_BIN:?}
T=$(mktemp -d /tmp/strata-bench-trace-test-XXXXXX)
fail=0; checks=0
check() { checks=$((checks+1)); if ! eval "$1"; then echo "FAIL: $2"; fail=$((fail+1)); fi; }
command -v jq >/dev/null || { echo "no jq: skipped"; exit 77; }

"$S" bench trace --model gpt2-mini --batch 2 --seq 16 --steps 6 --runs 2 --keep "$T/runs" --json >"$T/out.json" 2>"$T/err.txt"
check '[ $? -eq 0 ]' "bench trace runs"
check 'jq -e ".step_s_traced > 0 and .step_s_untraced > 0" "$T/out.json" >/dev/null' "medians present and positive"
check 'jq -e "((.step_s_traced / .step_s_untraced - 1) - .overhead) | fabs < 1e-4" "$T/out.json" >/dev/null' "overhead = traced/untraced - 1"
# steps 2..6 of each run are timed: 3, 5 traced; 2, 4, 6 untraced
check 'jq -e ".steps_traced == 4 and .steps_untraced == 6 and .runs == 2" "$T/out.json" >/dev/null' "2 runs: 4 traced, 6 untraced steps"
check '[ -s "$T/runs/run_0/trace.json" ] && [ -s "$T/runs/run_1/trace.json" ]' "both runs wrote traces"
tr="$T/runs/run_1/trace.json"
check 'jq -e . "$tr" >/dev/null' "a second trace in the same process is valid JSON"
check '[ "$(jq -c "[.traceEvents[] | select(.name | test(\"^step [0-9]+$\")) | .name] | sort" "$tr")" = "[\"step 1\",\"step 3\",\"step 5\"]" ]' \
  "odd steps only, and only this run's"
check '[ "$(jq -s "[.[] | select(.traced)] | length" "$T/runs/run_1/metrics.jsonl")" -eq 3 ]' "metrics mark the traced steps"

echo "prof_bench: $checks checks, $((checks-fail)) passed, $fail failed"
[ $fail -eq 0 ] && rm -rf "$T"
[ $fail -eq 0 ]
