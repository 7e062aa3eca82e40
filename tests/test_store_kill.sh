#!/usr/bin/env bash
# test_store_kill.sh - a step is never torn: `strata train` with its optimizer state on
# disk (state_paths) is killed with SIGKILL at 20 random moments and resumed each time;
# every resume continues from the last logged step k or k+1 (k the newer of the last logged
# step and the previous resume's), and the run ends
# bit-identical (every logged loss, the final weights) to an uninterrupted run with the
# state in RAM. Also: the same run with two paths and the thread-pool engine is
# bit-identical too, and a second `train` without --resume refuses to overwrite the store.
set -u
S=${STRATA_BIN:?STRATA_BIN not set}
T=$(mktemp -d /tmp/strata-test-kill-XXXXXX)
fail=0
check() { if ! eval "$1"; then echo "FAIL: $2"; fail=1; fi; }

ARGS="--model gpt2-mini --steps 300 --batch 2 --seq 32 --quiet 1 --state_budget 4000000"
"$S" train $ARGS --run_dir "$T/ref" >"$T/ref.out" 2>&1
rc=$?
check '[ $rc -eq 0 ]' "reference run failed: $(tail -3 "$T/ref.out")"

last_step() { # the last step logged in a run's metrics.jsonl (0 if none)
  if [ -s "$1/metrics.jsonl" ]; then tail -n 1 "$1/metrics.jsonl" | sed 's/^{"step":\([0-9]*\),.*/\1/'; else echo 0; fi
}

mkdir -p "$T/st"
RANDOM=20261130
kills=0 tries=0 finished=0 at_k=0 at_k1=0 prev=0
while [ $kills -lt 20 ] && [ $tries -lt 60 ]; do
  tries=$((tries + 1))
  R=""
  [ -f "$T/st/strata-state.manifest" ] && R="--resume $T/run"
  before=$(last_step "$T/run")
  "$S" train $ARGS --run_dir "$T/run" --state_paths "$T/st" $R >"$T/out.$tries" 2>&1 &
  pid=$!
  sleep "0.$(printf %03d $((RANDOM % 300 + 100)))"
  if kill -9 $pid 2>/dev/null; then kills=$((kills + 1)); fi
  wait $pid 2>/dev/null
  if [ -n "$R" ]; then
    got=$(sed -n 's/.*resumed from the state store .* at step \([0-9]*\).*/\1/p' "$T/out.$tries")
    if [ -n "$got" ]; then
      # the store holds the last committed step: the last logged one, or the one after the
      # newer of it and the previous resume's (a resume at k+1 logs nothing up to k+1, so a
      # run killed after committing k+2 and before logging it leaves the log at k)
      base=$before
      [ "$prev" -gt "$base" ] && base=$prev
      if [ "$got" -eq "$before" ]; then at_k=$((at_k + 1)); else at_k1=$((at_k1 + 1)); fi
      check '[ "$got" -eq "$base" ] || [ "$got" -eq $((base + 1)) ]' \
        "try $tries resumed at step $got; the last logged step was $before, the previous resume at $prev (must be the newer or the next)"
      prev=$got
    fi
    check '! grep -q "strata train:" "$T/out.$tries"' "try $tries failed: $(tail -2 "$T/out.$tries")"
  fi
  if grep -q '"step":300,' "$T/run/metrics.jsonl" 2>/dev/null; then finished=1; break; fi
  # step 300 committed and killed before its log line: the resume has nothing to train, writes
  # the weights beside the store and ends (every later try would too, too fast to be killed)
  if grep -q "nothing to train: the run is at step 300" "$T/out.$tries"; then finished=1; break; fi
done
check '[ $kills -ge 20 ] || [ $finished -eq 1 ]' "only $kills kills in $tries tries"
echo "killed $kills times in $tries tries; resumed $at_k times at the last logged step k, $at_k1 at k+1" \
  "(committed, killed before its log line); last logged step $(last_step "$T/run")"
if [ ! -s "$T/run/model.safetensors" ]; then # not finished, or killed before the weights were saved
  R="" # on a loaded machine every kill can come before the store is created: start it then
  [ -f "$T/st/strata-state.manifest" ] && R="--resume $T/run"
  "$S" train $ARGS --run_dir "$T/run" --state_paths "$T/st" $R >"$T/final.out" 2>&1
  rc=$?
  check '[ $rc -eq 0 ]' "the final resume failed: $(tail -3 "$T/final.out")"
fi

# every logged loss equals the reference's for that step; at most one step per kill unlogged
awk -F'[:,]' '{print $2, $4}' "$T/ref/metrics.jsonl" | sort -n >"$T/ref.loss"
awk -F'[:,]' '{print $2, $4}' "$T/run/metrics.jsonl" | sort -n -u >"$T/run.loss"
# (awk, not join: join needs lexical order and says nothing useful about numeric order)
differ() { awk 'NR == FNR { ref[$1] = $2; next } ($1 in ref) && ref[$1] != $2 { print $1, ref[$1], $2 }' "$1" "$2"; }
bad=$(differ "$T/ref.loss" "$T/run.loss" | head -3)
check '[ -z "$bad" ]' "losses differ from the uninterrupted run (step ref run): $bad"
dups=$(awk '{print $1}' "$T/run.loss" | uniq -d | head -3)
check '[ -z "$dups" ]' "a step logged twice with different losses: $dups"
missing=$(($(wc -l <"$T/ref.loss") - $(wc -l <"$T/run.loss")))
check '[ $missing -le $kills ]' "$missing steps never logged after $kills kills"
check 'cmp -s "$T/ref/checkpoints/step_00000300/model.safetensors" "$T/run/model.safetensors"' \
  "the final weights are not bit-identical to the uninterrupted run"

# strata inspect describes the store from its manifest
"$S" inspect "$T/st" >"$T/insp.out" 2>&1
rc=$?
check '[ $rc -eq 0 ] && grep -q "step 300 " "$T/insp.out" && grep -q "crash-safe" "$T/insp.out"' \
  "strata inspect of the store: $(cat "$T/insp.out")"

# bad disk-state keys are named, with what to do
mkdir -p "$T/bad-st"
for case in "state_paths ,|is empty" "state_paths $T/nope|not a directory" \
            "state_budget 1000|raise the host budget" "state_profile $T/none.json|hardware profile (.*); write one with strata probe"; do
  kv=${case%%|*} want=${case#*|}
  extra="--state_paths $T/bad-st --${kv% *} ${kv#* }"
  "$S" train $ARGS --steps 2 --run_dir "$T/bad-run" $extra >"$T/bad-key.out" 2>&1
  rc=$?
  # the whole message on the one error line
  check '[ $rc -ne 0 ] && grep "strata train:" "$T/bad-key.out" | grep -q -- "$want"' \
    "bad key '$kv': rc $rc $(cat "$T/bad-key.out")"
done
printf 'junk' >"$T/bad-st/x.manifest"
"$S" inspect "$T/bad-st/x.manifest" >"$T/bad-insp.out" 2>&1
rc=$?
check '[ $rc -eq 1 ] && grep -q "not a strata state manifest" "$T/bad-insp.out"' "inspect of a bad manifest: $(cat "$T/bad-insp.out")"

# strata plan shows each path's share of the disk state and refuses one that does not fit
"$S" plan $ARGS --state_paths "$T/st" >"$T/plan.out" 2>&1
rc=$?
check '[ $rc -eq 0 ] && grep -q "disk state" "$T/plan.out" && grep -q "fits" "$T/plan.out"' "plan with state_paths: rc $rc $(tail -3 "$T/plan.out")"
"$S" plan --model gpt2-124m --n_layer 4000 --n_embd 1536 --n_head 12 --batch 1 --seq 64 --host_budget 1e15 --state_paths "$T/st" >"$T/plan2.out" 2>&1
rc=$?
check '[ $rc -eq 3 ] && grep -q "bytes missing" "$T/plan2.out"' "a 2.7 TB disk state on this disk: rc $rc $(tail -3 "$T/plan2.out")"

# crashes at chosen instants (STRATA_FAILPOINT): right after the store is created (before
# step 0's loop state is committed), after step 3's writes but before its manifest
# switch (resume at 2), and after step 3's commit but before its log line (resume at 3)
for fp in train_store_created store_writes_done:3 train_step_committed:3; do
  d="$T/fp-${fp%%:*}"
  mkdir -p "$d/st"
  { STRATA_FAILPOINT=$fp "$S" train $ARGS --stop_at 6 --run_dir "$d/run" --state_paths "$d/st" >"$d/1.out" 2>&1; } 2>/dev/null
  rc=$?
  check '[ $rc -eq 137 ]' "failpoint $fp: the process was not killed (rc $rc): $(tail -2 "$d/1.out")"
  "$S" train $ARGS --stop_at 6 --run_dir "$d/run" --state_paths "$d/st" --resume "$d/run" >"$d/2.out" 2>&1
  rc=$?
  check '[ $rc -eq 0 ]' "failpoint $fp: resume failed: $(tail -2 "$d/2.out")"
  case $fp in
    train_store_created) want=0; grep -q "never stepped" "$d/2.out" || { echo "FAIL: $fp: no fresh start"; fail=1; } ;;
    store_writes_done:3) want=2 ;;
    train_step_committed:3) want=3 ;;
  esac
  if [ $want -gt 0 ]; then
    got=$(sed -n 's/.*resumed from the state store .* at step \([0-9]*\).*/\1/p' "$d/2.out")
    check '[ "$got" = "$want" ]' "failpoint $fp: resumed at step '$got', expected $want"
  fi
  awk -F'[:,]' '{print $2, $4}' "$d/run/metrics.jsonl" | sort -n -u >"$d/run.loss"
  bad=$(differ "$T/ref.loss" "$d/run.loss" | head -2)
  n=$(awk -F'[:,]' '{print $2}' "$d/run/metrics.jsonl" | sort -n -u | wc -l)
  check '[ -z "$bad" ] && [ $n -ge 5 ]' "failpoint $fp: losses differ from the uninterrupted run or steps missing ($n): $bad"
done

# layer streaming with the disk state (device_budget + state_paths): the executor updates
# through the store after backward; losses and final weights equal the streamed run with
# its state in RAM, also across a crash between a step's writes and its switch (a
# failpoint kills the 7th step after the store's writes, before its switch; the resume
# starts at step 6). streamed_kill NAME LABEL ARGS...: runs NAME-ram, NAME-disk.
streamed_kill() {
  local n=$1 what=$2 rc bad
  shift 2
  "$S" train "$@" --run_dir "$T/$n-ram" >"$T/$n-ram.out" 2>&1
  rc=$?
  check '[ $rc -eq 0 ]' "$what: streamed run failed: $(tail -2 "$T/$n-ram.out")"
  mkdir -p "$T/$n-st"
  { STRATA_FAILPOINT=store_writes_done:7 "$S" train "$@" --run_dir "$T/$n-disk" --state_paths "$T/$n-st" \
      >"$T/$n-disk1.out" 2>&1; } 2>/dev/null
  rc=$?
  check '[ $rc -eq 137 ]' "$what: the failpoint run was not killed (rc $rc): $(tail -2 "$T/$n-disk1.out")"
  "$S" train "$@" --run_dir "$T/$n-disk" --state_paths "$T/$n-st" --resume "$T/$n-disk" >"$T/$n-disk2.out" 2>&1
  rc=$?
  check '[ $rc -eq 0 ] && grep -q "at step 6" "$T/$n-disk2.out"' "$what: resume (rc $rc): $(tail -2 "$T/$n-disk2.out")"
  awk -F'[:,]' '{print $2, $4}' "$T/$n-ram/metrics.jsonl" | sort -n >"$T/$n-ram.loss"
  awk -F'[:,]' '{print $2, $4}' "$T/$n-disk/metrics.jsonl" | sort -n -u >"$T/$n-disk.loss"
  bad=$(differ "$T/$n-ram.loss" "$T/$n-disk.loss" | head -2)
  check '[ -z "$bad" ] && [ $(wc -l <"$T/$n-disk.loss") -eq 20 ]' \
    "$what + disk state: losses differ or steps missing: $bad"
  check 'cmp -s "$T/$n-ram/checkpoints/step_00000020/model.safetensors" "$T/$n-disk/model.safetensors"' \
    "$what + disk state: final weights differ from the streamed run in RAM"
}
SA="--model gpt2-mini --steps 20 --batch 2 --seq 32 --quiet 1 --device_budget 6000000 --state_budget 4000000"
streamed_kill gpt2 "streamed GPT-2" $SA
# the same for a Llama (GQA, untied head, 32 blocks) at one eighth of its training state,
# with grad_accum 3 and 8-bit states
streamed_kill llama "streamed Llama" --model llama-tiny --n_layer 32 --vocab_size 257 --steps 20 --batch 2 --seq 16 \
  --grad_accum 3 --optim_state 8bit --quiet 1 --device_budget 534720 --state_budget 4000000 --eval_every 0 \
  --sample_every 0

# 8-bit states under streaming live only in the store; the losses equal the in-memory 8-bit run's
"$S" train $SA --optim_state 8bit --device_budget 0 --run_dir "$T/q8ram" >"$T/q8ram.out" 2>&1
rc=$?
check '[ $rc -eq 0 ]' "8-bit in-memory run failed: $(tail -2 "$T/q8ram.out")"
mkdir -p "$T/q8st"
"$S" train $SA --optim_state 8bit --run_dir "$T/q8disk" --state_paths "$T/q8st" >"$T/q8disk.out" 2>&1
rc=$?
check '[ $rc -eq 0 ]' "8-bit streamed + disk run failed: $(tail -2 "$T/q8disk.out")"
check 'cmp -s <(awk -F"[:,]" "{print \$2, \$4}" "$T/q8ram/metrics.jsonl") <(awk -F"[:,]" "{print \$2, \$4}" "$T/q8disk/metrics.jsonl")' \
  "8-bit streamed + disk state: losses differ from the in-memory 8-bit run"

# two paths, the thread-pool engine, 8 buffers: bit-identical as well
mkdir -p "$T/p1" "$T/p2"
# (a probe profile saying the second path is 3x faster: it gets the larger share)
printf '{"paths": [{"path": "%s", "mixed_gbps": 1.0}, {"path": "%s", "mixed_gbps": 3.0}]}\n' "$T/p1" "$T/p2" >"$T/hw.json"
STRATA_IO=threads "$S" train $ARGS --steps 20 --run_dir "$T/two" --state_paths "$T/p1,$T/p2" --state_profile "$T/hw.json" \
  >"$T/two.out" 2>&1
rc=$?
check '[ $rc -eq 0 ]' "two-path run failed: $(tail -3 "$T/two.out")"
check '[ -s "$T/p1/strata-state.bin" ] && [ -s "$T/p2/strata-state.bin" ]' "both paths hold state"
s1=$(stat -c %s "$T/p1/strata-state.bin"); s2=$(stat -c %s "$T/p2/strata-state.bin")
check '[ $((s2)) -gt $((2 * s1)) ]' "the 3x faster path holds $s2 bytes, the other $s1"
"$S" train $ARGS --steps 2 --run_dir "$T/bad" --state_paths "$T/p1,$T/st" --state_profile "$T/hw.json" >"$T/bad.out" 2>&1
rc=$?
check '[ $rc -ne 0 ] && grep -q "no bandwidth for path" "$T/bad.out"' "a path missing from the profile: $(tail -2 "$T/bad.out")"
"$S" train $ARGS --steps 20 --run_dir "$T/ref20" >/dev/null 2>&1
check 'cmp -s <(awk -F"[:,]" "{print \$2, \$4}" "$T/ref20/metrics.jsonl") <(awk -F"[:,]" "{print \$2, \$4}" "$T/two/metrics.jsonl")' \
  "two paths + threads: losses differ from the RAM run"

# starting again over an existing store is refused, and the store is untouched
sum=$(md5sum <"$T/p1/strata-state.manifest")
"$S" train $ARGS --steps 20 --run_dir "$T/two" --state_paths "$T/p1,$T/p2" >"$T/again.out" 2>&1
rc=$?
check '[ $rc -ne 0 ] && grep -q "already holds" "$T/again.out"' "a new run over a store: $(tail -2 "$T/again.out")"
check '[ "$(md5sum <"$T/p1/strata-state.manifest")" = "$sum" ]' "the refused run changed the manifest"

if [ $fail -eq 0 ]; then rm -rf "$T"; echo "store_kill: pass"; else echo "store_kill: FAILED (kept $T)"; fi
exit $fail
