#!/usr/bin/env bash
# test_stop_rule.sh - strata train --stop_rule end to end on a small GPT-2: a budget places a
# WSD run's decay so that the run ends within it; a marginal rule starts the decay at an
# evaluation and the run ends a decay later with a checkpoint; a resume from before the
# decision and one from inside the decay end in the same bits as the uninterrupted runs
# (the fit's inputs come back from metrics.jsonl); bad input is refused naming the key
# before the run directory exists.
set -u
S=${STRATA_BIN:?STRATA_BIN not set}
command -v jq >/dev/null || { echo "no jq: skipped"; exit 77; }
T=$(mktemp -d /tmp/strata-stop-XXXXXX)
fail=0
check() { if ! eval "$1"; then echo "FAIL: $2"; fail=$((fail+1)); fi; }
small="--model gpt2-mini --n_layer 2 --n_embd 64 --n_head 2 --batch 4 --seq 32 --quiet 1 --sample_every 0 --eval_tokens 512"
wsd="--schedule wsd --steps 200 --decay_frac 0.2 --warmup_steps 5 --eval_every 5"
last_step() { tail -n 1 "$1/metrics.jsonl" | jq .step; }
# the two runs' final checkpoints (step $3) hold the same weights
weights() { local d; d=checkpoints/step_$(printf %08d "$3"); cmp -s "$1/$d/model.safetensors" "$2/$d/model.safetensors"; }

# the FLOPs of a step, as the run logs them
"$S" train $small $wsd --stop_at 2 --run_dir "$T/probe" >/dev/null 2>&1
fps=$(jq -s 'map(.achieved_gflops * .step_ms * 1e6) | sort | .[length / 2 | floor]' "$T/probe/metrics.jsonl")
budget=$(echo "$fps * 60.5" | bc -l)
# --- budget: the run, its 40-step decay included, ends at step 60
"$S" train $small $wsd --stop_rule budget:$budget --run_dir "$T/b" >"$T/b.out" 2>&1
check '[ $? -eq 0 ] && [ "$(last_step "$T/b")" = 60 ]' "budget: ends at $(last_step "$T/b"): $(tail -2 "$T/b.out")"
check '[ "$(jq -c "select(.end_step) | [.step, .decay_start, .end_step]" "$T/b/metrics.jsonl")" = "[5,20,60]" ]' \
  "budget decision: $(jq -c 'select(.end_step) | [.step, .decay_start, .end_step]' "$T/b/metrics.jsonl")"
check '[ "$(jq -c "select(.step == 20 or .step == 21 or .step == 60) | .lr * 1e6 | round" "$T/b/metrics.jsonl" | tr "\n" " ")" = "3000 2573 300 " ]' \
  "the decay from step 21 to 60: $(jq -r 'select(.step == 20 or .step == 21 or .step == 60) | .lr * 1e6 | round' "$T/b/metrics.jsonl" | tr '\n' ' ')"
check '[ -d "$T/b/checkpoints/step_00000060" ]' "a checkpoint at the end"
# resumed inside the decay: the same bits
"$S" train $small $wsd --stop_rule budget:$budget --stop_at 40 --run_dir "$T/b2" >/dev/null 2>&1
"$S" train --resume "$T/b2" --stop_at 0 >"$T/b2.out" 2>&1
check '[ "$(last_step "$T/b2")" = 60 ] && weights "$T/b" "$T/b2" 60' "budget resumed at 40: $(tail -2 "$T/b2.out")"

# --- marginal: EPS so large that the first fit fires it
"$S" train $small $wsd --stop_rule marginal:1e30 --run_dir "$T/m" >"$T/m.out" 2>&1
k=$(jq -r 'select(.end_step) | .decay_start' "$T/m/metrics.jsonl")
check '[ -n "$k" ] && [ "$k" -gt 5 ] && [ "$(last_step "$T/m")" = $((k + 40)) ]' \
  "marginal: decay after ${k:-none}, last step $(last_step "$T/m"): $(tail -3 "$T/m.out")"
check 'jq -s -e "map(select(.step == $k))[0] | .forecast_final > 0 and .gain_per_pflop > 0" "$T/m/metrics.jsonl" >/dev/null' \
  "the decision's record has its forecast"
check 'jq -s -e "map(select(.step == 10))[0] | .forecast == \"too few points\"" "$T/m/metrics.jsonl" >/dev/null' "too few points at step 10"
# strata report: the forecast chart (the evaluations, the fit and its band, the decision at k
# and the end), well-formed; the summary's forecast line
"$S" report "$T/m" >"$T/m.rep" 2>&1
check '[ $? -eq 0 ] && grep -q "Loss forecast" "$T/m/report.html" && grep -q "^  forecast    loss at step $((k + 40)):" "$T/m.rep"' \
  "report's forecast: $(grep forecast "$T/m.rep")"
if command -v python3 >/dev/null; then
  python3 - "$T/m/report.html" "$k" "$((k + 40))" >"$T/m.svg" 2>&1 <<'PY'
import re, sys, xml.etree.ElementTree as ET
html, k, end = open(sys.argv[1]).read(), sys.argv[2], sys.argv[3]
svg = [s for s in re.findall(r"<svg.*?</svg>", html, re.S) if "Loss forecast" in s][0]
root, ns = ET.fromstring(svg), "{http://www.w3.org/2000/svg}"
vals = [c for c in root.iter(ns + "circle") if c.get("class") == "fval"]
band = [p for p in root.iter(ns + "polygon") if p.get("class") == "band"]
stops = [t.text for t in root.iter(ns + "text") if t.text and t.text.split()[0] in ("decision", "end")]
lines = root.findall(ns + "polyline")
print(len(vals) > 5, len(band) == 1, stops == ["decision " + k, "end " + end], len(lines) == 2)
PY
  check '[ "$(cat "$T/m.svg")" = "True True True True" ]' "the forecast chart: $(cat "$T/m.svg")"
fi
# every run with evaluations forecasts, rule or not: the step line at each evaluation, the
# record, TensorBoard's scalar
"$S" train $small --quiet 0 --log_every 1000 $wsd --stop_at 40 --run_dir "$T/n" >"$T/n.out" 2>&1
check '[ "$(grep -c "| val [0-9.]* (ppl [0-9.]*) | forecast" "$T/n.out")" -eq 8 ] && grep -q "| forecast [0-9.]* +- [0-9.]* at 200" "$T/n.out"' \
  "the step line's forecast: $(grep -c forecast "$T/n.out") lines, $(grep val "$T/n.out" | tail -1)"
check '[ "$(jq -s "map(select(.forecast_final)) | length" "$T/n/metrics.jsonl")" -ge 1 ] && grep -q "forecast/forecast_final" "$T/n"/events.out.tfevents.*' \
  "the forecast in metrics.jsonl and TensorBoard"
# without a rule too, a resume refits from the points read back: the same forecasts as the
# uninterrupted run's (resumed at 40, compared to 80)
"$S" train $small $wsd --stop_at 80 --run_dir "$T/n80" >/dev/null 2>&1
"$S" train --resume "$T/n" --stop_at 80 >/dev/null 2>&1
fc() { jq -c "select(.step > 40 and .forecast_final) | [.step, .forecast_final, .forecast_band]" "$1/metrics.jsonl" | tr '\n' ' '; }
check '[ -n "$(fc "$T/n80")" ] && [ "$(fc "$T/n")" = "$(fc "$T/n80")" ]' "resumed forecasts: $(fc "$T/n") against $(fc "$T/n80")"
# resumed before the decision and inside the decay: the same decision, the same bits
for at in $((k - 3)) $((k + 7)); do
  "$S" train $small $wsd --stop_rule marginal:1e30 --stop_at $at --run_dir "$T/m$at" >/dev/null 2>&1
  "$S" train --resume "$T/m$at" --stop_at 0 >"$T/m$at.out" 2>&1
  check '[ "$(last_step "$T/m$at")" = $((k + 40)) ] && weights "$T/m" "$T/m$at" $((k + 40))' \
    "marginal resumed at $at: last $(last_step "$T/m$at"): $(tail -2 "$T/m$at.out")"
done
# cosine: the rule ends the run where it fires
"$S" train $small --steps 200 --warmup_steps 5 --eval_every 5 --stop_rule marginal:1e30 --run_dir "$T/c" >"$T/c.out" 2>&1
kc=$(jq -r 'select(.end_step) | .end_step' "$T/c/metrics.jsonl")
check '[ -n "$kc" ] && [ "$(last_step "$T/c")" = "$kc" ] && [ -d "$T/c/checkpoints/step_$(printf %08d "$kc")" ]' \
  "cosine: end ${kc:-none}, last $(last_step "$T/c")"

# --- refusals, before the run directory exists
for bad in "--stop_rule marginal:-1|'stop_rule'" "--stop_rule marginal:nan|'stop_rule'" "--stop_rule target:0|'stop_rule'" \
           "--stop_rule budget:abc|'stop_rule'" "--stop_rule often|'stop_rule'" \
           "--stop_rule marginal:0.1 --eval_every 0|'eval_every'" "--stop_rule target:1 --val_data none|'val_data'" \
           "--schedule wsd --decay_frac 0|'decay_frac'" "--schedule linear|'schedule'" "--decay_shape sqrt --schedule wsd|'decay_shape'"; do
  args=${bad%|*} key=${bad#*|}
  rm -rf "$T/x"
  "$S" train $small --steps 20 $args --run_dir "$T/x" >"$T/x.out" 2>&1
  rc=$?
  check '[ $rc -ne 0 ] && grep -q "$key" "$T/x.out" && [ ! -e "$T/x" ]' "$args: rc $rc, $(cat "$T/x.out" | tail -1)"
done
[ $fail -eq 0 ] && rm -rf "$T" && echo "stop_rule: passed"
exit $((fail > 0))
