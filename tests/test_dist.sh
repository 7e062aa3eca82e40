#!/usr/bin/env bash
# test_dist.sh - data parallel over MPI (strata/dist.h), against one process:
# - ZeRO 0, 1 and 2 at 2 ranks equal one process with grad_accum 2, bit for bit over 20
#   steps (every step's loss and norm, the final weights), with f32 and 8-bit states;
# - ZeRO 2 at 2 ranks with grad_accum 2 equals one process with grad_accum 4 (its sum runs
#   in the one process's order), ZeRO 0 and 1 with grad_accum 2 are within 1e-5 of it (each
#   rank sums its own micro-batches first) and equal each other (ZeRO 1 streamed too); 3 ranks with ZeRO 1 are within 1e-6 of one process with
#   grad_accum 3 (the issue's bound) and in fact equal to it, and two 3-rank runs are
#   bit-identical;
# - a run saved at 2 ranks resumes at 3 and at 1 rank, continuing exactly as an
#   uninterrupted one-process run (ZeRO 2, the same 6 micro-batches a step), and one
#   saved by one process resumes at 2 ranks;
# - a rank SIGKILLed mid-step ends the job non-zero within 60 s, naming the lost rank, and
#   the resume from the last commit is exact; a rank that hangs (SIGSTOP) makes the other
#   stop after dist_timeout with an error naming it;
# - with the disk state (each rank's shard in its own store) ZeRO 1 and 2 give the same bits,
#   and so does layer streaming under ranks (each rank within its own device_budget; with
#   ZeRO 2, 8-bit states, the disk state and every weights gather held back 30 ms);
#   a rank killed before its update leaves the stores one step apart, and the resume returns
#   the ahead one to its previous commit and continues exactly;
# - ranks given different configurations are refused at start, naming the key; a corrupt
#   shards.json, a missing rank file, disk states of two numbers of ranks in one path (a
#   re-shard could take either; test_dist_reshard.sh tests the re-shard), too small a
#   device_budget under ranks, --zero 3 and bench dist's --gather_overlap yes are refused
#   naming what is wrong.
# Skips (77) where mpirun is missing or strata was built without MPI.
set -u
S=${STRATA_BIN:?STRATA_BIN not set}
command -v mpirun >/dev/null || { echo "SKIP: mpirun not found (apt-get install openmpi-bin libopenmpi-dev)"; exit 77; }
. "$(dirname "$0")/mpi_sanitized.sh" # OpenMPI's own leaks, under the sanitizers
T=$(mktemp -d /tmp/strata-test-dist-XXXXXX)
trap 'rm -rf "$T"' EXIT
fail=0
check() { if ! eval "$1"; then echo "FAIL: $2"; fail=1; fi; }
# CI runs as root on 2 cores: mpirun must be told both are fine
MPI="mpirun --allow-run-as-root --oversubscribe --bind-to none"
# 433 thousand parameters: 7 of the norm's 65536-element chunks, enough for 3 shards
A="--model gpt2-tiny --n_embd 128 --n_layer 2 --vocab_size 256 --max_seq 32 --batch 2 --seq 32 --steps 20
   --warmup_steps 2 --eval_every 0 --sample_every 0 --threads 1 --quiet 1 --grad_clip 0.5"
STEPS=${STRATA_TEST_SANITIZED:+8}
STEPS=${STEPS:-20}
A="$A --steps $STEPS"
H=$((STEPS / 2))
LAST=$(printf "step_%08d" "$STEPS")

$MPI -np 2 "$S" train $A --run_dir "$T/probe" >"$T/probe.out" 2>&1
if grep -q "built without MPI" "$T/probe.out"; then echo "SKIP: this strata was built without MPI"; exit 77; fi
if ! [ -f "$T/probe/metrics.jsonl" ]; then
  echo "FAIL: mpirun -np 2 strata train did not run:"; tail -20 "$T/probe.out"; exit 1
fi

losses() { jq -c '[.step, .loss, .grad_norm]' "$1/metrics.jsonl"; }
same_run() { # $1 reference run dir, $2 run dir, $3 what
  if ! cmp -s <(losses "$1") <(losses "$2"); then
    echo "FAIL: $3: losses differ from the reference:"; diff <(losses "$1") <(losses "$2") | head -6; fail=1
  elif ! cmp -s "$1/checkpoints/$LAST/model.safetensors" "$2/checkpoints/$LAST/model.safetensors"; then
    echo "FAIL: $3: final weights differ from the reference"; fail=1
  fi
}
run1() { "$S" train $A "$@" >>"$T/one.out" 2>&1 || { echo "FAIL: one process $*: $(tail -2 "$T/one.out")"; fail=1; }; }
runN() { local n=$1; shift; $MPI -np "$n" "$S" train $A "$@" >>"$T/mpi.out" 2>&1 ||
  { echo "FAIL: $n ranks $*: $(tail -4 "$T/mpi.out")"; fail=1; }; }

# --- 2 ranks, every stage, both state formats, against one process with grad_accum 2
for fmt in f32 8bit; do
  run1 --grad_accum 2 --optim_state $fmt --run_dir "$T/ref2_$fmt"
  for z in 0 1 2; do
    runN 2 --zero $z --optim_state $fmt --run_dir "$T/z${z}_$fmt"
    same_run "$T/ref2_$fmt" "$T/z${z}_$fmt" "2 ranks, zero $z, $fmt"
  done
done
# the weights gathered after an update arrive while the next forward runs, which waits for
# each part as it reaches it: with every gather held back 30 ms, a forward that did not wait
# would compute with the old weights of the other rank's shard
$MPI -np 2 env STRATA_COMM_DELAY_MS=30 "$S" train $A --zero 1 --run_dir "$T/z1_slow" >>"$T/mpi.out" 2>&1 ||
  { echo "FAIL: 2 ranks, gathers held back: $(tail -4 "$T/mpi.out")"; fail=1; }
same_run "$T/ref2_f32" "$T/z1_slow" "2 ranks, zero 1, every weights gather held back 30 ms"
check '[ -f "$T/z1_f32/checkpoints/$LAST/shards.json" ] && [ -f "$T/z1_f32/checkpoints/$LAST/train_state.rank00001.bin" ]' \
  "zero 1: no per-rank state files and description in the checkpoint"
check '[ "$(jq -r .world "$T/z1_f32/checkpoints/$LAST/shards.json")" = 2 ]' "shards.json does not say world 2"
"$S" inspect "$T/z1_f32" >"$T/inspect.out" 2>&1
check 'grep -q "2 ranks, ZeRO 1" "$T/inspect.out" && grep -q "train_state.rank00001.bin: version 1" "$T/inspect.out"' \
  "strata inspect does not describe the shards: $(tail -3 "$T/inspect.out")"
# rank 0 logs; the step's communication is in its metrics
check '[ "$(jq -s "map(select(.ranks == 2 and .comm_sent_bytes > 0)) | length" "$T/z1_f32/metrics.jsonl")" = "$STEPS" ]' \
  "metrics.jsonl lacks ranks/comm_sent_bytes"

# --- with the disk state: each rank's shard in its own store (PATH/rankR-of-W), the same bits
same_store() { # $1 reference, $2 run dir, $3 what (the store's final weights are RUN_DIR/model.safetensors)
  if ! cmp -s <(losses "$1") <(losses "$2"); then
    echo "FAIL: $3: losses differ from the reference:"; diff <(losses "$1") <(losses "$2") | head -6; fail=1
  elif ! cmp -s "$1/checkpoints/$LAST/model.safetensors" "$2/model.safetensors"; then
    echo "FAIL: $3: final weights differ from the reference"; fail=1
  fi
}
mkdir -p "$T/disk1a" "$T/disk1b" "$T/disk2"
runN 2 --zero 1 --state_paths "$T/disk1a,$T/disk1b" --run_dir "$T/zd1"
same_store "$T/ref2_f32" "$T/zd1" "2 ranks, zero 1, disk state on 2 paths"
check '[ -f "$T/disk1a/rank1-of-2/strata-state.manifest" ] && [ -f "$T/disk1b/rank1-of-2/strata-state.bin" ]' \
  "no store of rank 1 in its own directories"
runN 2 --zero 2 --optim_state 8bit --state_paths "$T/disk2" --run_dir "$T/zd2"
same_store "$T/ref2_8bit" "$T/zd2" "2 ranks, zero 2, 8bit, disk state"
# --- layer streaming under ranks: each rank streams within its own device_budget (every block
# recomputed, fetched from the host each micro-batch); the executor hands each micro-batch's
# gradient to the ranks' step, whose gathered weights it waits for block by block: the same bits
runN 2 --zero 1 --device_budget 5e6 --run_dir "$T/zs1"
same_run "$T/ref2_f32" "$T/zs1" "2 ranks, zero 1, layer streaming"
check 'grep -q "layer streaming: device budget 4.8 MiB" "$T/mpi.out"' "2 ranks with device_budget: no layer streaming"
mkdir -p "$T/disk4"
$MPI -np 2 env STRATA_COMM_DELAY_MS=30 "$S" train $A --zero 2 --optim_state 8bit --device_budget 5e6 \
  --state_paths "$T/disk4" --run_dir "$T/zs2" >>"$T/mpi.out" 2>&1 ||
  { echo "FAIL: 2 ranks, streaming, disk state: $(tail -4 "$T/mpi.out")"; fail=1; }
same_store "$T/ref2_8bit" "$T/zs2" "2 ranks, zero 2, 8bit, disk state, layer streaming, every gather held back 30 ms"
# rank 1 killed before its update of step H: rank 0 has committed H, rank 1 only H - 1; the
# resume returns rank 0 to H - 1 (its previous commit) and goes on exactly
mkdir -p "$T/disk3"
$MPI -np 1 "$S" train $A --zero 1 --state_paths "$T/disk3" --run_dir "$T/zd3" : \
     -np 1 env STRATA_FAILPOINT=dist_before_update:$H "$S" train $A --zero 1 --state_paths "$T/disk3" \
     --run_dir "$T/zd3" >"$T/zd3.out" 2>&1
check '[ $? -ne 0 ]' "disk state, a rank killed before its update: the job exited 0"
runN 2 --zero 1 --state_paths "$T/disk3" --resume "$T/zd3" --run_dir "$T/zd3"
check 'grep -q "committed step $H, another rank only $((H - 1)): returning to it" "$T/mpi.out"' \
  "disk state: rank 0's store was not returned to the step rank 1 committed"
same_store "$T/ref2_f32" "$T/zd3" "disk state, stores one step apart after a kill, resumed"

# --- ZeRO 2 with 2 micro-batches a rank: one process's order of 4
run1 --grad_accum 4 --run_dir "$T/ref4"
runN 2 --zero 2 --grad_accum 2 --run_dir "$T/z2_ga2"
same_run "$T/ref4" "$T/z2_ga2" "2 ranks, zero 2, grad_accum 2 (one process, grad_accum 4)"
runN 2 --zero 2 --grad_accum 2 --device_budget 5e6 --run_dir "$T/zs2_ga2"
same_run "$T/ref4" "$T/zs2_ga2" "2 ranks, zero 2, grad_accum 2, layer streaming (one process, grad_accum 4)"
# ZeRO 0 and 1 with 2 micro-batches a rank: each rank sums its own two first, then the ranks
# reduce (another order than one process's: the losses within float rounding of it); ZeRO 0 and
# 1 the same bits (these once crashed the executor, handed no gradient hook between reductions)
runN 2 --zero 0 --grad_accum 2 --run_dir "$T/z0_ga2"
runN 2 --zero 1 --grad_accum 2 --run_dir "$T/z1_ga2"
same_run "$T/z0_ga2" "$T/z1_ga2" "2 ranks, grad_accum 2: zero 1 against zero 0"
runN 2 --zero 1 --grad_accum 2 --device_budget 5e6 --run_dir "$T/zs1_ga2"
same_run "$T/z1_ga2" "$T/zs1_ga2" "2 ranks, zero 1, grad_accum 2, layer streaming against in memory"
check '[ "$(jq -s "[.[] | .loss] | length" "$T/z1_ga2/metrics.jsonl" 2>/dev/null)" = "$STEPS" ] && jq -s -e --slurpfile r "$T/ref4/metrics.jsonl" "[range(length) as \$i | (.[\$i].loss - \$r[\$i].loss) / \$r[\$i].loss | fabs] | max < 1e-5" "$T/z1_ga2/metrics.jsonl" >/dev/null' \
  "2 ranks, zero 1, grad_accum 2: losses not within 1e-5 of one process with grad_accum 4: $(jq -c .loss "$T/z1_ga2/metrics.jsonl" 2>/dev/null | head -3 | tr '\n' ' ')"

# --- 3 ranks
run1 --grad_accum 3 --run_dir "$T/ref3"
runN 3 --zero 1 --run_dir "$T/r3a"
runN 3 --zero 1 --run_dir "$T/r3b"
same_run "$T/r3a" "$T/r3b" "two 3-rank runs"
# rank-order sums: 3 ranks are in fact one process's ((g0 + g1) + g2), bit for bit
same_run "$T/ref3" "$T/r3a" "3 ranks, zero 1 (one process, grad_accum 3)"
if ! jq -e -s -n --slurpfile a <(losses "$T/ref3") --slurpfile b <(losses "$T/r3a") \
    '[range($a | length)] | all(. as $i | ($a[$i][1] - $b[$i][1]) | fabs <= 1e-6 * ($a[$i][1] | fabs))' >/dev/null; then
  echo "FAIL: 3 ranks: losses not within 1e-6 relative of one process with grad_accum 3"; fail=1
fi

# --- save at 2 ranks, resume at 3 and at 1 (6 micro-batches a step throughout)
run1 --grad_accum 6 --zero 2 --run_dir "$T/ref6"
runN 2 --zero 2 --grad_accum 3 --stop_at $H --run_dir "$T/half"
cp -r "$T/half" "$T/half1"
runN 3 --zero 2 --grad_accum 2 --resume "$T/half" --run_dir "$T/half"
same_run "$T/ref6" "$T/half" "saved at 2 ranks, resumed at 3"
run1 --zero 2 --grad_accum 6 --resume "$T/half1" --run_dir "$T/half1"
same_run "$T/ref6" "$T/half1" "saved at 2 ranks, resumed at 1"
run1 --grad_accum 6 --stop_at $H --run_dir "$T/one_half"
runN 2 --zero 2 --grad_accum 3 --resume "$T/one_half" --run_dir "$T/one_half"
same_run "$T/ref6" "$T/one_half" "saved by one process, resumed at 2 ranks"

# --- a rank killed mid-step (SIGKILL after its backward in step H + 3): the job ends, naming it
t0=$(date +%s)
$MPI -np 1 "$S" train $A --ckpt_every 5 --zero 1 --run_dir "$T/kill" : \
     -np 1 env STRATA_FAILPOINT=dist_backward_done:$((H + 3)) "$S" train $A --ckpt_every 5 --zero 1 \
     --run_dir "$T/kill" >"$T/kill.out" 2>&1
rc=$?
dt=$(( $(date +%s) - t0 ))
check '[ $rc -ne 0 ]' "a killed rank: the job exited 0"
check '[ $dt -le 60 ]' "a killed rank: the job took $dt s to end"
check 'grep -q "rank 1" "$T/kill.out"' "a killed rank: no message names rank 1: $(tail -5 "$T/kill.out")"
check '! [ -d "$T/kill/checkpoints/$LAST" ]' "a killed rank: the run reached its end"
runN 2 --zero 1 --resume "$T/kill" --run_dir "$T/kill"
same_run "$T/ref2_f32" "$T/kill" "killed at step $((H + 3)), resumed at 2 ranks"

# --- a rank that hangs (SIGSTOP): the other stops after dist_timeout, naming it
$MPI -np 2 "$S" train $A --steps 100000 --dist_timeout 3 --run_dir "$T/hang" >"$T/hang.out" 2>&1 &
mp=$!
pid1=""
for i in $(seq 1 100); do
  for p in $(pgrep -f "run_dir $T/hang" 2>/dev/null); do
    if tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=1"; then pid1=$p; fi
  done
  [ -n "$pid1" ] && [ -s "$T/hang/metrics.jsonl" ] && break
  sleep 0.1
done
if [ -z "$pid1" ]; then
  echo "FAIL: hang: rank 1's process not found"; fail=1; kill $mp 2>/dev/null
else
  t0=$(date +%s)
  kill -STOP "$pid1"
  wait $mp
  rc=$?
  dt=$(( $(date +%s) - t0 ))
  kill -CONT "$pid1" 2>/dev/null; kill -9 "$pid1" 2>/dev/null
  check '[ $rc -ne 0 ]' "hang: the job exited 0"
  check '[ $dt -le 60 ]' "hang: the job took $dt s to end"
  check 'grep -q "nothing from rank 1 within 3 s" "$T/hang.out"' "hang: no error names rank 1: $(grep -m3 strata "$T/hang.out")"
fi

# --- bad inputs, each refused with an error naming what is wrong
cp -r "$T/z1_f32" "$T/bad1"
echo '{"format":"strata-shards","world":2,"bounds":[0,5]}' >"$T/bad1/checkpoints/$LAST/shards.json"
"$S" train $A --resume "$T/bad1" --steps $((STEPS + 1)) >"$T/bad1.out" 2>&1
rc=$?
check '[ $rc -ne 0 ] && grep -q "shards.json: keys .world. and .bounds." "$T/bad1.out"' \
  "a corrupt shards.json: no error naming it: $(tail -2 "$T/bad1.out")"
cp -r "$T/z1_f32" "$T/bad2"
rm "$T/bad2/checkpoints/$LAST/train_state.rank00001.bin"
"$S" train $A --resume "$T/bad2" --steps $((STEPS + 1)) >"$T/bad2.out" 2>&1
rc=$?
check '[ $rc -ne 0 ] && grep -q "train_state.rank00001.bin: cannot open" "$T/bad2.out"' \
  "a missing rank file: no error naming it: $(tail -2 "$T/bad2.out")"
mkdir -p "$T/disk1a/rank0-of-4" && cp "$T/disk1a/rank0-of-2/strata-state.manifest" "$T/disk1a/rank0-of-4/"
$MPI -np 3 "$S" train $A --zero 1 --state_paths "$T/disk1a,$T/disk1b" --resume "$T/zd1" --run_dir "$T/zd1" \
  >"$T/bad3.out" 2>&1
rc=$?
check '[ $rc -ne 0 ] && grep -q "disk1a holds the disk states of 2 and 4 ranks: cannot tell which" "$T/bad3.out"' \
  "disk states of two numbers of ranks, resumed at a third: no clear error: $(grep -m1 strata "$T/bad3.out")"
$MPI -np 2 "$S" train $A --device_budget 1e6 --run_dir "$T/bad4" >"$T/bad4.out" 2>&1
rc=$?
check '[ $rc -ne 0 ] && grep -q "rank 0 of 2: key .device_budget.: 1000000 bytes is too small for this model" "$T/bad4.out"' \
  "a device_budget too small under ranks: not refused clearly: $(grep -m1 strata "$T/bad4.out")"
"$S" train $A --zero 3 --run_dir "$T/bad5" >"$T/bad5.out" 2>&1
rc=$?
check '[ $rc -ne 0 ] && grep -q "zero" "$T/bad5.out"' "--zero 3 accepted: $(tail -1 "$T/bad5.out")"
"$S" bench dist --gather_overlap yes --json >"$T/bad6.out" 2>&1
rc=$?
check '[ $rc -eq 2 ] && grep -q "gather_overlap 1 or 0" "$T/bad6.out"' \
  "bench dist --gather_overlap yes accepted: $(tail -1 "$T/bad6.out")"

# --- ranks given different configurations
$MPI -np 1 "$S" train $A --run_dir "$T/cfg" : -np 1 "$S" train $A --seed 7 --run_dir "$T/cfg" >"$T/cfg.out" 2>&1
rc=$?
check '[ $rc -ne 0 ]' "different seeds on two ranks: accepted"
check 'grep -q "rank 1.s key .seed. differs from rank 0.s" "$T/cfg.out"' "different seeds: no error naming the key: $(grep -m2 strata "$T/cfg.out")"

[ $fail -eq 0 ] && echo "PASS: ZeRO 0/1/2 x f32/8bit at 2 ranks, disk state, 3 ranks, resume 2->3, 2->1, 1->2, kill, rollback, hang, config check"
exit $fail
