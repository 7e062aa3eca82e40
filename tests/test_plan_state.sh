#!/usr/bin/env bash
# test_plan_state.sh - plan_state auto (issue 16): of f32 in host memory, 8-bit in host
# memory, f32 on state_paths and 8-bit on state_paths, those that fit the host budget are
# predicted and the fastest taken (a tie to the earlier); a disk placement's time needs
# state_profile, without which one is taken only where no host-memory placement fits.
# strata plan and strata train choose the same; the choice is recorded in config.json as
# fixed (a resume runs what ran); nothing fitting is refused naming each placement's bytes;
# a bad value is refused by key. The budgets come from strata plan's own figures, so the
# test follows the memory model. A slow disk in a hand-written probe profile makes 8-bit on
# state_paths (half the bytes to stream) faster than f32 there: the old first-fit rule
# took f32 on state_paths. The store's host budget (state_budget left 0) is chosen by
# predicted step alike (a larger one on a slow disk with host to spare), used as given when
# given, and recorded by strata train in config.json and plan.json.
set -u
S=${STRATA_BIN:?}
T=$(mktemp -d /tmp/strata-plan-state-XXXXXX)
trap 'rm -rf "$T"' EXIT
fail=0; checks=0
check() { checks=$((checks+1)); if ! eval "$1"; then echo "FAIL: $2"; fail=$((fail+1)); fi; }
mkdir -p "$T/disk" "$T/disk2"
m="--model gpt2-tiny --vocab_size 256 --batch 2 --seq 16"
# the machine measured once (strata train measures its own)
"$S" plan $m --save_profile "$T/hw.json" >/dev/null 2>&1 || { echo "FAIL: strata plan --save_profile"; exit 1; }
plan() { "$S" plan $m --plan_state auto --profile "$T/hw.json" "$@" >"$T/p.out" 2>&1; head -1 "$T/p.out"; }
# a candidate's line: "  f32 in host memory: predicted step 0.0012 s (28178944 host bytes)..."
cand() { grep -m1 "^  $1: " "$T/p.out"; }
bytes() { sed -n 's/.*(\([0-9]*\) host bytes.*/\1/p' | head -1; }
# the chosen line names the fitting placement whose printed step is smallest (the earliest on a tie)
fastest() { awk '/^  .*: predicted step / { for (i = 1; i <= NF; i++) if ($i == "step") t = $(i + 1);
                                         sub(/^  /, ""); sub(/: predicted step.*/, "");
                                         if (best == "" || t + 0 < bt + 0) { best = $0; bt = t } }
                 END { print best }' "$T/p.out"; }
# what strata probe -o writes, by hand: the path at 1 MB/s mixed
printf '{"paths": [{"path": "%s", "engine": "threads", "direct": false, "memory": false, "read_gbps": 0.001, "write_gbps": 0.001, "mixed_gbps": 0.001, "request_bytes": 1048576, "depth": 4, "bytes": 67108864}]}\n' \
  "$T/disk" >"$T/slow.json"

l=$(plan --host_budget 1e12); n32=$(cand "f32 in host memory" | bytes); n8=$(cand "8bit in host memory" | bytes)
f=$(fastest)
check '[ -n "$n32" ] && [ -n "$n8" ] && [ "$n8" -lt "$n32" ] && [ -n "$f" ] && echo "$l" | grep -q "state $f (" &&
       grep -q "^  $f: predicted step .*: chosen" "$T/p.out"' \
  "a large budget: both host placements predicted, the fastest ($f) chosen: $l / $(cat "$T/p.out" | head -4)"
l=$(plan --host_budget "$n32")
check 'cand "f32 in host memory" | grep -q "predicted step"' "exactly f32's bytes: f32 fits: $(cand "f32 in host memory")"
l=$(plan --host_budget $((n32 - 1)))
check 'echo "$l" | grep -q "8bit in host memory" && echo "$l" | grep -q "the only placement that fits" &&
       cand "f32 in host memory" | grep -q "does not fit: f32 in host memory needs $n32 host bytes"' \
  "one byte less: 8-bit in host memory, the only one: $l"
l=$(plan --host_budget $((n8 - 1)))
check 'echo "$l" | grep -q "no placement" && echo "$l" | grep -q "f32 in host memory needs $n32 host bytes" &&
       echo "$l" | grep -q "8bit in host memory needs $n8 host bytes" && echo "$l" | grep -q "give state_paths"' \
  "nothing fits without state_paths: refused naming each placement's bytes: $l"
# with state_paths and small store buffers the disk placements need less host memory; without
# state_profile their time is unknown: the first that fits
l=$(plan --host_budget $((n8 - 1)) --state_paths "$T/disk" --state_budget 4096)
check 'echo "$l" | grep -q "f32 on state_paths" && echo "$l" | grep -q "disk bytes of" &&
       echo "$l" | grep -q "their time is unknown" && cand "8bit on state_paths" | grep -q "time unknown: no state_profile"' \
  "the disk, no state_profile: f32 on state_paths, the first: $l"
l=$(plan --host_budget 1e12 --state_paths "$T/disk" --state_budget 4096)
check 'echo "$l" | grep -q "in host memory" && echo "$l" | grep -q "taken only where no host-memory placement fits" &&
       cand "f32 on state_paths" | grep -q "time unknown"' \
  "state_paths without state_profile but the host fits: host memory: $l"
# the objective against the old order: a slow disk (1 MB/s) streams 8-bit's fewer bytes faster
# (a wider model, whose moments outweigh the store's smallest buffers: three of 1 MiB)
D="--state_paths $T/disk --state_budget 3e6 --state_profile $T/slow.json"
W="--n_embd 256 --n_layer 4 --max_seq 32 --seq 32"
l=$(plan $W --host_budget 1e12 $D); nW8=$(cand "8bit in host memory" | bytes)
l=$(plan $W --host_budget $((nW8 - 1)) $D)
s32=$(cand "f32 on state_paths" | sed -n 's/.*predicted step \([0-9.]*\) s.*/\1/p')
s8=$(cand "8bit on state_paths" | sed -n 's/.*predicted step \([0-9.]*\) s.*/\1/p')
check 'echo "$l" | grep -q "state 8bit on state_paths" && [ -n "$s32" ] && [ -n "$s8" ] &&
       awk -v a="$s8" -v b="$s32" "BEGIN { exit !(a < b) }"' \
  "a slow disk with state_profile: 8-bit on state_paths, predicted faster ($s8 s) than f32 there ($s32 s): $l"
l=$(plan $W --host_budget 1e12 $D)
check 'echo "$l" | grep -q "in host memory" && cand "8bit on state_paths" | grep -q "predicted step"' \
  "the host fits and the slow disk is predicted: host memory: $l"
l=$("$S" plan $m --plan_state maybe 2>&1 | head -1)
check 'echo "$l" | grep -q "key .plan_state.: .maybe. is not fixed or auto"' "a bad value refused by key: $l"

# strata train runs the choice and records it
run() { "$S" train $m --steps 2 --eval_every 0 --sample_every 0 --ckpt_every 0 --quiet 1 --plan_state auto "$@" \
          >"$T/train.out" 2>&1; }
run --run_dir "$T/run" --host_budget $((n32 - 1)); rc=$?
check '[ $rc -eq 0 ] && grep -q "plan_state auto: the optimizer state 8bit in host memory" "$T/train.out"' \
  "strata train chooses as strata plan (rc $rc): $(grep -m1 plan_state "$T/train.out")"
check 'grep -q "\"plan_state\": *\"fixed\"" "$T/run/config.json" && grep -q "\"optim_state\": *\"8bit\"" "$T/run/config.json"' \
  "config.json records the choice as fixed: $(grep -E 'plan_state|optim_state' "$T/run/config.json" | tr -d '\n')"
# the slow disk, layer streaming: plan and train make the same choice from their predictions
# (a wider model, whose 8-bit moments outweigh the store's smallest buffers)
A="--n_embd 256 --n_layer 4 --max_seq 32 --seq 32 --device_budget 2e7"
D="--state_paths $T/disk --state_budget 3e6 --state_profile $T/slow.json"
l=$(plan $A --host_budget 1e12 $D)
nA8=$(cand "8bit in host memory" | bytes)
l=$(plan $A --host_budget $((nA8 - 1)) $D)
check 'echo "$l" | grep -q "state 8bit on state_paths"' "streamed, a slow disk: strata plan takes 8-bit on state_paths: $l"
run $A --run_dir "$T/run2" --host_budget $((nA8 - 1)) $D; rc=$?
if [ $rc -ne 0 ] && grep -q GLPK "$T/train.out"; then echo "built without GLPK: the streamed case skipped"
else
  check '[ $rc -eq 0 ] && grep -q "plan_state auto: the optimizer state 8bit on state_paths" "$T/train.out" &&
         grep -q "f32 on state_paths: predicted step" "$T/train.out"' \
    "streamed, a slow disk: strata train chooses as strata plan (rc $rc): $(grep -m1 -A4 plan_state "$T/train.out")"
  check 'grep -q "\"optim_state\": *\"8bit\"" "$T/run2/config.json" && grep -q "\"state_paths\": *\".*disk\"" "$T/run2/config.json"' \
    "config.json records 8-bit on state_paths: $(grep -E 'state_paths|optim_state' "$T/run2/config.json" | tr -d '\n')"
fi

# the store's host budget (state_budget left 0, plan auto): the planner's choice by predicted
# step. A 124M-parameter state (1.5 GB) on the slow disk with ample host memory: a larger
# budget than the default 256 MiB caches more of it and is predicted faster; given, it is used
G="--model gpt2-124m --batch 1 --seq 64 --device_budget 2e9 --state_paths $T/disk --state_profile $T/slow.json --host_budget 1e12 --profile $T/hw.json"
"$S" plan $G >"$T/b.out" 2>&1
cb=$(sed -n 's/.*the store.s cache: state_budget \([0-9]*\) bytes chosen.*/\1/p' "$T/b.out")
sd=$(sed -n 's/.*state_budget 268435456 (the default): predicted step \([0-9.]*\) s.*/\1/p' "$T/b.out")
sc=$(sed -n 's/.*state_budget '"$cb"'.*: predicted step \([0-9.]*\) s.*: chosen$/\1/p' "$T/b.out")
check '[ -n "$cb" ] && [ "$cb" -gt 268435456 ] && [ -n "$sd" ] && [ -n "$sc" ] &&
       awk -v a="$sc" -v b="$sd" "BEGIN { exit !(a < b) }"' \
  "a slow disk, ample host: a state_budget above the default ($cb), predicted faster ($sc s) than the default's ($sd s): $(grep -A6 "store.s cache" "$T/b.out")"
# the host left for the store is the memory plan's (what train checks, at a resume too): the
# whole state cached fits a host budget of the rest of the run plus its bytes, not one byte less
hn=$(awk '$1 == "host" && $2 ~ /^[0-9]+$/ { print $2; exit }' "$T/b.out")
rest=$((hn - 268435456))
"$S" plan $G --host_budget $((rest + cb)) >"$T/h1.out" 2>&1
"$S" plan $G --host_budget $((rest + cb - 1)) >"$T/h0.out" 2>&1
check '[ -n "$hn" ] && grep -q "state_budget $cb bytes chosen" "$T/h1.out" && grep -q "bytes chosen" "$T/h0.out" &&
       ! grep -q "state_budget $cb bytes chosen" "$T/h0.out"' \
  "the whole state cached within host_budget $((rest + cb)), not one byte less: $(grep "cache: " "$T/h1.out" "$T/h0.out")"
"$S" plan $G --json >"$T/b.json" 2>/dev/null
check 'jq -e ".disk.state_budget == $cb and .disk.state_budget_chosen == true" "$T/b.json" >/dev/null' \
  "the plan JSON records the chosen state_budget: $(jq -c .disk "$T/b.json" 2>&1 | head -c 400)"
"$S" plan $G --state_budget 268435456 >"$T/g.out" 2>&1
check 'grep -q "the store.s cache: state_budget 268435456 bytes as given" "$T/g.out" && ! grep -q "candidates" "$T/g.out"' \
  "an explicit state_budget is used as given, nothing chosen: $(grep -A2 "store.s cache" "$T/g.out")"
# strata train runs and records what it chose (a resume runs it: config.json)
sed "s|$T/disk\"|$T/disk2\"|" "$T/slow.json" >"$T/slow2.json"
"$S" train $m --device_budget 6e6 --state_paths "$T/disk2" --state_profile "$T/slow2.json" --steps 1 --eval_every 0 --sample_every 0 \
  --quiet 1 --run_dir "$T/run3" >"$T/t3.out" 2>&1; rc=$?
if [ $rc -ne 0 ] && grep -q GLPK "$T/t3.out"; then echo "built without GLPK: the state_budget run skipped"
else
  tb=$(sed -n 's/.*planner:   state_budget \([0-9]*\).*: chosen$/\1/p' "$T/t3.out")
  check '[ $rc -eq 0 ] && [ -n "$tb" ] && jq -e ".state_budget == $tb" "$T/run3/config.json" >/dev/null &&
         jq -e ".disk.state_budget == $tb" "$T/run3/plan.json" >/dev/null' \
    "strata train runs and records the chosen state_budget ($tb; rc $rc): $(grep state_budget "$T/t3.out" "$T/run3/config.json")"
  # a saved plan runs the store's host budget it was predicted with (state_budget left 0)
  # (a budget other than the one chosen here: the file's own, 512 MiB)
  mkdir -p "$T/disk3"; sed "s|$T/disk\"|$T/disk3\"|" "$T/slow.json" >"$T/slow3.json"
  jq '.disk.state_budget = 536870912' "$T/run3/plan.json" >"$T/plan512.json"; tb=536870912
  "$S" train $m --device_budget 6e6 --state_paths "$T/disk3" --state_profile "$T/slow3.json" --steps 1 --eval_every 0 \
    --sample_every 0 --quiet 1 --plan "$T/plan512.json" --run_dir "$T/run4" >"$T/t4.out" 2>&1; rc=$?
  check '[ $rc -eq 0 ] && [ -n "$tb" ] && grep -q "host budget $tb bytes, as $T/plan512.json was predicted with" "$T/t4.out" &&
         jq -e ".state_budget == $tb" "$T/run4/config.json" >/dev/null && jq -e ".disk.state_budget == $tb" "$T/run4/plan.json" >/dev/null' \
    "--plan FILE runs the file's state_budget ($tb; rc $rc): $(tail -4 "$T/t4.out")"
fi
echo "plan_state: $checks checks, $((checks - fail)) passed, $fail failed"
[ $fail -eq 0 ]
