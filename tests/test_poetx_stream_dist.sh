#!/usr/bin/env bash
# test_poetx_stream_dist.sh - method poetx under layer streaming (device_budget, device cpu) and 2
# ranks (mpirun): each rank streams its own copy of the base (W0 in its blocks, gpt2-tiny with 6
# blocks, every block recomputed, prefetch depth 1), the hook's gradient of the POET-X vector is
# reduced as any run's, the step updates the vector (a rank's shard under ZeRO 1 and 2) and the
# weights gathered before the next step copies the base's trainables into the executor. Against one
# process streamed at grad_accum 2 with the same global batch, 8 steps with merges at 3 and 6:
#  - ZeRO 0 and 2: the same losses and a byte-identical merged model (--save_hf); the one-process
#    streamed run itself equals one process in memory at grad_accum 2;
#  - ZeRO 1 with the disk state (state_paths): the same, and the ranks' W0 files of the merge at 6
#    byte-identical; ZeRO 2 with the disk state stopped at step 4 and resumed from the stores;
#  - ZeRO 1 with the state in RAM stopped at step 4 and resumed from the checkpoint;
#  - validation between the steps (eval_every 2): the same val_loss as one process streamed.
# Skips (77) where mpirun is missing or strata was built without MPI.
set -u
. "$(dirname "$0")/lib_corpus.sh"
corpus_begin poetxstreamdist
corpus_mpi
P="--model gpt2-tiny --n_layer 6 --vocab_size 256 --batch 2 --seq 16 --sample_every 0 --eval_every 0 --quiet 1
   --threads 1 --method poetx --poetx_block 8 --poetx_merge_every 3 --steps 8 --lr 1e-2 --poetx_lr 3e-2
   --poetx_clip_ramp 2"
D="--device_budget 400000 --act recompute"
losses() { python3 -c "import json,sys; print(' '.join(repr(json.loads(l)['loss']) for l in open(sys.argv[1]) if 'loss' in l))" "$1/metrics.jsonl" 2>/dev/null; }
vals() { python3 -c "import json,sys; print(' '.join(repr(json.loads(l)['val_loss']) for l in open(sys.argv[1]) if 'val_loss' in l))" "$1/metrics.jsonl" 2>/dev/null; }
same_hf() { cmp -s "$1/model.safetensors" "$2/model.safetensors"; }

$MPI -np 2 "$S" train $P $D --zero 0 --run_dir "$T/z0" --save_hf "$T/z0.hf" >"$T/z0.out" 2>&1
rc=$?
if grep -q "built without MPI" "$T/z0.out"; then echo "SKIP: this strata was built without MPI"; rm -rf "$T"; exit 77; fi
"$S" train $P $D --grad_accum 2 --run_dir "$T/one" --save_hf "$T/one.hf" >"$T/one.out" 2>&1
check '[ $? -eq 0 ] && grep -q "prefetch depth 1" "$T/one.out" && [ -n "$(losses "$T/one")" ]' \
  "one process streamed, grad_accum 2: $(tail -2 "$T/one.out")"
"$S" train $P --grad_accum 2 --run_dir "$T/mem" --save_hf "$T/mem.hf" >"$T/mem.out" 2>&1
check '[ "$(losses "$T/mem")" = "$(losses "$T/one")" ] && same_hf "$T/mem.hf" "$T/one.hf"' \
  "one process in memory: $(losses "$T/mem") against streamed $(losses "$T/one"), or the merged models differ"
check '[ $rc -eq 0 ] && grep -q "layer streaming: device budget" "$T/z0.out" && [ "$(losses "$T/z0")" = "$(losses "$T/one")" ] && same_hf "$T/z0.hf" "$T/one.hf"' \
  "2 ranks streamed, zero 0 (rc $rc): $(losses "$T/z0") against one process's $(losses "$T/one"): $(tail -2 "$T/z0.out")"
$MPI -np 2 "$S" train $P $D --zero 2 --run_dir "$T/z2" --save_hf "$T/z2.hf" >"$T/z2.out" 2>&1
check '[ $? -eq 0 ] && [ "$(losses "$T/z2")" = "$(losses "$T/one")" ] && same_hf "$T/z2.hf" "$T/one.hf"' \
  "2 ranks streamed, zero 2: $(losses "$T/z2") against one process's $(losses "$T/one"): $(tail -2 "$T/z2.out")"
# the disk state: each rank's store in its own directory, W0 of each merge beside it
mkdir -p "$T/st1" "$T/st2"
$MPI -np 2 "$S" train $P $D --zero 1 --state_paths "$T/st1" --run_dir "$T/d1" --save_hf "$T/d1.hf" >"$T/d1.out" 2>&1
check '[ $? -eq 0 ] && [ "$(losses "$T/d1")" = "$(losses "$T/one")" ] && same_hf "$T/d1.hf" "$T/one.hf"' \
  "2 ranks streamed, zero 1, state_paths: $(losses "$T/d1") against one process's $(losses "$T/one"): $(tail -2 "$T/d1.out")"
w6=strata-state.poetx-w0-000000006.safetensors
check '[ -f "$T/st1/rank0-of-2/$w6" ] && cmp -s "$T/st1/rank0-of-2/$w6" "$T/st1/rank1-of-2/$w6"' \
  "2 ranks streamed, state_paths: the ranks' W0 files of the merge at 6 differ or are missing: $(ls "$T/st1"/rank*-of-2 | tr '\n' ' ')"
$MPI -np 2 "$S" train $P $D --zero 2 --stop_at 4 --state_paths "$T/st2" --run_dir "$T/d2" >"$T/d2.1.out" 2>&1
$MPI -np 2 "$S" train $P $D --zero 2 --state_paths "$T/st2" --resume "$T/d2" --run_dir "$T/d2" --save_hf "$T/d2.hf" \
  >"$T/d2.2.out" 2>&1
check '[ $? -eq 0 ] && grep -q "resumed from the state store .* at step 4" "$T/d2.2.out" && [ "$(losses "$T/d2")" = "$(losses "$T/one")" ] && same_hf "$T/d2.hf" "$T/one.hf"' \
  "2 ranks streamed, zero 2, state_paths, stopped at 4 and resumed: $(losses "$T/d2") against $(losses "$T/one"): $(tail -2 "$T/d2.2.out")"
# the state in RAM: stopped at 4 and resumed from the checkpoint (the merge at 6 after the resume)
$MPI -np 2 "$S" train $P $D --zero 1 --stop_at 4 --run_dir "$T/r1" >"$T/r1.1.out" 2>&1
$MPI -np 2 "$S" train $P $D --zero 1 --resume "$T/r1" --run_dir "$T/r1" --save_hf "$T/r1.hf" >"$T/r1.2.out" 2>&1
check '[ $? -eq 0 ] && grep -q "resumed from .*step_00000004 at step 4" "$T/r1.2.out" && [ "$(losses "$T/r1")" = "$(losses "$T/one")" ] && same_hf "$T/r1.hf" "$T/one.hf"' \
  "2 ranks streamed, zero 1, stopped at 4 and resumed: $(losses "$T/r1") against $(losses "$T/one"): $(tail -2 "$T/r1.2.out")"
# validation between the steps: the eval reads the base as the last update and merge left it
"$S" train $P $D --grad_accum 2 --eval_every 2 --run_dir "$T/ev1" >"$T/ev1.out" 2>&1
$MPI -np 2 "$S" train $P $D --zero 1 --eval_every 2 --run_dir "$T/ev2" >"$T/ev2.out" 2>&1
check '[ -n "$(vals "$T/ev1")" ] && [ "$(vals "$T/ev2")" = "$(vals "$T/ev1")" ] && [ "$(losses "$T/ev2")" = "$(losses "$T/one")" ]' \
  "2 ranks streamed with validation: val_loss $(vals "$T/ev2") against one process's $(vals "$T/ev1"): $(tail -2 "$T/ev2.out")"
echo "poetx_stream_dist: $(losses "$T/one")"
[ $fail -eq 0 ] && rm -rf "$T"
exit $fail
