#!/usr/bin/env bash
# test_plan_disk_cli.sh - with the training state on disk (state_paths) strata plan and
# strata train predict the plan's step alike (st_train_plan_predict: the plan printed is
# the plan run): a 2-step streamed train with a hand-written strata probe profile saves
# RUN_DIR/plan.json and RUN_DIR/plan_profile.json; strata plan --json with the same keys and
# that machine profile prints the same plan and the same predicted step (to the CRC-32C
# rate, measured by each), and the same store figures. A slow disk (5 MB/s in the profile)
# predicts a step far longer than the state in RAM. Without --state_profile strata plan
# probes nothing and says the disk's time is not predicted. No probe runs here.
set -u
S=${STRATA_BIN:?STRATA_BIN not set}
command -v jq >/dev/null || { echo "jq not installed: skipped"; exit 77; }
T=$(mktemp -d /tmp/strata-test-plan-disk-XXXXXX)
fail=0
check() { if ! eval "$1"; then echo "FAIL: $2"; fail=1; fi; }

A="--model gpt2-tiny --n_embd 128 --n_layer 4 --vocab_size 256 --max_seq 32 --batch 2 --seq 32 --device_budget 6e6"
mkdir -p "$T/state"
# what strata probe -o writes, by hand: the path at 0.01 GB/s mixed
printf '{"paths": [{"path": "%s", "engine": "threads", "direct": false, "memory": false, "read_gbps": 0.01, "write_gbps": 0.01, "mixed_gbps": 0.005, "request_bytes": 1048576, "depth": 4, "bytes": 67108864}]}\n' \
  "$T/state" >"$T/probe.json"
D="--state_paths $T/state --state_profile $T/probe.json"

"$S" train $A $D --steps 2 --eval_every 0 --sample_every 0 --run_dir "$T/run" >"$T/train.log" 2>&1; rc=$?
if [ $rc -ne 0 ] && grep -q GLPK "$T/train.log"; then echo "built without GLPK: skipped"; rm -rf "$T"; exit 77; fi
check '[ $rc -eq 0 ] && [ -s "$T/run/plan.json" ] && [ -s "$T/run/plan_profile.json" ]' \
  "the disk-state train runs and saves its plan and profile ($rc): $(tail -3 "$T/train.log")"
check 'grep -q "planner: the disk state: the paths. bandwidth from state_profile" "$T/train.log" &&
       grep -q "predicted .* s a step with the state on disk" "$T/train.log"' \
  "train logs the disk prediction: $(grep planner "$T/train.log")"

"$S" plan $A $D --profile "$T/run/plan_profile.json" --json >"$T/plan.json" 2>"$T/plan.err"; rc=$?
check '[ $rc -eq 0 ]' "strata plan failed ($rc): $(cat "$T/plan.err")"
check '[ "$(jq -c .blocks "$T/plan.json")" = "$(jq -c .blocks "$T/run/plan.json")" ] &&
       [ "$(jq .prefetch_depth "$T/plan.json")" = "$(jq .prefetch_depth "$T/run/plan.json")" ]' \
  "the same plan: $(jq -c .blocks "$T/plan.json") vs $(jq -c .blocks "$T/run/plan.json")"
p=$(jq .predicted.step_s "$T/plan.json"); r=$(jq .predicted.step_s "$T/run/plan.json")
check 'jq -en --argjson p "$p" --argjson r "$r" "\$p > 0 and ((\$p - \$r) | fabs) <= 1e-3 * \$r" >/dev/null' \
  "the same predicted step: strata plan $p s, strata train $r s"
check '[ "$(jq -c "[.disk.io_s, .disk.beside, .disk.probed, .disk.mixed_bytes_per_s]" "$T/plan.json")" = \
         "$(jq -c "[.disk.io_s, .disk.beside, .disk.probed, .disk.mixed_bytes_per_s]" "$T/run/plan.json")" ] &&
       jq -e ".disk.probed == false and .disk.mixed_bytes_per_s[0] == 5e6 and .disk.io_s > 1" "$T/plan.json" >/dev/null' \
  "the same store figures: $(jq -c .disk "$T/plan.json") vs $(jq -c .disk "$T/run/plan.json")"

# the state in RAM: the same machine, a step far shorter than the slow disk's
"$S" plan $A --profile "$T/run/plan_profile.json" --json >"$T/ram.json" 2>"$T/ram.err"; rc=$?
m=$(jq .predicted.step_s "$T/ram.json")
check '[ $rc -eq 0 ] && jq -en --argjson p "$p" --argjson m "$m" "\$p > \$m + 1" >/dev/null && jq -e "has(\"disk\") | not" "$T/ram.json" >/dev/null' \
  "the slow disk's step $p s is over 1 s longer than the state in RAM's $m s"

# the text report says the same
"$S" plan $A $D --profile "$T/run/plan_profile.json" >"$T/plan.txt" 2>&1; rc=$?
check '[ $rc -eq 0 ] && grep -q "the state on disk: the store .* from '"$T"'/probe.json" "$T/plan.txt"' \
  "the text report names the store's time: $(grep -A1 "predicted step" "$T/plan.txt")"

# no state_profile: strata plan probes nothing and says the time is not predicted
"$S" plan $A --state_paths "$T/state" --profile "$T/run/plan_profile.json" --json >"$T/nop.json" 2>"$T/nop.err"; rc=$?
check '[ $rc -eq 0 ] && jq -e ".disk.unknown | test(\"state_profile\")" "$T/nop.json" >/dev/null &&
       [ "$(jq .predicted.step_s "$T/nop.json")" = "$m" ]' \
  "no state_profile: the disk's time unknown, the state in RAM's step: $(jq -c .disk "$T/nop.json")"

# a plan file with the key "disk" is read: train --plan runs it
"$S" train $A --steps 1 --eval_every 0 --sample_every 0 --plan "$T/run/plan.json" --run_dir "$T/file" >"$T/file.log" 2>&1; rc=$?
check '[ $rc -eq 0 ] && grep -q "plan: $T/run/plan.json" "$T/file.log"' "a plan file with \"disk\" runs ($rc): $(tail -2 "$T/file.log")"
jq '.disk = 3' "$T/run/plan.json" >"$T/bad.json"
"$S" train $A --steps 1 --plan "$T/bad.json" --run_dir "$T/bad" >"$T/bad.log" 2>&1; rc=$?
check '[ $rc -ne 0 ] && grep -q "key .disk. must be an object" "$T/bad.log"' "a non-object \"disk\" is refused: $(tail -2 "$T/bad.log")"

rm -rf "$T"
exit $fail
