#!/usr/bin/env bash
# test_run_lock.sh - strata never destroys data through a run directory's name, and one
# run directory or state store is used by one process at a time:
# - a run_dir with an apostrophe (and one crafted to look like shell words) checkpoints
#   and leaves its siblings alone (file operations never go through a shell);
# - a second `strata train` on a run directory in use is refused, naming the holder,
#   and the first run's files are untouched; after the holder is SIGKILLed the lock is
#   gone with it and a resume works;
# - a second process on a state store in use (another run directory, same state_paths)
#   is refused, naming the holder, and the store is unchanged.
set -u
S=${STRATA_BIN:?STRATA_BIN not set}
T=$(mktemp -d /tmp/strata-test-lock-XXXXXX)
fail=0
check() { if ! eval "$1"; then echo "FAIL: $2"; fail=1; fi; }
A="--model gpt2-mini --batch 2 --seq 32 --quiet 1"

# --- names that a shell would have split
mkdir -p "$T/bobs" "$T/victim"
echo keep >"$T/bobs/precious"
echo keep >"$T/victim/precious"
"$S" train $A --steps 4 --ckpt_every 2 --run_dir "$T/bob's run" >"$T/bob.out" 2>&1
rc=$?
check '[ $rc -eq 0 ]' "run_dir with an apostrophe: rc $rc: $(tail -2 "$T/bob.out")"
check '[ -f "$T/bobs/precious" ]' "the sibling 'bobs' of \"bob's run\" was removed"
check '[ -f "$T/bob'"'"'s run/checkpoints/step_00000004/model.safetensors" ]' "no checkpoint in \"bob's run\""
# a second save over the same step (resume + stop at the same step) removes .old/.partial leftovers itself
mkdir -p "$T/bob's run/checkpoints/step_00000006.partial/sub"
"$S" train $A --steps 6 --run_dir "$T/bob's run" --resume "$T/bob's run" >"$T/bob2.out" 2>&1
rc=$?
check '[ $rc -eq 0 ] && [ ! -e "$T/bob'"'"'s run/checkpoints/step_00000006.partial" ]' \
  "resume in \"bob's run\": rc $rc, leftover .partial: $(tail -2 "$T/bob2.out")"
crafted="$T/x' '$T/victim' 'y"
"$S" train $A --steps 2 --run_dir "$crafted" >"$T/crafted.out" 2>&1
rc=$?
check '[ $rc -eq 0 ]' "crafted run_dir: rc $rc: $(tail -2 "$T/crafted.out")"
check '[ -f "$T/victim/precious" ]' "a run_dir crafted with quotes removed another directory"

# --- two processes on one run directory
R="$T/run"
"$S" train $A --steps 100000 --run_dir "$R" >"$T/first.out" 2>&1 &
pid=$!
for _ in $(seq 100); do [ -s "$R/metrics.jsonl" ] && break; sleep 0.1; done
check '[ -s "$R/metrics.jsonl" ]' "the first run never wrote a metrics line: $(tail -2 "$T/first.out")"
cfg=$(md5sum <"$R/config.json")
"$S" train $A --steps 100000 --run_dir "$R" --resume "$R" >"$T/second.out" 2>&1
rc=$?
check '[ $rc -ne 0 ] && grep -q "in use by another strata process (pid $pid " "$T/second.out"' \
  "a second process on a run directory in use was not refused naming pid $pid (rc $rc): $(tail -2 "$T/second.out")"
check '[ "$(md5sum <"$R/config.json")" = "$cfg" ]' "the refused process rewrote config.json"
kill -0 $pid 2>/dev/null
alive=$?
check '[ $alive -eq 0 ]' "the first run died when the second was refused"
kill -9 $pid 2>/dev/null
wait $pid 2>/dev/null
# the lock died with its holder: a resume (it finds no checkpoint yet; step 0 is fine) runs
"$S" train $A --steps 2 --run_dir "$R" >"$T/third.out" 2>&1
rc=$?
check '[ $rc -eq 0 ]' "after SIGKILL of the holder the run directory stays locked: rc $rc: $(tail -2 "$T/third.out")"

# --- a copied run directory (cp -a) carries its lock file's record of a process that is gone:
# a refusal names the live holder on this host (here flock(1), holding the copy's lock) and
# says the record is stale and why: no such pid, the pid reused by another process (another
# start time), or another host
"$S" train $A --steps 100000 --run_dir "$T/orig" >"$T/orig.out" 2>&1 &
opid=$!
for _ in $(seq 100); do [ -s "$T/orig/metrics.jsonl" ] && break; sleep 0.1; done
kill -9 $opid 2>/dev/null
wait $opid 2>/dev/null
cp -a "$T/orig" "$T/copy"
check 'grep -q "^pid $opid " "$T/copy/strata.lock"' "the copy's lock file does not record pid $opid: $(cat "$T/copy/strata.lock")"
# no one holds the copy's lock: a run on it starts (the record is information only)
"$S" train $A --steps 2 --run_dir "$T/copy" >"$T/copy1.out" 2>&1
rc=$?
check '[ $rc -eq 0 ]' "a run on a copied run directory nobody holds is refused: rc $rc: $(tail -2 "$T/copy1.out")"
refused() { # $1: what the copy's lock file records; prints strata's refusal while flock(1) holds it
  cp -a "$T/orig/strata.lock" "$T/copy/strata.lock"
  [ -n "$1" ] && printf '%s\n' "$1" >"$T/copy/strata.lock"
  flock "$T/copy/strata.lock" sleep 30 &
  hpid=$!
  for _ in $(seq 50); do grep -q " $hpid " /proc/locks 2>/dev/null && break; sleep 0.05; done
  "$S" train $A --steps 100000 --run_dir "$T/copy" --resume "$T/copy" 2>&1
  kill $hpid 2>/dev/null
  wait $hpid 2>/dev/null
}
out=$(refused "")
check 'echo "$out" | grep -q "in use by another process (pid [0-9]* on this host: flock " &&
       echo "$out" | grep -q "record is stale: it names pid $opid on this host, and no such process exists" &&
       ! echo "$out" | grep -q "strata process (pid $opid "' "a copy's dead holder: $out"
out=$(refused "pid $$ on $(hostname) since 1, start 1")
check 'echo "$out" | grep -q "on this host: flock " &&
       echo "$out" | grep -q "it names pid $$, a number now used by another process"' "a reused pid: $out"
out=$(refused "pid 1234 on elsewhere.example since 1, start 5")
check 'echo "$out" | grep -q "on this host: flock " &&
       echo "$out" | grep -q "it names pid 1234 on elsewhere.example, another host"' "another host's record: $out"

# --- two processes on one state store
mkdir -p "$T/st"
"$S" train $A --steps 100000 --run_dir "$T/s1" --state_paths "$T/st" --state_budget 4000000 >"$T/s1.out" 2>&1 &
pid=$!
for _ in $(seq 100); do [ -s "$T/s1/metrics.jsonl" ] && break; sleep 0.1; done
check '[ -s "$T/s1/metrics.jsonl" ]' "the store run never stepped: $(tail -2 "$T/s1.out")"
"$S" train $A --steps 100000 --run_dir "$T/s2" --state_paths "$T/st" --state_budget 4000000 --resume "$T/s1" \
  >"$T/s2.out" 2>&1
rc=$?
check '[ $rc -ne 0 ] && grep -q "state store is in use by another strata process (pid $pid " "$T/s2.out"' \
  "a second process on a state store in use was not refused naming pid $pid (rc $rc): $(tail -2 "$T/s2.out")"
kill -9 $pid 2>/dev/null
wait $pid 2>/dev/null
k=$(tail -n 1 "$T/s1/metrics.jsonl" | sed 's/^{"step":\([0-9]*\),.*/\1/')
"$S" train $A --steps 100000 --stop_at $((k + 2)) --run_dir "$T/s1" --state_paths "$T/st" --state_budget 4000000 \
  --resume "$T/s1" >"$T/s3.out" 2>&1
rc=$?
check '[ $rc -eq 0 ]' "after SIGKILL of the holder the state store stays locked: rc $rc: $(tail -2 "$T/s3.out")"

if [ $fail -eq 0 ]; then rm -rf "$T"; echo "run_lock: ok"; else echo "run_lock: FAILED (kept $T)"; fi
exit $fail
