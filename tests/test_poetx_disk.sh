#!/usr/bin/env bash
# test_poetx_disk.sh - strata train --method poetx with its trained vector's state on disk
# (state_paths; W0 of each merge in its own file beside the store), against the same run in
# memory (gpt2-tiny, b 8, a merge every 3 steps, 10 steps: merges at 3, 6 and 9):
#  - the same losses, a byte-identical --save_hf directory's weights and final weights (the
#    trained tensors, Q, W0, the permutations), with fp32 state and W0, with 8-bit state and
#    int8 W0, and with Q's moments kept across a merge (poetx_adam_restart 0);
#  - stopped right after a merge (--stop_at 3) and right before one (5), resumed from the store:
#    the same losses, byte-identical weights;
#  - killed at chosen instants (STRATA_FAILPOINT) and resumed, byte-identical: after the store
#    committed the merge's step 6 and before W0's file (the merge made again on resume), after W0's
#    file and before the older file is removed, after the step's commit and before its log line;
#  - killed with SIGKILL at random moments of a 1500-step run and resumed each time: every resume
#    at the last logged step or the one after, the final weights bit for bit the in-memory run's;
#  - steps over 2^32 - 1 with state_paths refused naming the key, no run directory or store;
#  - a resume with another method, poetx_block or frozen_dtype refused naming the key; W0's file
#    missing refused naming it; another run's W0 file (its metadata poetx_run) refused naming the
#    file and the key, nothing changed; the run's own file without the key (as written before it)
#    loaded;
#  - strata plan counts W0's files on disk besides the store.
set -u
. "$(dirname "$0")/lib_method_cli.sh"
method_begin poetx-disk
# one thread: a step in a few ms on a loaded machine too (the kill loop's timing), the same numbers
poet="--model gpt2-tiny $tiny --threads 1 --method poetx --poetx_block 8 --poetx_terms 4 --poetx_merge_every 3 --lr 1e-2 --warmup_steps 2"
final() { echo "$1/checkpoints/step_$(printf %08d "$2")/model.safetensors"; }
steps_losses() { jq -r '"\(.step) \(.loss)"' "$1/metrics.jsonl" | sort -n -u; }
same_run() { # same_run REF DIR HF LABEL [UNLOGGED]: DIR's logged losses are REF's (at most UNLOGGED
  # steps missing: a kill after a step's commit, before its log line), its weights and HF's REF's
  local ref=$1 dir=$2 hf=$3 miss=${5:-0} bad n
  bad=$(awk 'NR == FNR { r[$1] = $2; next } !($1 in r) || r[$1] != $2 { print $1, r[$1], $2 }' \
    <(steps_losses "$ref") <(steps_losses "$dir") | head -2)
  n=$(steps_losses "$dir" | wc -l)
  check '[ -z "$bad" ] && [ "$n" -ge $((10 - miss)) ] && cmp -s "$ref.hf/model.safetensors" "$hf/model.safetensors" && cmp -s "$(final "$ref" 10)" "$dir/model.safetensors"' \
    "$4: $n steps logged, losses differ (step ref run: $bad), or the save_hf or final weights differ"
}

# --- in memory against the disk state: fp32; 8-bit state with int8 W0
for v in f32 q8 keep; do
  extra=""
  [ $v = q8 ] && extra="--optim_state 8bit --frozen_dtype int8"
  [ $v = keep ] && extra="--poetx_adam_restart 0" # Q's master weights reset at a merge, its moments kept
  "$S" train $poet $extra --steps 10 --run_dir "$T/mem-$v" --save_hf "$T/mem-$v.hf" >"$T/mem-$v.out" 2>&1
  check '[ $? -eq 0 ] && [ -f "$(final "$T/mem-$v" 10)" ]' "$v in memory: $(tail -2 "$T/mem-$v.out")"
  mkdir -p "$T/st-$v"
  "$S" train $poet $extra --steps 10 --run_dir "$T/disk-$v" --state_paths "$T/st-$v" --save_hf "$T/disk-$v.hf" \
    >"$T/disk-$v.out" 2>&1
  check '[ $? -eq 0 ]' "$v with state_paths: $(tail -2 "$T/disk-$v.out")"
  same_run "$T/mem-$v" "$T/disk-$v" "$T/disk-$v.hf" "$v: the disk state"
  # the newest merge's W0 alone is kept beside the store
  check '[ "$(ls "$T/st-$v" | grep -c poetx-w0)" = 1 ] && [ -f "$T/st-$v/strata-state.poetx-w0-000000009.safetensors" ]' \
    "$v: W0 files beside the store: $(ls "$T/st-$v" | tr '\n' ' ')"
done
M="$T/mem-f32"

# --- stopped right after the merge at 3, and right before the one at 6, resumed from the store
for at in 3 5; do
  d="$T/stop$at"
  mkdir -p "$d.st"
  "$S" train $poet --steps 10 --stop_at $at --run_dir "$d" --state_paths "$d.st" >"$d.1.out" 2>&1
  "$S" train $poet --steps 10 --resume "$d" --run_dir "$d" --state_paths "$d.st" --save_hf "$d.hf" >"$d.2.out" 2>&1
  rc=$?
  check '[ $rc -eq 0 ] && grep -q "resumed from the state store .* at step $at" "$d.2.out"' "resume at $at (rc $rc): $(tail -2 "$d.2.out")"
  same_run "$M" "$d" "$d.hf" "stopped at $at, resumed from the store"
done

# --- killed at chosen instants, then resumed
for fp in train_update_committed:6 poetx_w0_written:2 train_step_committed:6; do
  d="$T/fp-${fp%%:*}"
  mkdir -p "$d.st"
  { STRATA_FAILPOINT=$fp "$S" train $poet --steps 10 --run_dir "$d" --state_paths "$d.st" >"$d.1.out" 2>&1; } 2>/dev/null
  rc=$?
  check '[ $rc -eq 137 ]' "failpoint $fp: the process was not killed (rc $rc): $(tail -2 "$d.1.out")"
  "$S" train $poet --steps 10 --resume "$d" --run_dir "$d" --state_paths "$d.st" --save_hf "$d.hf" >"$d.2.out" 2>&1
  rc=$?
  check '[ $rc -eq 0 ] && grep -q "resumed from the state store .* at step 6" "$d.2.out"' "failpoint $fp: resume (rc $rc): $(tail -2 "$d.2.out")"
  same_run "$M" "$d" "$d.hf" "failpoint $fp, resumed" 1
done
check 'grep -q "merge of that step is made again" "$T/fp-train_update_committed.2.out"' \
  "killed before the merge's W0 file: the resume says it merges again"

# --- more steps than the store's 32-bit merge step holds: refused naming the key, before any file
"$S" train $poet --steps 4294967296 --run_dir "$T/big" --state_paths "$T/big.st" >"$T/big.out" 2>&1
rc=$?
check '[ $rc -ne 0 ] && grep -q "key .steps.: 4294967296; method poetx with state_paths trains at most 4294967295 steps" "$T/big.out" &&
       [ ! -e "$T/big" ] && [ ! -e "$T/big.st" ]' "steps over 2^32 - 1 with state_paths (rc $rc): $(tail -1 "$T/big.out")"

# --- a resume with another method, block size or W0 precision is refused; W0's file missing too
resume_refused "$T/stop5" method --method full --state_paths "$T/stop5.st"
resume_refused "$T/stop5" poetx_block --poetx_block 4 --state_paths "$T/stop5.st"
resume_refused "$T/stop5" frozen_dtype --frozen_dtype bf16 --state_paths "$T/stop5.st"
d="$T/gone"
mkdir -p "$d.st"
"$S" train $poet --steps 10 --stop_at 7 --run_dir "$d" --state_paths "$d.st" >"$d.1.out" 2>&1
rm -f "$d.st"/strata-state.poetx-w0-*
"$S" train $poet --steps 10 --resume "$d" --run_dir "$d" --state_paths "$d.st" >"$d.2.out" 2>&1
rc=$?
check '[ $rc -ne 0 ] && grep -q "strata-state.poetx-w0-000000006.safetensors: missing" "$d.2.out"' \
  "W0's file removed: refused naming it (rc $rc): $(tail -1 "$d.2.out")"

# --- another run's W0 file (another seed: its own id and W0) put in place of this run's file of the
# merge at 6 (a leftover under a reused path): the resume is refused naming the file and the key
# poetx_run, and changes nothing (the store, the files beside it, metrics.jsonl and the weights
# as they were); the run's own file put back without the key (as written before it), the resume
# loads it unchecked (and says so) and ends on the in-memory run bit for bit
d="$T/other"
mkdir -p "$d.st" "$T/seed7.st"
"$S" train $poet --steps 10 --stop_at 7 --run_dir "$d" --state_paths "$d.st" >"$d.1.out" 2>&1
"$S" train $poet --seed 7 --steps 10 --stop_at 7 --run_dir "$T/seed7" --state_paths "$T/seed7.st" >"$T/seed7.out" 2>&1
w6=strata-state.poetx-w0-000000006.safetensors
check '[ -f "$d.st/$w6" ] && [ -f "$T/seed7.st/$w6" ] && ! cmp -s "$d.st/$w6" "$T/seed7.st/$w6"' \
  "two runs' W0 files of the merge at 6: $(ls "$d.st" "$T/seed7.st" | tr '\n' ' ')"
mv "$d.st/$w6" "$d.own6"
cp "$T/seed7.st/$w6" "$d.st/$w6"
sums() { (cd "$1" && md5sum $(ls | grep -v '\.lock$'); cd "$2" && md5sum metrics.jsonl model.safetensors); }
before=$(sums "$d.st" "$d")
"$S" train $poet --steps 10 --resume "$d" --run_dir "$d" --state_paths "$d.st" >"$d.2.out" 2>&1
rc=$?
check '[ $rc -ne 0 ] && grep -q "$d.st/$w6: metadata poetx_run is .*, this run'"'"'s is " "$d.2.out" && [ "$(sums "$d.st" "$d")" = "$before" ]' \
  "another run's W0 file: refused naming the file and poetx_run, nothing changed (rc $rc): $(tail -1 "$d.2.out")"
if command -v python3 >/dev/null; then
  python3 - "$d.own6" "$d.st/$w6" <<'PY'
import json, struct, sys
src, dst = sys.argv[1], sys.argv[2]
with open(src, "rb") as f:
    n = struct.unpack("<Q", f.read(8))[0]
    h = json.loads(f.read(n))
    data = f.read()
if "poetx_run" not in h.get("__metadata__", {}): sys.exit("%s: no poetx_run" % src)
del h["__metadata__"]["poetx_run"]
hb = json.dumps(h).encode()
hb += b" " * (-len(hb) % 8)
with open(dst, "wb") as f: f.write(struct.pack("<Q", len(hb)) + hb + data)
PY
  "$S" train $poet --steps 10 --resume "$d" --run_dir "$d" --state_paths "$d.st" --save_hf "$d.hf" >"$d.3.out" 2>&1
  rc=$?
  check '[ $rc -eq 0 ] && grep -q "$w6 carries no poetx_run" "$d.3.out"' \
    "the run's W0 file without poetx_run (written before the key): loaded unchecked (rc $rc): $(tail -1 "$d.3.out")"
  same_run "$M" "$d" "$d.hf" "a W0 file without poetx_run, resumed"
else
  echo "poetx-disk: no python3, the W0 file without poetx_run not checked"
fi

# --- strata plan: the disk tier holds the store and two merges' W0 files (fp32: 4 bytes a
# weight parameter each; gpt2-tiny's matmul weights: 2 layers x 12 C^2 = 24576)
disk() { "$S" plan $poet --steps 10 "$@" 2>/dev/null | awk '$1 == "disk" && $2 ~ /^[0-9]+$/ {print $2}'; }
pd=$(disk --state_paths "$T/st-f32") pi8=$(disk --state_paths "$T/st-f32" --frozen_dtype int8)
check '[ -n "$pd" ] && [ -n "$pi8" ] && [ $((pd - pi8)) -gt $((2 * 24576 * 2)) ] && [ "$pd" -gt $((2 * 24576 * 4)) ]' \
  "strata plan's disk tier with W0's files: fp32 $pd, int8 $pi8 bytes"

# --- killed after the store was created and before the start's W0 file was in place (the kill
# loop below found that window): a run of no step leaves the store at step 0, its W0 file removed;
# the resume draws W0 again from the seed and ends on the in-memory run
d="$T/nostep"
mkdir -p "$d.st"
"$S" train $poet --steps 0 --run_dir "$d" --state_paths "$d.st" >"$d.1.out" 2>&1
check '[ -f "$d.st/strata-state.poetx-w0-000000000.safetensors" ]' "a run of no step: no W0 file of the start: $(ls "$d.st" | tr '\n' ' ')"
rm -f "$d.st/strata-state.poetx-w0-000000000.safetensors"
"$S" train $poet --steps 10 --resume "$d" --run_dir "$d" --state_paths "$d.st" --save_hf "$d.hf" >"$d.2.out" 2>&1
rc=$?
check '[ $rc -eq 0 ] && grep -q "W0 drawn again from the seed" "$d.2.out"' "the start's W0 file missing (rc $rc): $(tail -2 "$d.2.out")"
same_run "$M" "$d" "$d.hf" "the start's W0 file missing, resumed"

# --- SIGKILL at random moments (the loop of test_store_kill.sh): every resume at the last logged
# step k or k+1, and the run ends on the in-memory run's weights bit for bit
last_step() { if [ -s "$1/metrics.jsonl" ]; then tail -n 1 "$1/metrics.jsonl" | sed 's/^{"step":\([0-9]*\),.*/\1/'; else echo 0; fi; }
N=1500
"$S" train $poet --steps $N --run_dir "$T/kref" >"$T/kref.out" 2>&1
check '[ $? -eq 0 ]' "the in-memory run of $N steps: $(tail -2 "$T/kref.out")"
mkdir -p "$T/kst"
RANDOM=20261207
kills=0 tries=0 finished=0 prev=0 t0=$SECONDS
while [ $kills -lt 20 ] && [ $tries -lt 60 ] && [ $((SECONDS - t0)) -lt 40 ]; do
  tries=$((tries + 1))
  R=""
  [ -f "$T/kst/strata-state.manifest" ] && R="--resume $T/krun"
  before=$(last_step "$T/krun")
  "$S" train $poet --steps $N --run_dir "$T/krun" --state_paths "$T/kst" $R >"$T/kout.$tries" 2>&1 &
  pid=$!
  sleep "0.$(printf %03d $((RANDOM % 130 + 20)))"
  if kill -9 $pid 2>/dev/null; then kills=$((kills + 1)); fi
  wait $pid 2>/dev/null
  if [ -n "$R" ]; then
    got=$(sed -n 's/.*resumed from the state store .* at step \([0-9]*\).*/\1/p' "$T/kout.$tries")
    if [ -n "$got" ]; then
      base=$before # a resume at k+1 logs nothing up to k+1: the previous resume's step counts too
      [ "$prev" -gt "$base" ] && base=$prev
      check '[ "$got" -eq "$base" ] || [ "$got" -eq $((base + 1)) ]' \
        "kill try $tries resumed at step $got; last logged $before, previous resume $prev"
      prev=$got
    fi
    check '! grep -q "strata train:" "$T/kout.$tries"' "kill try $tries failed: $(tail -2 "$T/kout.$tries")"
  fi
  if grep -q "\"step\":$N," "$T/krun/metrics.jsonl" 2>/dev/null; then finished=1; break; fi
  if grep -q "nothing to train: the run is at step $N" "$T/kout.$tries"; then finished=1; break; fi
done
if [ ! -s "$T/krun/model.safetensors" ]; then # not finished, or killed before the weights were written
  R=""
  [ -f "$T/kst/strata-state.manifest" ] && R="--resume $T/krun"
  "$S" train $poet --steps $N --run_dir "$T/krun" --state_paths "$T/kst" $R >"$T/kfinal.out" 2>&1
  check '[ $? -eq 0 ]' "the final resume: $(tail -2 "$T/kfinal.out")"
fi
echo "poetx-disk: killed $kills times in $tries tries, $(cat "$T"/kout.* | grep -c "made again") resumes merged again, last logged step $(last_step "$T/krun")"
check 'cmp -s "$(final "$T/kref" $N)" "$T/krun/model.safetensors"' \
  "after $kills kills the final weights differ from the in-memory run's"

method_end poetx-disk
