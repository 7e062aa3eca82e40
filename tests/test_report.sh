#!/usr/bin/env bash
# test_report.sh - strata report on a real short run: the HTML page has its four charts
# (each a well-formed SVG with the run's points), the terminal summary agrees with
# metrics.jsonl, and old or broken run directories give clear errors. How the page looks
# is checked by eye with headless Chromium (docs/BENCHMARKS.md, Profiler), not here.
set -u
S=${STRATA_BIN:?}
T=$(mktemp -d /tmp/strata-report-XXXXXX)
fail=0; checks=0
check() { checks=$((checks+1)); if ! eval "$1"; then echo "FAIL: $2"; fail=$((fail+1)); fi; }
command -v jq >/dev/null || { echo "no jq: skipped"; exit 77; }

"$S" train --model gpt2-mini --n_layer 2 --n_embd 64 --n_head 2 --batch 4 --seq 32 --steps 12 --quiet 1 \
  --run_dir "$T/run" >"$T/train.txt" 2>&1
check '[ $? -eq 0 ]' "training run"
"$S" report "$T/run" >"$T/summary.txt" 2>&1
check '[ $? -eq 0 ] && [ -s "$T/run/report.html" ]' "report writes report.html"
html="$T/run/report.html"
check '[ "$(grep -c "<svg" "$html")" -eq 4 ]' "four charts"
for title in "Loss and learning rate" "Step time by phase" "Memory per tier" "Achieved FLOP/s"; do
  check 'grep -qF "$title" "$html"' "chart '$title'"
done
for phase in "data wait" "forward" "backward" "grad norm" "optimizer" "other"; do
  check 'grep -qF ">$phase</text>" "$html"' "phase '$phase' in the legend"
done
if command -v python3 >/dev/null; then
  python3 - "$html" > "$T/svg.txt" <<'PY'
import re, sys, xml.etree.ElementTree as ET
html = open(sys.argv[1]).read()
for svg in re.findall(r"<svg.*?</svg>", html, re.S):
    root = ET.fromstring(svg)  # raises on malformed SVG
    lines = root.findall("{http://www.w3.org/2000/svg}polyline")
    print(len(lines), max((len(l.get("points").split()) for l in lines), default=0))
PY
  check '[ $? -eq 0 ] && [ $(wc -l < "$T/svg.txt") -eq 4 ]' "every SVG is well-formed XML"
  check '[ "$(head -n 1 "$T/svg.txt")" = "2 12" ]' "loss chart: loss and lr lines of 12 points ($(head -n 1 "$T/svg.txt"))"
fi
final=$(tail -n 1 "$T/run/metrics.jsonl" | jq -r '.loss' | awk '{printf "%.4f", $1}')
check 'grep -q "final $final" "$T/summary.txt"' "summary's final loss is the last line's ($final)"
check 'grep -q "of the measured peak" "$T/summary.txt"' "summary gives the fraction of peak FLOP/s"
check 'grep -q "host peak" "$T/summary.txt"' "summary gives the host memory peak"

# a run written before the profiler (no phase or memory fields) still reports
mkdir -p "$T/old"
for i in 1 2 3; do
  echo "{\"step\":$i,\"loss\":$((6 - i)).5,\"lr\":0.001,\"grad_norm\":1.0,\"step_ms\":100.0,\"tokens_per_s\":1000.0,\"achieved_gflops\":2.0,\"tokens\":$((i * 100)),\"skipped\":false}"
done > "$T/old/metrics.jsonl"
"$S" report "$T/old" >"$T/old.txt" 2>&1
check '[ $? -eq 0 ] && [ "$(grep -c "<svg" "$T/old/report.html")" -eq 4 ]' "an old run still gets four charts"
check 'grep -q "final 3.5000" "$T/old.txt"' "old run's final loss"

"$S" report "$T/missing" >"$T/e1.txt" 2>&1; rc=$?
check '[ $rc -ne 0 ] && grep -q "missing/metrics.jsonl" "$T/e1.txt"' "a missing run directory is named"
mkdir -p "$T/bad"; printf '{"step":1,"loss":2}\nnot json\n{"step":3}\n' > "$T/bad/metrics.jsonl"
"$S" report "$T/bad" >"$T/e2.txt" 2>&1; rc=$?
check '[ $rc -ne 0 ] && grep -q "metrics.jsonl:2" "$T/e2.txt"' "a broken line is named with its number"
"$S" report >/dev/null 2>&1; rc=$?
check '[ $rc -eq 2 ]' "no run directory: usage, exit 2"

echo "report: $checks checks, $((checks-fail)) passed, $fail failed"
[ $fail -eq 0 ] && rm -rf "$T"
[ $fail -eq 0 ]
