#!/usr/bin/env bash
# test_forecast_cli.sh - strata forecast RUN_DIR on a run directory written here: a WSD run's
# config.json and a metrics.jsonl whose val_loss follows the law with known parameters
# (its areas summed by awk, independently of the library): the parameters and the final
# loss come back, --up_to fits what the run knew then, a record cut short at the end (a run
# still writing) is skipped, a malformed record is refused naming its line, too few points
# and bad arguments are refused, a probe anneal's points fit C, a probe with other keys is refused.
set -u
bin=${STRATA_BIN:-build/strata}
[ -x "$bin" ] || { echo "no strata binary at $bin"; exit 77; }
command -v jq >/dev/null || { echo "jq is missing (tools/setup.sh installs it)"; exit 77; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
check() { if eval "$1" >/dev/null; then :; else echo "FAIL: $2"; fail=1; fi; }
run=$tmp/run
mkdir -p "$run"
cat > "$run/config.json" <<'JSON'
{"schedule": "wsd", "decay_shape": "1-sqrt", "decay_frac": 0.2, "steps": 2000, "warmup_steps": 50, "lr": 0.003, "min_lr_frac": 0.1}
JSON
# L(s) = 2 + 1.5 S1^-0.45 - 0.004 S2; every step's record, val_loss every 20 steps
awk 'BEGIN { lr = 0.003; L0 = 2; A = 1.5; al = 0.45; C = 0.004; m = 0; s1 = 0; s2 = 0; prev = -1
  for (s = 1; s <= 2000; s++) {
    if (s <= 50) e = s / 50; else if (s <= 1600) e = 1; else { p = (s - 1600) / 400; e = 0.1 + 0.9 * (1 - sqrt(p)) }
    if (prev < 0) prev = e
    d = prev - e; if (d < 0) d = 0
    m = 0.999 * m + d; s1 += e; s2 += m; prev = e
    L = L0 + A * s1 ^ (-al) - C * s2
    v = (s % 20 == 0) ? sprintf(",\"val_loss\":%.6f", L) : ""
    printf "{\"step\":%d,\"loss\":%.6f,\"lr\":%.6e,\"step_ms\":100.000,\"achieved_gflops\":10.000%s}\n", s, L, e * lr, v
  } }' > "$run/metrics.jsonl"
out=$("$bin" forecast "$run" --json)
check '[ $? -eq 0 ]' "forecast exit status"
check "echo '$out' | jq -e '.state == \"ok\" and (.L0 - 2 | fabs) < 0.02 and (.alpha - 0.45 | fabs) < 0.0045 and (.C - 0.004 | fabs) < 0.00004 and .annealed'" "parameters: $out"
final=$(jq -r 'select(.step == 2000) | .val_loss' "$run/metrics.jsonl")
check "echo '$out' | jq -e --argjson f $final '(.loss_end - \$f | fabs) < 1e-3 and .flops_per_step == 1e9 and .points == 100'" "end: $out"
# what the run knew at step 1000: no annealing yet (C fixed at 0), the forecast of the end
# is the curve without the decay's drop
out=$("$bin" forecast "$run" --json --up_to 1000)
check "echo '$out' | jq -e '.state == \"ok\" and (.annealed | not) and .last_step == 1000 and .crossing_step > 1000'" "up_to 1000: $out"
# a probe anneal: the run's own decay as the probe (its keys the same, its decay from step
# 1600): fitted to step 1000 with the probe's points after 1600, C is fitted and the end comes back
mkdir -p "$tmp/probe" && cp "$run/config.json" "$run/metrics.jsonl" "$tmp/probe/"
out=$("$bin" forecast "$run" --json --up_to 1000 --probe "$tmp/probe")
check "echo '$out' | jq -e --argjson f $final '.state == \"ok\" and .annealed and .probe_points == 20 and .probe_fork == 1600 and .probe_steps == 400 and .probe_flops_frac == 0.2 and (.C - 0.004 | fabs) < 0.0004 and (.loss_end - \$f | fabs) < 2e-3'" "probe: $out"
# a probe with another peak rate is refused naming the key; one without an evaluation in its decay too
sed 's/"lr": 0.003/"lr": 0.002/' "$run/config.json" > "$tmp/probe/config.json"
msg=$("$bin" forecast "$run" --up_to 1000 --probe "$tmp/probe" 2>&1)
check '[ $? -eq 1 ]' "a probe with another lr: exit 1"
check 'echo "$msg" | grep -q "key .lr. differs"' "a probe's lr named: $msg"
cp "$run/config.json" "$tmp/probe/config.json" && head -1500 "$run/metrics.jsonl" > "$tmp/probe/metrics.jsonl"
msg=$("$bin" forecast "$run" --up_to 1000 --probe "$tmp/probe" 2>&1)
check '[ $? -eq 1 ]' "a probe without annealed points: exit 1"
check 'echo "$msg" | grep -q "no evaluation after its decay"' "a probe without annealed points said: $msg"
# a record cut short at the end is a run still writing
head -c -30 "$run/metrics.jsonl" > "$tmp/m" && cp "$tmp/m" "$run/metrics.jsonl"
check "\"$bin\" forecast \"$run\" --json | jq -e '.last_step == 1999'" "a cut last line is skipped"
# a malformed record inside is refused naming the line
sed -i '7s/.*/{"step":/' "$run/metrics.jsonl"
msg=$("$bin" forecast "$run" 2>&1)
check '[ $? -eq 1 ]' "a malformed line: exit 1"
check 'echo "$msg" | grep -q "metrics.jsonl:7:"' "a malformed line named: $msg"
# too few points: 3
head -60 "$run/metrics.jsonl" | sed 7d > "$tmp/m" && cp "$tmp/m" "$run/metrics.jsonl"
msg=$("$bin" forecast "$run" 2>&1)
check '[ $? -eq 3 ]' "too few points: exit 3"
check 'echo "$msg" | grep -q "too few points"' "too few points said: $msg"
for bad in "--threshold -1" "--threshold nan" "--up_to 0" "--from x" "--bogus"; do
  "$bin" forecast "$run" $bad >/dev/null 2>&1
  check '[ $? -eq 2 ]' "argument $bad refused"
done
"$bin" forecast "$tmp/none" >/dev/null 2>&1
check '[ $? -eq 1 ]' "a missing run directory"
[ $fail -eq 0 ] && echo "forecast_cli: passed"
exit $fail
