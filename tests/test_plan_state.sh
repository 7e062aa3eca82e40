#!/usr/bin/env bash
# test_plan_state.sh - plan_state auto (issue 16): the optimizer state's format and tier
# chosen as the first that fits of f32 in host memory, 8-bit in host memory, f32 on
# state_paths, 8-bit on state_paths; strata plan and strata train choose the same; the
# choice is recorded in config.json as fixed (a resume runs what ran); nothing fitting is
# refused naming each placement's bytes; a bad value is refused by key. The budgets are
# taken from strata plan's own figures, so the test follows the memory model.
set -u
S=${STRATA_BIN:?}
T=$(mktemp -d /tmp/strata-plan-state-XXXXXX)
trap 'rm -rf "$T"' EXIT
fail=0; checks=0
check() { checks=$((checks+1)); if ! eval "$1"; then echo "FAIL: $2"; fail=$((fail+1)); fi; }
mkdir -p "$T/disk"
m="--model gpt2-tiny --vocab_size 256 --batch 2 --seq 16"
need() { sed -n 's/.*(\([0-9]*\) host bytes.*/\1/p' | head -1; }
first() { "$S" plan $m --plan_state auto "$@" 2>&1 | head -1; }

l=$(first --host_budget 1e12); n32=$(echo "$l" | need)
check 'echo "$l" | grep -q "f32 in host memory" && [ -n "$n32" ]' "a large budget: f32 in host memory: $l"
l=$(first --host_budget "$n32"); check 'echo "$l" | grep -q "f32 in host memory"' "exactly f32's bytes: f32: $l"
l=$(first --host_budget $((n32 - 1))); n8=$(echo "$l" | need)
check 'echo "$l" | grep -q "8bit in host memory" && [ "$n8" -lt "$n32" ]' "one byte less: 8-bit in host memory: $l"
l=$(first --host_budget $((n8 - 1)))
check 'echo "$l" | grep -q "no placement" && echo "$l" | grep -q "f32 in host memory needs $n32 host bytes" &&
       echo "$l" | grep -q "8bit in host memory needs $n8 host bytes" && echo "$l" | grep -q "give state_paths"' \
  "nothing fits without state_paths: refused naming each placement's bytes: $l"
# with state_paths and small store buffers the disk placements need less host memory
l=$(first --host_budget $((n8 - 1)) --state_paths "$T/disk" --state_budget 4096)
check 'echo "$l" | grep -q "f32 on state_paths" && echo "$l" | grep -q "disk bytes of"' "the disk: f32 on state_paths: $l"
l=$(first --host_budget 1e12 --state_paths "$T/disk" --state_budget 4096)
check 'echo "$l" | grep -q "f32 in host memory"' "state_paths given but the host fits: host memory first: $l"
l=$("$S" plan $m --plan_state maybe 2>&1 | head -1)
check 'echo "$l" | grep -q "key .plan_state.: .maybe. is not fixed or auto"' "a bad value refused by key: $l"

# strata train runs the choice and records it
"$S" train $m --steps 2 --eval_every 0 --sample_every 0 --ckpt_every 0 --quiet 1 --run_dir "$T/run" \
  --plan_state auto --host_budget $((n32 - 1)) >"$T/train.out" 2>&1; rc=$?
check '[ $rc -eq 0 ] && grep -q "plan_state auto: the optimizer state 8bit in host memory" "$T/train.out"' \
  "strata train chooses as strata plan (rc $rc): $(grep -m1 plan_state "$T/train.out")"
check 'grep -q "\"plan_state\": *\"fixed\"" "$T/run/config.json" && grep -q "\"optim_state\": *\"8bit\"" "$T/run/config.json"' \
  "config.json records the choice as fixed: $(grep -E 'plan_state|optim_state' "$T/run/config.json" | tr -d '\n')"
echo "plan_state: $checks checks, $((checks - fail)) passed, $fail failed"
[ $fail -eq 0 ]
