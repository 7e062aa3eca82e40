#!/usr/bin/env bash
# test_dist_mix_online.sh - --mix online under 2 ranks (mpirun) mixes exactly as one process
# with grad_accum 2: the same losses and the same mix_weights in metrics.jsonl every step, bit
# for bit (the ranks' per-source loss sums gathered and added in rank order, as one process
# adds its micro-batches'), and a 2-rank run stopped at step 6 and resumed at 2 ranks
# continues as the uninterrupted one, from checkpoints and from the disk state killed between
# the store's commit and the bandit's update. Two sources written here (a repeated phrase, random
# tokens). Skips (77) where mpirun is missing or strata was built without MPI.
set -u
. "$(dirname "$0")/lib_corpus.sh"
corpus_begin dmixo
corpus_mpi
corpus_easy_hard
A="--model gpt2-mini --n_layer 1 --n_embd 32 --n_head 2 --vocab_size 256 --batch 4 --seq 32 --steps 12
   --lr 1e-2 --eval_every 0 --sample_every 0 --quiet 1 --threads 1 --seed 7 --mix online --data $T/easy,$T/hard"
$MPI -np 2 "$S" train $A --run_dir "$T/two" > "$T/two.out" 2>&1
if grep -q "built without MPI" "$T/two.out"; then echo "SKIP: this strata was built without MPI"; rm -rf "$T"; exit 77; fi
check '[ -f "$T/two/metrics.jsonl" ]' "2 ranks: $(tail -5 "$T/two.out")"
"$S" train $A --grad_accum 2 --run_dir "$T/one" > "$T/one.out" 2>&1
rc=$?
check '[ $rc -eq 0 ]' "one process: $(tail -3 "$T/one.out")"
$MPI -np 2 "$S" train $A --stop_at 6 --run_dir "$T/part" > "$T/part.out" 2>&1
$MPI -np 2 "$S" train $A --resume "$T/part" --run_dir "$T/part" > "$T/res.out" 2>&1
rc=$?
check '[ $rc -eq 0 ]' "2 ranks resumed: $(tail -5 "$T/res.out")"
# with the disk state: both ranks killed right after step 6's commit, before the bandit's
# update, and resumed from their stores: each replays the update from its own committed sums,
# gathered again, and steps 7 to 12 are the uninterrupted run's
mkdir -p "$T/st"
{ $MPI -np 2 env STRATA_FAILPOINT=train_update_committed:6 "$S" train $A --state_paths "$T/st" --run_dir "$T/dk" > "$T/dk.out" 2>&1; } 2>/dev/null
$MPI -np 2 "$S" train $A --state_paths "$T/st" --resume "$T/dk" --run_dir "$T/dk" > "$T/dkres.out" 2>&1
rc=$?
check '[ $rc -eq 0 ] && grep -q "resumed from the state store .* at step 6" "$T/dkres.out"' \
  "2 ranks resumed from their stores: rc $rc $(tail -5 "$T/dkres.out")"
python3 - "$T/one/metrics.jsonl" "$T/two/metrics.jsonl" "$T/part/metrics.jsonl" "$T/dk/metrics.jsonl" > "$T/eval.out" 2>&1 <<'EOF'
import json, sys
one, two, part, dk = [[json.loads(l) for l in open(p)] for p in sys.argv[1:]]
got = {r["step"]: r for r in dk}
for a in one[6:]:
    b = got.get(a["step"])
    assert b is not None and a["loss"] == b["loss"] and a["mix_weights"] == b["mix_weights"], \
        "step %d: 2 ranks killed and resumed from their stores %s, one process %s %s" % (a["step"], b and (b["loss"], b["mix_weights"]), a["loss"], a["mix_weights"])
assert len(one) == len(two) == len(part) == 12, "steps %d %d %d" % (len(one), len(two), len(part))
for a, b, c in zip(one, two, part):
    assert a["loss"] == b["loss"] and a["mix_weights"] == b["mix_weights"], \
        "step %d: 2 ranks %s %s, one process %s %s" % (a["step"], b["loss"], b["mix_weights"], a["loss"], a["mix_weights"])
    assert c["loss"] == b["loss"] and c["mix_weights"] == b["mix_weights"], "step %d: the resumed 2-rank run differs" % a["step"]
print("12 steps equal; weights at step 12:", one[-1]["mix_weights"])
EOF
rc=$?
check '[ $rc -eq 0 ]' "$(cat "$T/eval.out")"
echo "dist_mix_online: $(cat "$T/eval.out")"
[ $fail -eq 0 ] && rm -rf "$T"
exit $fail
