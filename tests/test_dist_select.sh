#!/usr/bin/env bash
# test_dist_select.sh - data selection and curricula under 2 ranks (mpirun): a run on a
# selected view (a band of scores, documents in a shuffled order) and one on a paced view (a
# linear curriculum from the easiest quarter) each train exactly as one process with grad_accum
# 2, the same loss every step bit for bit (the ranks' slices of the batch are the micro-batches
# of one process), and a 2-rank paced run stopped at step 6 and resumed at 2 ranks continues as
# the uninterrupted one. 48 documents whose score is their id. Skips (77) where mpirun is
# missing or strata was built without MPI.
set -u
. "$(dirname "$0")/lib_corpus.sh"
corpus_begin dselect
corpus_mpi
corpus_ranked 5
"$S" data select "$T/base" -o "$T/band.view" --scores "$T/s.scores" --keep band 0.2 0.8 > "$T/band.sel" 2>&1
rc=$?
check '[ $rc -eq 0 ]' "select band: $(cat "$T/band.sel")"
"$S" data select "$T/base" -o "$T/paced.view" --scores "$T/s.scores" --pace linear --pace_start 0.25 > "$T/paced.sel" 2>&1
rc=$?
check '[ $rc -eq 0 ]' "select paced: $(cat "$T/paced.sel")"
A="--model gpt2-mini --n_layer 1 --n_embd 32 --n_head 2 --vocab_size 128 --batch 4 --seq 32 --steps 12
   --lr 1e-2 --eval_every 0 --sample_every 0 --quiet 1 --threads 1 --seed 3"
for v in band paced; do
  $MPI -np 2 "$S" train $A --data "$T/$v.view" --run_dir "$T/$v-two" > "$T/$v-two.out" 2>&1
  if grep -q "built without MPI" "$T/$v-two.out"; then echo "SKIP: this strata was built without MPI"; rm -rf "$T"; exit 77; fi
  check '[ -f "$T/$v-two/metrics.jsonl" ]' "$v, 2 ranks: $(tail -5 "$T/$v-two.out")"
  "$S" train $A --data "$T/$v.view" --grad_accum 2 --run_dir "$T/$v-one" > "$T/$v-one.out" 2>&1
  rc=$?
  check '[ $rc -eq 0 ]' "$v, one process: $(tail -3 "$T/$v-one.out")"
done
$MPI -np 2 "$S" train $A --data "$T/paced.view" --stop_at 6 --run_dir "$T/part" > "$T/part.out" 2>&1
$MPI -np 2 "$S" train $A --data "$T/paced.view" --resume "$T/part" --run_dir "$T/part" > "$T/res.out" 2>&1
rc=$?
check '[ $rc -eq 0 ]' "paced, 2 ranks resumed: $(tail -5 "$T/res.out")"
python3 - "$T" > "$T/eval.out" 2>&1 <<'PY'
import json, sys
t = sys.argv[1]
load = lambda n: [json.loads(l) for l in open("%s/%s/metrics.jsonl" % (t, n))]
for v in ("band", "paced"):
    one, two = load(v + "-one"), load(v + "-two")
    assert len(one) == len(two) == 12, "%s: steps %d %d" % (v, len(one), len(two))
    for a, b in zip(one, two):
        assert a["loss"] == b["loss"], "%s step %d: 2 ranks %r, one process %r" % (v, a["step"], b["loss"], a["loss"])
part, two = load("part"), load("paced-two")
assert [r["loss"] for r in part] == [r["loss"] for r in two], "the resumed 2-rank paced run differs"
print("band and paced: 12 steps equal to one process; paced resumed equal; last losses %r %r" %
      (load("band-two")[-1]["loss"], two[-1]["loss"]))
PY
rc=$?
check '[ $rc -eq 0 ]' "$(cat "$T/eval.out")"
echo "dist_select: $(cat "$T/eval.out")"
[ $fail -eq 0 ] && rm -rf "$T"
exit $fail
