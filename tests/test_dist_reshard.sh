#!/usr/bin/env bash
# test_dist_reshard.sh - a disk state (--state_paths on two paths, each rank's shard in its
# own store PATH/rankR-of-W) resumed at another number of MPI ranks is re-sharded exactly:
# - f32 and 8-bit: saved at 2 ranks, resumed at 3 and at 1, the continued losses and the
#   final weights equal an uninterrupted one-process run's bit for bit (ZeRO 2, the same 6
#   micro-batches a step throughout, as test_dist.sh's in-RAM resumes), and the old stores'
#   files are unchanged;
# - saved by one process, resumed at 2 ranks, and saved at 2 ranks with ZeRO 0 (each rank's
#   store a whole copy), resumed by one process: the same;
# - stores one step apart after a crash: the ahead one is read at its previous commit;
# - a rank killed while it re-shards (its new store written, not committed): the job fails,
#   the next resume makes the store again and continues exactly;
# - two disk states of different numbers of ranks in one path (the old one kept after a
#   re-shard) resumed at a third: refused, naming both; the kept old stores resumed at
#   their own number of ranks while the new ones went on: refused, naming the later step.
# Skips (77) where mpirun is missing or strata was built without MPI.
set -u
S=${STRATA_BIN:?STRATA_BIN not set}
command -v mpirun >/dev/null || { echo "SKIP: mpirun not found (apt-get install openmpi-bin libopenmpi-dev)"; exit 77; }
command -v jq >/dev/null || { echo "SKIP: jq not found"; exit 77; }
. "$(dirname "$0")/mpi_sanitized.sh" # OpenMPI's own leaks, under the sanitizers
T=$(mktemp -d /tmp/strata-test-reshard-XXXXXX)
trap 'rm -rf "$T"' EXIT
fail=0
check() { if ! eval "$1"; then echo "FAIL: $2"; fail=1; fi; }
MPI="mpirun --allow-run-as-root --oversubscribe --bind-to none"
# 433 thousand parameters, enough for 3 shards; an 8 MB state budget makes 1 MiB subgroups,
# so a store holds several and the old and new shards' subgroups are cut in different places
A="--model gpt2-tiny --n_embd 128 --n_layer 2 --vocab_size 256 --max_seq 32 --batch 2 --seq 32 --steps 8
   --warmup_steps 2 --eval_every 0 --sample_every 0 --threads 1 --quiet 1 --grad_clip 0.5 --zero 2"
D="--state_budget 8e6"
H=4
LAST=step_00000008

$MPI -np 2 "$S" train $A --grad_accum 3 --run_dir "$T/probe" >"$T/probe.out" 2>&1
if grep -q "built without MPI" "$T/probe.out"; then echo "SKIP: this strata was built without MPI"; exit 77; fi
if ! [ -f "$T/probe/metrics.jsonl" ]; then
  echo "FAIL: mpirun -np 2 strata train did not run:"; tail -20 "$T/probe.out"; exit 1
fi

losses() { jq -c '[.step, .loss, .grad_norm]' "$1/metrics.jsonl"; }
same_store() { # $1 reference run dir (in RAM), $2 run dir (disk state: its final weights are RUN_DIR/model.safetensors), $3 what
  if ! cmp -s <(losses "$1") <(losses "$2"); then
    echo "FAIL: $3: losses differ from the reference:"; diff <(losses "$1") <(losses "$2") | head -6; fail=1
  elif ! cmp -s "$1/checkpoints/$LAST/model.safetensors" "$2/model.safetensors"; then
    echo "FAIL: $3: final weights differ from the reference"; fail=1
  fi
}
run1() { "$S" train $A "$@" >>"$T/one.out" 2>&1 || { echo "FAIL: one process $*: $(tail -2 "$T/one.out")"; fail=1; }; }
runN() { local n=$1; shift; $MPI -np "$n" "$S" train $A "$@" >>"$T/mpi.out" 2>&1 ||
  { echo "FAIL: $n ranks $*: $(tail -4 "$T/mpi.out")"; fail=1; }; }
# the old stores' files (not their lock files, which name their last holder)
sums() { (cd "$T" && find "$@" -name 'strata-state.*' ! -name '*.lock' -type f | sort | xargs md5sum); }

for fmt in f32 8bit; do
  run1 --grad_accum 6 --optim_state $fmt --run_dir "$T/ref_$fmt"
  P="$T/a_$fmt,$T/b_$fmt"
  mkdir -p "$T/a_$fmt" "$T/b_$fmt"
  runN 2 --grad_accum 3 --optim_state $fmt --state_paths "$P" $D --stop_at $H --run_dir "$T/h_$fmt"
  # the same state twice: one copy resumes at 3 ranks, the other at 1
  cp -r "$T/h_$fmt" "$T/h1_$fmt"; cp -r "$T/a_$fmt" "$T/a1_$fmt"; cp -r "$T/b_$fmt" "$T/b1_$fmt"
  before=$(sums "a_$fmt" "b_$fmt")
  : >"$T/mpi.out"
  runN 3 --grad_accum 2 --optim_state $fmt --state_paths "$P" $D --resume "$T/h_$fmt" --run_dir "$T/h_$fmt"
  same_store "$T/ref_$fmt" "$T/h_$fmt" "$fmt: saved at 2 ranks, resumed at 3"
  check 'grep -q "re-sharded the disk state of 2 ranks to 3 ranks (step $H)" "$T/mpi.out"' \
    "$fmt: 2 -> 3: no line saying the state was re-sharded: $(grep -m2 strata "$T/mpi.out")"
  check '[ -f "$T/b_$fmt/rank2-of-3/strata-state.bin" ]' "$fmt: 2 -> 3: no store of rank 2 in its directories"
  check '[ "$(sums "a_$fmt/rank0-of-2" "a_$fmt/rank1-of-2" "b_$fmt/rank0-of-2" "b_$fmt/rank1-of-2")" = "$before" ]' \
    "$fmt: 2 -> 3: the old stores' files changed"
  : >"$T/one.out"
  run1 --grad_accum 6 --optim_state $fmt --state_paths "$T/a1_$fmt,$T/b1_$fmt" $D --resume "$T/h1_$fmt" \
       --run_dir "$T/h1_$fmt"
  same_store "$T/ref_$fmt" "$T/h1_$fmt" "$fmt: saved at 2 ranks, resumed at 1"
  check 'grep -q "re-sharded the disk state of 2 ranks to 1 ranks (step $H)" "$T/one.out"' \
    "$fmt: 2 -> 1: no line saying the state was re-sharded: $(tail -2 "$T/one.out")"
  check '[ -f "$T/a1_$fmt/strata-state.manifest" ]' "$fmt: 2 -> 1: no plain store in the first path"
done

# --- saved by one process, resumed at 2 ranks
mkdir -p "$T/a1" "$T/b1"
run1 --grad_accum 6 --state_paths "$T/a1,$T/b1" $D --stop_at $H --run_dir "$T/one"
runN 2 --grad_accum 3 --state_paths "$T/a1,$T/b1" $D --resume "$T/one" --run_dir "$T/one"
same_store "$T/ref_f32" "$T/one" "saved by one process, resumed at 2 ranks"

# --- rank 1 killed once its new store is written, before its manifest: the next resume
# makes it again (rank 0's, committed or not, is used or made) and goes on exactly
mkdir -p "$T/ak" "$T/bk"
runN 2 --grad_accum 3 --state_paths "$T/ak,$T/bk" $D --stop_at $H --run_dir "$T/k"
$MPI -np 1 "$S" train $A --grad_accum 2 --state_paths "$T/ak,$T/bk" $D --resume "$T/k" --run_dir "$T/k" : \
     -np 1 env STRATA_FAILPOINT=store_filled "$S" train $A --grad_accum 2 --state_paths "$T/ak,$T/bk" $D \
     --resume "$T/k" --run_dir "$T/k" : \
     -np 1 "$S" train $A --grad_accum 2 --state_paths "$T/ak,$T/bk" $D --resume "$T/k" --run_dir "$T/k" \
     >"$T/kill.out" 2>&1
check '[ $? -ne 0 ]' "a rank killed while re-sharding: the job exited 0"
check '! [ -f "$T/ak/rank1-of-3/strata-state.manifest" ]' "a rank killed while re-sharding: its store was committed"
runN 3 --grad_accum 2 --state_paths "$T/ak,$T/bk" $D --resume "$T/k" --run_dir "$T/k"
same_store "$T/ref_f32" "$T/k" "a rank killed while re-sharding, resumed again"

# --- ZeRO 0 at 2 ranks (each rank's store a whole copy), resumed at 1 (one process's order
# of 2 micro-batches: ZeRO 0 sums each rank's micro-batches before the ranks')
run1 --grad_accum 2 --run_dir "$T/ref2"
mkdir -p "$T/a0" "$T/b0"
runN 2 --zero 0 --state_paths "$T/a0,$T/b0" $D --stop_at $H --run_dir "$T/z0"
run1 --grad_accum 2 --state_paths "$T/a0,$T/b0" $D --resume "$T/z0" --run_dir "$T/z0"
same_store "$T/ref2" "$T/z0" "ZeRO 0 at 2 ranks, resumed at 1"

# --- stores one step apart (rank 1 killed before its update of step H: rank 0 committed H,
# rank 1 only H - 1): the re-shard reads rank 0's at its previous commit, changing nothing
mkdir -p "$T/ap" "$T/bp"
$MPI -np 1 "$S" train $A --grad_accum 3 --state_paths "$T/ap,$T/bp" $D --run_dir "$T/p" : \
     -np 1 env STRATA_FAILPOINT=dist_before_update:$H "$S" train $A --grad_accum 3 --state_paths "$T/ap,$T/bp" $D \
     --run_dir "$T/p" >"$T/p.out" 2>&1
check '[ $? -ne 0 ]' "a rank killed before its update: the job exited 0"
before=$(sums ap bp)
: >"$T/mpi.out"
runN 3 --grad_accum 2 --state_paths "$T/ap,$T/bp" $D --resume "$T/p" --run_dir "$T/p"
check 'grep -q "re-sharded the disk state of 2 ranks to 3 ranks (step $((H - 1)))" "$T/mpi.out"' \
  "stores one step apart: not re-sharded at the older step: $(grep -m2 strata "$T/mpi.out")"
check '[ "$(sums ap/rank0-of-2 ap/rank1-of-2 bp/rank0-of-2 bp/rank1-of-2)" = "$before" ]' \
  "stores one step apart: the old stores' files changed"
same_store "$T/ref_f32" "$T/p" "stores one step apart, re-sharded to 3 ranks"

# --- two disk states in one path (2 ranks' kept after the re-shard to 3): which one is refused
"$S" train $A --grad_accum 6 --state_paths "$T/a_f32,$T/b_f32" $D --resume "$T/h_f32" --run_dir "$T/h_f32" \
  --steps 9 >"$T/amb.out" 2>&1
rc=$?
check '[ $rc -ne 0 ] && grep -q "holds the disk states of 2 and 3 ranks" "$T/amb.out"' \
  "two disk states in one path: not refused naming both: $(grep -m1 strata "$T/amb.out")"

# --- the kept stores of 2 ranks (step 4) resumed while those of 3 went on to step 8: refused
$MPI -np 2 "$S" train $A --grad_accum 3 --state_paths "$T/a_f32,$T/b_f32" $D --resume "$T/h_f32" \
  --run_dir "$T/h_f32" --steps 9 >"$T/old.out" 2>&1
rc=$?
check '[ $rc -ne 0 ] && grep -q "holds the disk state of 3 ranks at step 8, after this one.s (2 ranks, step $H)" "$T/old.out"' \
  "the old stores resumed while a later state exists: not refused: $(grep -m1 strata "$T/old.out")"
check '[ "$(losses "$T/h_f32" | wc -l)" = 8 ]' "the refused resume changed the run's metrics"

[ $fail -eq 0 ] && echo "PASS: disk state re-sharded 2->3, 2->1 (f32, 8bit), 1->2, ZeRO 0 2->1, one step apart, killed mid re-shard, two states and a stale one refused"
exit $fail
