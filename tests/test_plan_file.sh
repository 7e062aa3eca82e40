#!/usr/bin/env bash
# test_plan_file.sh - a saved plan (plan.h, "plan files") end to end: strata plan -o writes
# the document --json prints; a streamed strata train saves the plan it ran to
# RUN_DIR/plan.json, and --plan FILE runs that plan again bit for bit (losses, gradient
# norms, the final weights); a hand-written plan (every block recomputed, no
# device_budget: the file's is used) runs and its log says so; bad files are refused
# naming the file, the key and what to do, and a plan that does not fit a smaller
# device_budget is refused naming the bytes missing. The key 'act' fixes blocks' activation
# choices in strata plan and strata train alike (the rest still planned), and is refused
# naming the key and the bytes missing where no plan with them fits. A saved plan is predicted
# again on this machine (the file's and this machine's steps logged, this machine's saved);
# a disk-state resume with the same state_paths reuses its last start's probe of the paths.
set -u
S=${STRATA_BIN:?STRATA_BIN not set}
command -v jq >/dev/null || { echo "jq not installed: skipped"; exit 77; }
T=$(mktemp -d /tmp/strata-test-plan-file-XXXXXX)
fail=0
check() { if ! eval "$1"; then echo "FAIL: $2"; fail=1; fi; }

A="--model gpt2-tiny --n_embd 128 --n_layer 4 --vocab_size 256 --max_seq 32 --batch 2 --seq 32"
R="--steps 3 --eval_every 0 --sample_every 0 --quiet 1"
B=6e6 # the planner streams here: every choice of keep, offload and recompute fits, the head resident

# strata plan -o: the same text as --json, a document a reader takes
"$S" plan $A --device_budget $B --json -o "$T/plan.json" --save_profile "$T/prof.json" >"$T/plan.out" 2>"$T/plan.err"; rc=$?
if [ $rc -eq 2 ] && grep -q GLPK "$T/plan.out" "$T/plan.err"; then
    echo "built without GLPK: no planner: skipped"; rm -rf "$T"; exit 77
fi
check '[ $rc -eq 0 ]' "strata plan -o failed ($rc): $(cat "$T/plan.err")"
check 'cmp -s "$T/plan.json" "$T/plan.out"' "-o writes what --json prints"
check 'jq -e ".strata_plan == 1 and .arch == \"gpt2\" and .n_blocks == 4 and .n_embd == 128 and .vocab_size == 256 and
      .batch == 2 and .seq == 32 and .device_budget == 6000000 and .device_bytes <= 6000000 and (.blocks | length) == 4 and
      .prefetch_depth >= 1 and .vocab_chunk == 0 and .overlap_optim == true and .clip == \"auto\" and
      .grad_dtype == \"f32\" and .optim_threads == 1 and .predicted.step_s > 0 and .n_params > 0" "$T/plan.json" >/dev/null' \
  "the plan document's fields: $(cat "$T/plan.json")"
# a saved profile holds every figure to the last bit: the plan made from it is the plan made where it was measured
# (the memory account's host tier aside: its budget is MemAvailable now)
"$S" plan $A --device_budget $B --profile "$T/prof.json" --json >"$T/again.json" 2>"$T/again.err"; rc=$?
check '[ $rc -eq 0 ] && [ "$(jq -c "del(.solve_s, .memory.tiers.host)" "$T/again.json")" = "$(jq -c "del(.solve_s, .memory.tiers.host)" "$T/plan.json")" ]' \
  "the plan from the saved profile is the plan made where it was measured ($rc): $(jq -c .predicted "$T/again.json" "$T/plan.json" 2>&1 | head -2)"
"$S" plan $A --device_budget $B --profile "$T/prof.json" -o "$T/plan_text.json" >"$T/plan_text.out" 2>&1; rc=$?
check '[ $rc -eq 0 ] && grep -q "plan written to $T/plan_text.json" "$T/plan_text.out" &&
       jq -e ".strata_plan == 1 and (.blocks | length) == 4" "$T/plan_text.json" >/dev/null' \
  "-o beside the text report: $(tail -3 "$T/plan_text.out")"
"$S" plan $A --profile "$T/prof.json" -o "$T/nobudget.json" >"$T/nob.out" 2>&1; rc=$?
check '[ $rc -eq 2 ] && grep -q "device_budget" "$T/nob.out" && [ ! -e "$T/nobudget.json" ]' \
  "-o without --device_budget is refused: $(cat "$T/nob.out")"
"$S" plan $A --device_budget 3e6 --profile "$T/prof.json" --json -o "$T/nofit.json" >"$T/nofit.out" 2>"$T/nofit.err"; rc=$?
check '[ $rc -eq 3 ] && [ ! -e "$T/nofit.json" ] && grep -q "not written" "$T/nofit.err"' \
  "no plan fits 3e6: nothing written, exit 3 ($rc): $(cat "$T/nofit.err")"

# plan_head: fastest is never predicted slower than resident (the default) on the same profile
"$S" plan $A --device_budget $B --profile "$T/prof.json" --plan_head fastest --json >"$T/fast.json" 2>"$T/fast.err"; rc=$?
check '[ $rc -eq 0 ] && jq -e --slurpfile r "$T/plan.json" ".predicted.step_s <= \$r[0].predicted.step_s * (1 + 1e-9)" "$T/fast.json" >/dev/null' \
  "plan_head fastest is no slower than resident ($rc): $(jq -c .predicted "$T/fast.json" "$T/plan.json" 2>&1 | head -2)"
"$S" plan $A --device_budget $B --profile "$T/prof.json" --plan_head banana >"$T/ph.out" 2>&1; rc=$?
check '[ $rc -eq 2 ] && grep -q "key .plan_head.: .banana. is not resident or fastest" "$T/ph.out"' \
  "plan_head banana refused naming the key ($rc): $(cat "$T/ph.out")"

# the planner's run saves its plan; --plan RUN_DIR/plan.json runs it again bit for bit
"$S" train $A $R --device_budget $B --run_dir "$T/auto" >"$T/auto.log" 2>&1; rc=$?
check '[ $rc -eq 0 ] && jq -e ".strata_plan == 1 and .device_budget == 6000000 and .device_bytes <= 6000000" "$T/auto/plan.json" >/dev/null' \
  "plan auto runs and saves RUN_DIR/plan.json ($rc): $(tail -3 "$T/auto.log")"
k=$(jq '[.blocks[] | select(. == "keep")] | length' "$T/auto/plan.json" 2>/dev/null)
o=$(jq '[.blocks[] | select(. == "offload")] | length' "$T/auto/plan.json" 2>/dev/null)
d=$(jq '.prefetch_depth' "$T/auto/plan.json" 2>/dev/null)
check 'grep -q "planner: $k keep, $o offload, .* prefetch depth $d, vocab_chunk 0" "$T/auto.log"' \
  "the saved plan is the one the planner chose: $(grep planner "$T/auto.log") vs $(cat "$T/auto/plan.json")"
"$S" train $A $R --device_budget $B --plan "$T/auto/plan.json" --run_dir "$T/file" >"$T/file.log" 2>&1; rc=$?
check '[ $rc -eq 0 ] && grep -q "plan: $T/auto/plan.json ($k keep, $o offload, .*prefetch depth $d, vocab_chunk 0; .* made for a budget of 6000000" "$T/file.log"' \
  "--plan FILE runs the file's plan ($rc): $(cat "$T/file.log")"
check '! grep -q "planner:" "$T/file.log"' "--plan FILE does not run the planner"
# a resume under plan auto runs the plan its run ran (a plan made anew could chunk the
# vocabulary otherwise: not bit-exact); with another device_budget it plans anew, and says so
cp -r "$T/auto" "$T/auto1" && cp -r "$T/auto" "$T/auto2"
"$S" train $A $R --steps 4 --device_budget $B --run_dir "$T/auto1" --resume "$T/auto1" >"$T/resume.log" 2>&1; rc=$?
check '[ $rc -eq 0 ] && grep -q "plan: $T/auto1/plan.json ($k keep, $o offload, .*prefetch depth $d, vocab_chunk 0;" "$T/resume.log" &&
       ! grep -q "planner:" "$T/resume.log"' "a resume runs its run's plan ($rc): $(grep -E "plan|resumed" "$T/resume.log")"
"$S" train $A $R --steps 4 --device_budget 7e6 --run_dir "$T/auto2" --resume "$T/auto2" >"$T/resume2.log" 2>&1; rc=$?
check '[ $rc -eq 0 ] && grep -q "plans anew (its last plan, $T/auto2/plan.json: it was made for another device_budget)" "$T/resume2.log" &&
       grep -q "planner:" "$T/resume2.log"' "a resume with another budget plans anew ($rc): $(grep -E "plan|resumed" "$T/resume2.log")"
# the file's plan predicted again on this machine: both logged, the new one saved
x=$(sed -n 's/.*predicted on this machine \([0-9.]*\) s a step (the file: .*/\1/p' "$T/file.log")
y=$(jq .predicted.step_s "$T/auto/plan.json" | awk '{ printf "%.3f", $1 }')
check '[ -n "$x" ] && grep -q "(the file: $y s a step)" "$T/file.log" &&
       [ "$(jq .predicted.step_s "$T/file/plan.json" | awk "{ printf \"%.3f\", \$1 }")" = "$x" ]' \
  "--plan FILE: the file's prediction ($y s) and this machine's ($x s) logged, this machine's saved: $(grep "plan: " "$T/file.log")"
losses() { jq -c '[.step, .loss, .grad_norm]' "$1/metrics.jsonl" 2>/dev/null; }
W=checkpoints/step_00000003/model.safetensors
check '[ -n "$(losses "$T/auto")" ] && [ "$(losses "$T/auto")" = "$(losses "$T/file")" ]' \
  "losses and norms equal: $(losses "$T/auto") vs $(losses "$T/file")"
check 'cmp -s "$T/auto/$W" "$T/file/$W"' "final weights equal bit for bit"
check 'jq -e ".blocks" "$T/auto/plan.json" >"$T/b1" && jq -e ".blocks" "$T/file/plan.json" >"$T/b2" && cmp -s "$T/b1" "$T/b2"' \
  "the file run saves the same plan"

# strata plan's file runs as written (its prediction made up: the run saves its own)
jq '.predicted.step_s = 123.5' "$T/plan.json" >"$T/far.json"
"$S" train $A $R --device_budget $B --plan "$T/far.json" --run_dir "$T/planned" >"$T/planned.log" 2>&1; rc=$?
k2=$(jq '[.blocks[] | select(. == "keep")] | length' "$T/plan.json")
check '[ $rc -eq 0 ] && grep -q "plan: $T/far.json ($k2 keep, " "$T/planned.log"' \
  "strata plan -o's file runs ($rc): $(tail -3 "$T/planned.log")"
check 'grep -q "plan: $T/far.json predicted on this machine [0-9.]* s a step (the file: 123.500 s a step)" "$T/planned.log" &&
       jq -e ".predicted.step_s > 0 and .predicted.step_s != 123.5" "$T/planned/plan.json" >/dev/null' \
  "a file's prediction is not kept: RUN_DIR/plan.json has this machine's: $(grep "predicted" "$T/planned.log")"

# a hand-written plan: every block recomputed, depth 1, no prediction; no device_budget: the file's
jq '.blocks = ["recompute","recompute","recompute","recompute"] | .prefetch_depth = 1 | del(.predicted) | del(.device_bytes) | del(.profile)' \
  "$T/plan.json" >"$T/recompute.json"
"$S" train $A $R --plan "$T/recompute.json" --run_dir "$T/rec" >"$T/rec.log" 2>&1; rc=$?
check '[ $rc -eq 0 ] && grep -q "device_budget 6000000 bytes, the budget of plan file $T/recompute.json" "$T/rec.log" &&
       grep -q "plan: $T/recompute.json (0 keep, 0 offload, 4 recompute, prefetch depth 1, vocab_chunk 0; .*no prediction)" "$T/rec.log" &&
       grep -q "activations (blocks 0-3 recompute)" "$T/rec.log" &&
       grep -q "plan: $T/recompute.json predicted on this machine [0-9.]* s a step (the file: no prediction)" "$T/rec.log" &&
       jq -e ".predicted.step_s > 0" "$T/rec/plan.json" >/dev/null' "the all-recompute plan runs and its log says so ($rc): $(cat "$T/rec.log")"
# every plan with the head resident is the in-memory step bit for bit, so the same run
check '[ "$(losses "$T/auto")" = "$(losses "$T/rec")" ] && cmp -s "$T/auto/$W" "$T/rec/$W"' \
  "the recompute plan's run equals the planner's: $(losses "$T/rec")"

# the run's own keys constrain a saved plan: a disk state runs it (its device bytes are the
# run's)
mkdir -p "$T/st" "$T/st2"
"$S" train $A $R --plan "$T/recompute.json" --state_paths "$T/st" --run_dir "$T/disk" >"$T/disk.log" 2>&1; rc=$?
check '[ $rc -eq 0 ] && grep -q "plan: $T/recompute.json (0 keep, 0 offload, 4 recompute" "$T/disk.log" &&
       [ "$(losses "$T/auto")" = "$(losses "$T/disk")" ]' "the plan with a disk state ($rc): $(tail -3 "$T/disk.log")"
check 'grep -q "plan: $T/recompute.json predicted on this machine [0-9.]* s a step with the state on disk" "$T/disk.log" &&
       grep -q "plan: the disk state: each path.s bandwidth probed now" "$T/disk.log" &&
       jq -e ".disk.probed == true and .disk.reused == false and .disk.state_paths == \"$T/st\"" "$T/disk/plan.json" >/dev/null' \
  "the file's plan with a disk state predicted, the path probed: $(grep "plan: " "$T/disk.log") $(jq -c .disk "$T/disk/plan.json")"
# a resume with the same state_paths takes the path's figures its last start saved: no probe
bw=$(jq -c .disk.mixed_bytes_per_s "$T/disk/plan.json")
"$S" train $A $R --steps 4 --plan "$T/recompute.json" --state_paths "$T/st" --run_dir "$T/disk" --resume "$T/disk" \
  >"$T/disk2.log" 2>&1; rc=$?
check '[ $rc -eq 0 ] && grep -q "as the run.s last start probed it" "$T/disk2.log" && ! grep -q "probed now" "$T/disk2.log" &&
       jq -e ".disk.reused == true" "$T/disk/plan.json" >/dev/null && [ "$(jq -c .disk.mixed_bytes_per_s "$T/disk/plan.json")" = "$bw" ]' \
  "a resume reuses the probe ($rc): $(grep -E "plan: |resumed" "$T/disk2.log") $(jq -c .disk "$T/disk/plan.json")"
jq '.grad_dtype = "bf16"' "$T/recompute.json" >"$T/bf16.json"

# refusals: the file, the key, what to do
refused() { # name, extra args, what the message must hold
    local what=$1 want=$3 rc
    "$S" train $A $R --device_budget $B --run_dir "$T/refused" $2 >"$T/ref.log" 2>&1
    rc=$?
    check '[ $rc -ne 0 ] && grep -q -- "$want" "$T/ref.log"' "$what: refused naming '$want' ($rc): $(cat "$T/ref.log")"
}
bad() { jq "$1" "$T/plan.json" >"$T/$2.json"; }
refused "a missing file" "--plan $T/nope.json" "plan file $T/nope.json: cannot open"
printf '{"strata_plan": 1, "blocks": [' >"$T/notjson.json"
refused "not JSON" "--plan $T/notjson.json" "plan file $T/notjson.json: not valid JSON"
refused "a run configuration, not a plan" "--plan $T/auto/config.json" "no \"strata_plan\" version key"
bad '.n_blocks = 3 | .blocks = .blocks[0:3]' nblocks
refused "another n_blocks" "--plan $T/nblocks.json" "key 'n_blocks': the plan was made for a model with n_blocks 3, this run's has 4"
bad '.blocks = .blocks[0:3]' short
refused "too few blocks" "--plan $T/short.json" "key 'blocks' has 3 entries"
bad '.batch = 4' batch
refused "another batch" "--plan $T/batch.json" "key 'batch': the plan was made for batch 4, this run has batch 2"
bad '.seq = 16' seq
refused "another seq" "--plan $T/seq.json" "key 'seq': the plan was made for seq 16"
bad '.blocks[1] = "kep"' act
refused "an unknown act" "--plan $T/act.json" "key 'blocks': entry 1 is 'kep'; each entry is \"keep\", \"offload\" or \"recompute\""
bad '.prefetch_dept = 1' typo
refused "a misspelt key" "--plan $T/typo.json" "unknown key 'prefetch_dept'"
bad '.vocab_chunk = 257' vchunk
refused "vocab_chunk above the vocabulary" "--plan $T/vchunk.json" "key 'vocab_chunk': 257 is outside \[0, 256\]"
bad '.prefetch_depth = "2"' ptype
refused "a string for a number" "--plan $T/ptype.json" "key 'prefetch_depth' must be an integer, not string"
bad '.clip = "sometimes"' clip
refused "an unknown clip" "--plan $T/clip.json" "key 'clip': 'sometimes' is not speculate, defer or auto"
refused "a file that holds no plan" "--plan $T/nofit.out" "holds no plan"
bad '.disk = {"state_budget": -5}' sbneg
refused "a negative disk.state_budget" "--plan $T/sbneg.json" "key 'disk.state_budget' must be a positive whole number of bytes, not -5"
bad '.disk = {"state_budget": "1GiB"}' sbstr
refused "a string for disk.state_budget" "--plan $T/sbstr.json" "key 'disk.state_budget' must be a positive whole number of bytes, not \"1GiB\""
# a bf16 drain with the disk state: the store reads the blocks' gradients as bf16, the run
# equals the same plan with the state in RAM
"$S" train $A $R --plan "$T/bf16.json" --run_dir "$T/b16ram" >"$T/b16ram.log" 2>&1; rc1=$?
"$S" train $A $R --plan "$T/bf16.json" --state_paths "$T/st2" --run_dir "$T/b16disk" >"$T/b16disk.log" 2>&1; rc2=$?
check '[ $rc1 -eq 0 ] && [ $rc2 -eq 0 ] && [ -n "$(losses "$T/b16ram")" ] && [ "$(losses "$T/b16ram")" = "$(losses "$T/b16disk")" ]' \
  "a bf16 drain with the disk state ($rc1 $rc2): $(losses "$T/b16ram") vs $(losses "$T/b16disk") $(tail -2 "$T/b16disk.log")"
need=$(jq '.device_bytes' "$T/rec/plan.json" 2>/dev/null)
"$S" train $A $R --device_budget $((need - 1000)) --plan "$T/recompute.json" --run_dir "$T/refused" >"$T/small.log" 2>&1; rc=$?
check '[ $rc -ne 0 ] && grep -q "plan file $T/recompute.json needs $need device bytes in this run, device_budget is $((need - 1000)): 1000 bytes missing" "$T/small.log"' \
  "a smaller device_budget than the plan needs is refused naming the bytes ($rc): $(cat "$T/small.log")"
"$S" train $A $R --device_budget $need --plan "$T/recompute.json" --run_dir "$T/exact" >"$T/exact.log" 2>&1; rc=$?
check '[ $rc -eq 0 ]' "the plan runs at exactly its device bytes ($rc): $(tail -3 "$T/exact.log")"

# key 'act': explicit choices constrain the program (the rest still chosen) in strata plan and
# strata train alike; choices no plan within the budget can make are refused naming the key
# and the bytes missing (the same count in both); a saved plan that differs is refused
"$S" plan $A --device_budget $B --profile "$T/prof.json" --act 0:recompute,1:offload --json >"$T/act.json" 2>"$T/act.err"; rc=$?
check '[ $rc -eq 0 ] && jq -e ".blocks[0] == \"recompute\" and .blocks[1] == \"offload\"" "$T/act.json" >/dev/null' \
  "strata plan --act 0:recompute,1:offload ($rc): $(cat "$T/act.json" "$T/act.err")"
"$S" plan $A --device_budget $B --profile "$T/prof.json" --act 0:recompute,1:offload >"$T/act.txt" 2>&1
check 'grep -q "fixed by key .act. (2 of 4 blocks; the rest chosen): block 0 recompute, block 1 offload" "$T/act.txt"' \
  "strata plan prints the fixed choices: $(grep -A3 "device plan" "$T/act.txt")"
"$S" train $A $R --device_budget $B --act 0:recompute,1:offload --run_dir "$T/actrun" >"$T/actrun.log" 2>&1; rc=$?
check '[ $rc -eq 0 ] && jq -e ".blocks[0] == \"recompute\" and .blocks[1] == \"offload\"" "$T/actrun/plan.json" >/dev/null &&
       grep -q "planner: " "$T/actrun.log"' "strata train --act runs the planner with the choices ($rc): $(tail -3 "$T/actrun.log")"
"$S" plan $A --device_budget 4.6e6 --profile "$T/prof.json" --act keep >"$T/actno.txt" 2>&1; rc=$?
miss=$(grep -o "needs [0-9]*, [0-9]* bytes missing" "$T/actno.txt" | grep -o "[0-9]* bytes missing")
check '[ $rc -eq 3 ] && [ -n "$miss" ] && grep -q "key .act.: plan: the fixed activation choices (blocks 0-3 keep)" "$T/actno.txt"' \
  "strata plan --act keep at 4.6e6 refused naming the key and the bytes missing ($rc): $(grep "key" "$T/actno.txt")"
"$S" train $A $R --device_budget 4.6e6 --act keep --run_dir "$T/refused" >"$T/actno.log" 2>&1; rc=$?
check '[ $rc -ne 0 ] && [ -n "$miss" ] && grep -q "key .act.: plan: the fixed activation choices (blocks 0-3 keep).*, $miss" "$T/actno.log"' \
  "strata train --act keep at 4.6e6 refused naming the key and $miss ($rc): $(cat "$T/actno.log")"
refused "act without a budget's plan" "--act 0-9:keep" "key 'act': item '0-9:keep': blocks 0-9, the model has blocks 0-3"
refused "act against a saved plan" "--plan $T/recompute.json --act 2:keep" "key 'act': block 2 keep, but plan file $T/recompute.json has it recompute"
"$S" train $A $R --act keep --run_dir "$T/refused" >"$T/actmem.log" 2>&1; rc=$?
check '[ $rc -ne 0 ] && grep -q "key .act. fixes activation choices of the layer-streaming plan: give device_budget" "$T/actmem.log"' \
  "act in memory refused naming the key ($rc): $(cat "$T/actmem.log")"

[ $fail -eq 0 ] && rm -rf "$T"
exit $fail
