#!/usr/bin/env bash
# test_poetx_dist.sh - method poetx under 2 ranks (mpirun) trains exactly as one process with
# grad_accum 2, through merges: the Q vector is the run's parameter vector, its gradient
# averaged as any run's; at a merge every rank waits for the step's weights to be gathered,
# folds R and P into its whole copy of W0 alike (the permutations from the seed and the step)
# and resets Q's moments in its own shard of the optimizer (ZeRO 1, 2) or all of them (ZeRO 0).
# Checked: the same losses every step and byte-identical merged weights (--save_hf) for ZeRO
# 0, 1 and 2 against one process, 8 steps with merges at 3 and 6; and a 2-rank run stopped at
# step 4 and resumed continues bit for bit. Q at its own learning rate (the optimizer's second
# class, which each shard's clipped segments keep) and a clip ramp after each merge. Skips (77)
# where mpirun is missing or strata was built without MPI. With poetx_init orthogonal too: every
# rank draws the same flat W0 as one process, over an int8 W0 too. With the disk state (state_paths): 2 ranks against
# one process, stopped and resumed at 2 ranks and in one process (the re-shard finds W0's file in
# the ranks' directories), the stores one step apart across a merge, one rank's W0 file of the
# start missing (every rank draws it again); another run's W0 file met by the re-shard refused,
# or passed over for this run's; strata plan's disk tier under 2 ranks against the W0 files on
# disk at their peak (three merges' files a rank).
set -u
. "$(dirname "$0")/lib_corpus.sh"
corpus_begin poetxdist
corpus_mpi
P="--model gpt2-tiny --vocab_size 256 --batch 2 --seq 16 --sample_every 0 --eval_every 0 --quiet 1 --threads 1
   --method poetx --poetx_block 16 --poetx_merge_every 3 --steps 8 --lr 1e-2 --poetx_lr 3e-2 --poetx_clip_ramp 2"
losses() { python3 -c "import json,sys; print(' '.join(repr(json.loads(l)['loss']) for l in open(sys.argv[1]) if 'loss' in l))" "$1/metrics.jsonl" 2>/dev/null; }
$MPI -np 2 "$S" train $P --zero 0 --run_dir "$T/z0" --save_hf "$T/hf_z0" >"$T/z0.out" 2>&1
if grep -q "built without MPI" "$T/z0.out"; then echo "SKIP: this strata was built without MPI"; rm -rf "$T"; exit 77; fi
"$S" train $P --grad_accum 2 --run_dir "$T/one" --save_hf "$T/hf_one" >"$T/one.out" 2>&1
check '[ $? -eq 0 ] && [ -n "$(losses "$T/one")" ]' "one process: $(tail -2 "$T/one.out")"
for z in 0 1 2; do
  [ $z -gt 0 ] && $MPI -np 2 "$S" train $P --zero $z --run_dir "$T/z$z" --save_hf "$T/hf_z$z" >"$T/z$z.out" 2>&1
  check '[ "$(losses "$T/z$z")" = "$(losses "$T/one")" ]' \
    "2 ranks, zero $z: $(losses "$T/z$z") against one process's $(losses "$T/one"): $(tail -2 "$T/z$z.out")"
  check 'cmp -s "$T/hf_z$z/model.safetensors" "$T/hf_one/model.safetensors"' "2 ranks, zero $z: the merged weights differ"
done
$MPI -np 2 "$S" train $P --zero 1 --stop_at 4 --run_dir "$T/part" >"$T/part.out" 2>&1
$MPI -np 2 "$S" train $P --zero 1 --resume "$T/part" --run_dir "$T/part" >"$T/res.out" 2>&1
check '[ $? -eq 0 ] && [ "$(losses "$T/part")" = "$(losses "$T/one")" ]' \
  "2 ranks stopped at 4 and resumed: $(losses "$T/part") against $(losses "$T/one"): $(tail -2 "$T/res.out")"
# W0 started flat (poetx_init orthogonal): every rank draws the same W0 as one process
O="--poetx_init orthogonal --poetx_init_gain 3"
"$S" train $P $O --grad_accum 2 --run_dir "$T/o_one" --save_hf "$T/hf_o_one" >"$T/o_one.out" 2>&1
$MPI -np 2 "$S" train $P $O --zero 1 --run_dir "$T/o_z1" --save_hf "$T/hf_o_z1" >"$T/o_z1.out" 2>&1
check '[ -n "$(losses "$T/o_one")" ] && [ "$(losses "$T/o_z1")" = "$(losses "$T/o_one")" ] && [ "$(losses "$T/o_one")" != "$(losses "$T/one")" ] && cmp -s "$T/hf_o_z1/model.safetensors" "$T/hf_o_one/model.safetensors"' \
  "poetx_init orthogonal, 2 ranks zero 1: $(losses "$T/o_z1") against one process's $(losses "$T/o_one") (and not the model init's), or the merged weights differ: $(tail -1 "$T/o_z1.out")"
# the same over an int8 W0 drawn a tensor at a time: the ranks make each batch of W0 orthogonal
# together (a weight drawn by one rank and broadcast; a batch of both ranks' threads, 2 against one
# process's 1), rounding each into the store as the batch is done
"$S" train $P $O --frozen_dtype int8 --grad_accum 2 --run_dir "$T/o8_one" --save_hf "$T/hf_o8_one" >"$T/o8_one.out" 2>&1
$MPI -np 2 "$S" train $P $O --frozen_dtype int8 --zero 1 --run_dir "$T/o8_z1" --save_hf "$T/hf_o8_z1" >"$T/o8_z1.out" 2>&1
check '[ -n "$(losses "$T/o8_one")" ] && [ "$(losses "$T/o8_z1")" = "$(losses "$T/o8_one")" ] && cmp -s "$T/hf_o8_z1/model.safetensors" "$T/hf_o8_one/model.safetensors"' \
  "poetx_init orthogonal over int8, 2 ranks zero 1: $(losses "$T/o8_z1") against one process's $(losses "$T/o8_one"), or the merged weights differ: $(tail -1 "$T/o8_z1.out")"
# --- the disk state (state_paths) under ranks: each rank's store in its own directory with its own
# W0 files; bit for bit one process in memory
mkdir -p "$T/st_z1"
$MPI -np 2 "$S" train $P --zero 1 --state_paths "$T/st_z1" --run_dir "$T/d_z1" --save_hf "$T/hf_d_z1" >"$T/d_z1.out" 2>&1
check '[ $? -eq 0 ] && [ "$(losses "$T/d_z1")" = "$(losses "$T/one")" ] && cmp -s "$T/hf_d_z1/model.safetensors" "$T/hf_one/model.safetensors"' \
  "2 ranks, zero 1, state_paths: $(losses "$T/d_z1") against one process's $(losses "$T/one"): $(tail -2 "$T/d_z1.out")"
check '[ -f "$T/st_z1/rank0-of-2/strata-state.poetx-w0-000000006.safetensors" ] && [ -f "$T/st_z1/rank1-of-2/strata-state.poetx-w0-000000006.safetensors" ] && cmp -s "$T/st_z1/rank0-of-2/strata-state.poetx-w0-000000006.safetensors" "$T/st_z1/rank1-of-2/strata-state.poetx-w0-000000006.safetensors"' \
  "2 ranks, state_paths: the ranks' W0 files of the merge at 6 differ or are missing: $(ls "$T/st_z1"/rank*-of-2 | tr '\n' ' ')"
# stopped at 4, resumed at 2 ranks; stopped at 4, resumed in one process (the re-shard: W0 of the
# merge at 3 from the ranks' directories)
for how in 2 1 1to2; do
  d="$T/dstop$how"
  mkdir -p "$d.st"
  if [ $how = 1to2 ]; then # and the other way: one process stopped at 4, resumed at 2 ranks
    "$S" train $P --grad_accum 2 --stop_at 4 --state_paths "$d.st" --run_dir "$d" >"$d.1.out" 2>&1
  else
    $MPI -np 2 "$S" train $P --zero 1 --stop_at 4 --state_paths "$d.st" --run_dir "$d" >"$d.1.out" 2>&1
  fi
  if [ $how != 1 ]; then # one micro-batch a rank (a resume takes the run's grad_accum where not given)
    $MPI -np 2 "$S" train $P --zero 1 --grad_accum 1 --state_paths "$d.st" --resume "$d" --run_dir "$d" --save_hf "$d.hf" \
      >"$d.2.out" 2>&1
  else
    "$S" train $P --grad_accum 2 --state_paths "$d.st" --resume "$d" --run_dir "$d" --save_hf "$d.hf" >"$d.2.out" 2>&1
  fi
  check '[ $? -eq 0 ] && [ "$(losses "$d")" = "$(losses "$T/one")" ] && cmp -s "$d.hf/model.safetensors" "$T/hf_one/model.safetensors"' \
    "state_paths, 2 ranks stopped at 4, resumed at $how: $(losses "$d") against $(losses "$T/one"): $(tail -2 "$d.2.out")"
done
# the ranks' stores one step apart across a merge (what a kill between two ranks' commits leaves):
# both stopped at 6, rank 1's store returned to its commit of 5 (the store's previous manifest);
# the resume returns rank 0 to 5 as well, which needs W0 of the merge at 3 beside both stores
d="$T/dapart"
mkdir -p "$d.st"
$MPI -np 2 "$S" train $P --zero 1 --stop_at 6 --state_paths "$d.st" --run_dir "$d" >"$d.1.out" 2>&1
mv "$d.st/rank1-of-2/strata-state.manifest.prev" "$d.st/rank1-of-2/strata-state.manifest"
$MPI -np 2 "$S" train $P --zero 1 --state_paths "$d.st" --resume "$d" --run_dir "$d" --save_hf "$d.hf" >"$d.2.out" 2>&1
rc=$?
check '[ $rc -eq 0 ] && grep -q "committed step 6, another rank only 5: returning to it" "$d.2.out" && [ "$(losses "$d")" = "$(losses "$T/one")" ] && cmp -s "$d.hf/model.safetensors" "$T/hf_one/model.safetensors"' \
  "state_paths, the stores one step apart across a merge, resumed (rc $rc): $(losses "$d") against $(losses "$T/one"): $(grep -h "returning\|strata train:" "$d.2.out" | head -3)"
# a timeline left: the same two stores one step apart, resumed with another schedule (--steps 16:
# the merge at 6 makes another W0) and killed on both ranks right after the store committed 6,
# before the merge's file; resumed again, the merge is made again from W0 of 3 and the store's Q,
# not read from the W0 of 6 the first timeline left beside the stores. Reference: one process
# stopped at 5 and resumed with --steps 16.
d="$T/dleft"
mkdir -p "$d.st"
$MPI -np 2 "$S" train $P --zero 1 --stop_at 6 --state_paths "$d.st" --run_dir "$d" >"$d.1.out" 2>&1
mv "$d.st/rank1-of-2/strata-state.manifest.prev" "$d.st/rank1-of-2/strata-state.manifest"
$MPI -np 2 env STRATA_FAILPOINT=train_update_committed:1 "$S" train $P --zero 1 --steps 16 --state_paths "$d.st" \
  --resume "$d" --run_dir "$d" >"$d.2.out" 2>&1
$MPI -np 2 "$S" train $P --zero 1 --steps 16 --state_paths "$d.st" --resume "$d" --run_dir "$d" --save_hf "$d.hf" \
  >"$d.3.out" 2>&1
rc=$?
"$S" train $P --grad_accum 2 --stop_at 5 --run_dir "$T/left1" >"$T/left1.1.out" 2>&1
"$S" train $P --grad_accum 2 --steps 16 --resume "$T/left1" --run_dir "$T/left1" --save_hf "$T/left1.hf" >"$T/left1.2.out" 2>&1
# (the kill came before step 6's log line: the losses logged are the reference's less that one)
check '[ $rc -eq 0 ] && grep -q "made again" "$d.3.out" && [ -n "$(losses "$T/left1")" ] && [ "$(losses "$d")" = "$(losses "$T/left1" | cut -d" " -f1-5,7-)" ] && cmp -s "$d.hf/model.safetensors" "$T/left1.hf/model.safetensors"' \
  "state_paths, a timeline left and the merge at 6 cut short (rc $rc): $(losses "$d") against $(losses "$T/left1"): $(grep -h "made again\|strata train:" "$d.3.out" | head -3)"
# flat W0 with the disk state under ranks: the start's W0 file beside every rank's store
mkdir -p "$T/st_o"
$MPI -np 2 "$S" train $P $O --zero 1 --state_paths "$T/st_o" --run_dir "$T/d_o" --save_hf "$T/hf_d_o" >"$T/d_o.out" 2>&1
check '[ $? -eq 0 ] && [ "$(losses "$T/d_o")" = "$(losses "$T/o_one")" ] && cmp -s "$T/hf_d_o/model.safetensors" "$T/hf_o_one/model.safetensors"' \
  "poetx_init orthogonal, 2 ranks, state_paths: $(losses "$T/d_o") against one process's $(losses "$T/o_one"): $(tail -2 "$T/d_o.out")"
# killed after the stores were created and before every rank's W0 file of the start was in place:
# a run of no step at 2 ranks, then rank 1's file removed (the resume takes rank 0's, the same
# bits), or both (every rank draws W0 again, the ranks agreeing that one lacks it); each resume
# ends on one process's run
for gone in 1 01; do
  d="$T/nostep$gone"
  mkdir -p "$d.st"
  $MPI -np 2 "$S" train $P $O --zero 1 --steps 0 --state_paths "$d.st" --run_dir "$d" >"$d.1.out" 2>&1
  w00=strata-state.poetx-w0-000000000.safetensors
  check '[ -f "$d.st/rank0-of-2/$w00" ] && [ -f "$d.st/rank1-of-2/$w00" ]' \
    "2 ranks, a run of no step: the start's W0 files: $(ls "$d.st"/rank*-of-2 | tr '\n' ' ')"
  rm -f "$d.st/rank1-of-2/$w00"
  [ $gone = 01 ] && rm -f "$d.st/rank0-of-2/$w00"
  $MPI -np 2 "$S" train $P $O --zero 1 --state_paths "$d.st" --resume "$d" --run_dir "$d" --save_hf "$d.hf" >"$d.2.out" 2>&1
  rc=$?
  [ $gone = 1 ] && said="W0 of the merge at step 0 taken from .*rank0-of-2" || said="W0 drawn again from the seed"
  check '[ $rc -eq 0 ] && grep -q "$said" "$d.2.out" && [ "$(losses "$d")" = "$(losses "$T/o_one")" ] && cmp -s "$d.hf/model.safetensors" "$T/hf_o_one/model.safetensors" && cmp -s "$d.st/rank0-of-2/strata-state.poetx-w0-000000006.safetensors" "$d.st/rank1-of-2/strata-state.poetx-w0-000000006.safetensors"' \
    "2 ranks, W0 files of the start missing ($gone), resumed (rc $rc): $(losses "$d") against $(losses "$T/o_one"): $(grep -h "W0 \|strata train:" "$d.2.out" | head -3)"
done
# another run's W0 file (another seed) of the merge at 3 in place of this run's beside a store of one
# process, resumed at 2 ranks (the re-shard looks for the merge's file there): refused naming the
# file and poetx_run; this run's file then beside a store of another layout (rank0-of-3), the other
# run's left where it was: the resume passes over the other run's (met first) and ends on one
# process's run bit for bit
d="$T/dother"
mkdir -p "$d.st" "$T/dseed.st"
"$S" train $P --grad_accum 2 --stop_at 4 --state_paths "$d.st" --run_dir "$d" >"$d.1.out" 2>&1
"$S" train $P --grad_accum 2 --seed 7 --stop_at 4 --state_paths "$T/dseed.st" --run_dir "$T/dseed" >"$T/dseed.out" 2>&1
w3=strata-state.poetx-w0-000000003.safetensors
mv "$d.st/$w3" "$d.own3"
cp "$T/dseed.st/$w3" "$d.st/$w3"
$MPI -np 2 "$S" train $P --zero 1 --grad_accum 1 --state_paths "$d.st" --resume "$d" --run_dir "$d" >"$d.2.out" 2>&1
rc=$?
check '[ $rc -ne 0 ] && grep -q "$d.st/$w3: metadata poetx_run is .*, this run" "$d.2.out"' \
  "state_paths, another run's W0 file met by the re-shard: refused naming it and poetx_run (rc $rc): $(grep -h "strata train:" "$d.2.out" | head -1)"
mkdir -p "$d.st/rank0-of-3"
mv "$d.own3" "$d.st/rank0-of-3/$w3"
$MPI -np 2 "$S" train $P --zero 1 --grad_accum 1 --state_paths "$d.st" --resume "$d" --run_dir "$d" --save_hf "$d.hf" \
  >"$d.3.out" 2>&1
rc=$?
check '[ $rc -eq 0 ] && grep -q "taken from .*rank0-of-3" "$d.3.out" && [ "$(losses "$d")" = "$(losses "$T/one")" ] && cmp -s "$d.hf/model.safetensors" "$T/hf_one/model.safetensors"' \
  "state_paths, the re-shard past another run's W0 file to this run's (rc $rc): $(losses "$d") against $(losses "$T/one"): $(grep -h "taken from\|strata train:" "$d.3.out" | head -2)"
# strata plan's disk tier under ranks against the W0 files at their peak: 2 ranks killed right after
# the file of the merge at 9 is written, before the older ones are removed (three merges' files,
# 3, 6 and 9, beside the rank's store: the merge before the last kept, a store may return to the
# step before); the plan's disk tier less the store's two regions (3 x the fp32 moments: master
# and moments, twice) is those three files' W0 and permutations, byte for byte the files' data
d="$T/peak"
mkdir -p "$d.st"
$MPI -np 2 env STRATA_FAILPOINT=poetx_w0_written:3 "$S" train $P --zero 1 --steps 10 --state_paths "$d.st" \
  --run_dir "$d" >"$d.out" 2>&1
most=0 at=""
for r in "$d.st"/rank*-of-2; do
  n=$(ls "$r" | grep -c "poetx-w0-.*safetensors$")
  [ "$n" -gt "$most" ] && most=$n at=$r
done
data=0 # each file's data section: its size less the 8-byte length and the JSON header
for f in "$at"/strata-state.poetx-w0-*.safetensors; do
  [ -f "$f" ] && data=$((data + $(stat -c %s "$f") - 8 - $(od -An -t u8 -N8 "$f" | tr -d ' ')))
done
row() { awk -v k="$1" '$1 == k && $2 ~ /^[0-9]+$/ {print $2; exit} $1 == "moments," && $2 == "fp32" && k == "m" {print $5; exit}'; }
plan2=$($MPI -np 2 "$S" plan $P --zero 1 --steps 10 --state_paths "$d.st" 2>/dev/null)
pdisk=$(echo "$plan2" | row disk) pmom=$(echo "$plan2" | row m)
check '[ "$most" -eq 3 ] && [ -n "$pdisk" ] && [ -n "$pmom" ] && [ $((pdisk - 3 * pmom)) -eq "$data" ]' \
  "strata plan under 2 ranks: disk $pdisk less the store (3 x $pmom) is not the $data bytes of the $most W0 files at the peak in $at: $(ls "$at" | tr '\n' ' ')"
echo "poetx_dist: $(losses "$T/one")"
[ $fail -eq 0 ] && rm -rf "$T"
exit $fail
