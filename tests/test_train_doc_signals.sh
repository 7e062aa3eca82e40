#!/usr/bin/env bash
# test_train_doc_signals.sh - per-document signals (key doc_signals) and the learning-dynamics
# scores made from them (strata data score --dynamics). Two sources written here (a phrase
# repeated, random tokens), grad_accum 2: every step's records sum and count to the loss
# metrics.jsonl logs for it (the records cover every counted target: an independent check of
# the segment bookkeeping against the step's own mean); documents and sources in range; a run
# stopped at 12 and resumed from its step-10 checkpoint writes the uninterrupted run's file
# byte for byte (the records after step 10 cut back); a layer-streamed run records the
# in-memory run's documents and counts; a run on a view records the base's
# document ids of the view's documents only; 2 ranks (mpirun, when there) write the file of
# one process with grad_accum 2. --dynamics: first / drop / forget scores equal a Python
# recomputation from the records (a small source read for several epochs, so documents
# have several visits), each whole visit counting its document's length in targets; a
# dataset the run did not read, unseen documents without --unseen, and a resume whose file
# is gone are refused, naming the file, and leave no score file.
. "$(dirname "$0")/lib_corpus.sh"
corpus_begin dsig
corpus_easy_hard
python3 - "$T" <<'PY'
import random, sys
from strata_megatron import write
t = sys.argv[1]
rng = random.Random(5)
write(t + "/tiny", [[rng.randrange(1, 60) for _ in range(30 + 3 * d)] for d in range(12)])
with open(t + "/tiny_scores.txt", "w") as f:
    f.write("".join("%d\n" % (d % 3) for d in range(12)))
PY
A="--model gpt2-mini --n_layer 1 --n_embd 32 --n_head 2 --vocab_size 256 --batch 4 --seq 32 --grad_accum 2
   --steps 24 --lr 1e-2 --eval_every 0 --sample_every 0 --quiet 1 --threads 2 --seed 7 --doc_signals 4"
"$S" train $A --data "$T/easy,$T/hard" --run_dir "$T/full" > "$T/full.out" 2>&1
rc=$?
check '[ $rc -eq 0 ] && [ -f "$T/full/doc_signals.bin" ]' "the full run: $(tail -3 "$T/full.out")"
cat > "$T/.py/docsig.py" <<'PY'
import struct
H = 64 + 16 * (48 + 464)
def records(path):
    b = open(path, "rb").read()
    assert b[:8] == b"STRATADS", "magic"
    assert (len(b) - H) % 40 == 0, "size %d" % len(b)
    return [struct.unpack_from("<QQdIIHHI", b, H + 40 * i)[:6] for i in range((len(b) - H) // 40)]
PY
python3 - "$T/full/doc_signals.bin" "$T/full/metrics.jsonl" > "$T/eval.out" 2>&1 <<'PY'
import json, sys
from docsig import records
recs = records(sys.argv[1])
steps = {}
for doc, step, s, n, visit, src in recs:
    assert src in (0, 1) and doc < 200 and n > 0 and visit == 0, (doc, step, s, n, visit, src)
    a = steps.setdefault(step, [0.0, 0])
    a[0] += s; a[1] += n
m = [json.loads(l) for l in open(sys.argv[2])]
assert sorted(steps) == list(range(1, 25)), sorted(steps)
for r in m:
    s, n = steps[r["step"]]
    assert abs(s / n - r["loss"]) <= 2e-5 * abs(r["loss"]), "step %d: records %.7f over %d targets, metrics %s" % (r["step"], s / n, n, r["loss"])
print("%d records, 24 steps, %d targets a step, losses as metrics.jsonl" % (len(recs), steps[1][1]))
PY
rc=$?
check '[ $rc -eq 0 ]' "records against metrics: $(cat "$T/eval.out")"
echo "train_doc_signals: $(cat "$T/eval.out")"

# resumed from step 10 of a run stopped at 12: the same file as the uninterrupted run's
"$S" train $A --data "$T/easy,$T/hard" --stop_at 12 --ckpt_every 5 --run_dir "$T/part" > /dev/null 2>&1
"$S" train $A --data "$T/easy,$T/hard" --resume "$T/part/checkpoints/step_00000010" --run_dir "$T/part" > "$T/res.out" 2>&1
rc=$?
check '[ $rc -eq 0 ] && cmp -s "$T/full/doc_signals.bin" "$T/part/doc_signals.bin"' \
  "resumed (rc $rc): $(tail -2 "$T/res.out"; cmp "$T/full/doc_signals.bin" "$T/part/doc_signals.bin" 2>&1)"
# a resume whose records are gone: refused, naming the file
rm -f "$T/part/doc_signals.bin"
"$S" train $A --data "$T/easy,$T/hard" --steps 30 --resume "$T/part" --run_dir "$T/part" > "$T/gone.out" 2>&1
rc=$?
check '[ $rc -ne 0 ] && grep -q "doc_signals.bin: missing" "$T/gone.out"' "a resume without its records (rc $rc): $(cat "$T/gone.out")"

# layer streaming (device_budget on the CPU): the row hook runs in the executor; the same
# documents, steps, counts and visits as in memory, the losses to float rounding
"$S" train ${A/--steps 24/--steps 6} --n_layer 2 --data "$T/easy,$T/hard" --run_dir "$T/mem" > /dev/null 2>&1
"$S" train ${A/--steps 24/--steps 6} --n_layer 2 --device_budget 2e6 --data "$T/easy,$T/hard" --run_dir "$T/str" > "$T/str.out" 2>&1
rc=$?
python3 - "$T/mem/doc_signals.bin" "$T/str/doc_signals.bin" > "$T/eval.out" 2>&1 <<'PY'
import sys
from docsig import records
a, b = records(sys.argv[1]), records(sys.argv[2])
assert len(a) == len(b) == 48, "records: %d in memory, %d streamed" % (len(a), len(b))
for x, y in zip(a, b):
    assert x[:2] == y[:2] and x[3:] == y[3:] and abs(x[2] - y[2]) <= 1e-4 * abs(x[2]), "in memory %s, streamed %s" % (x, y)
PY
prc=$?
check '[ $rc -eq 0 ] && [ $prc -eq 0 ]' "streamed (rc $rc): $(cat "$T/eval.out"; tail -n 2 "$T/str.out")"

# 2 ranks write one process's file
if command -v mpirun > /dev/null; then
  MPI="mpirun --allow-run-as-root --oversubscribe --bind-to none"
  D="${A/--grad_accum 2/} --steps 8 --threads 1 --mix online"
  $MPI -np 2 "$S" train $D --data "$T/easy,$T/hard" --run_dir "$T/two" > "$T/two.out" 2>&1
  if grep -q "built without MPI" "$T/two.out"; then echo "2 ranks: this strata was built without MPI, not run"
  else
    "$S" train $D --grad_accum 2 --data "$T/easy,$T/hard" --run_dir "$T/one" > "$T/one.out" 2>&1
    check 'cmp -s "$T/one/doc_signals.bin" "$T/two/doc_signals.bin"' \
      "2 ranks and one process with grad_accum 2 wrote different records: $(tail -n 3 "$T/two.out" "$T/one.out")"
  fi
else
  echo "2 ranks: mpirun not found, not run"
fi

# a view: the records name the base's ids of its documents, and no other
"$S" data score "$T/tiny" --from_text "$T/tiny_scores.txt" -o "$T/tiny.scores" > /dev/null 2>&1
"$S" data select "$T/tiny" -o "$T/tiny.view" --scores "$T/tiny.scores" --keep lowest 0.34 > "$T/sel.out" 2>&1
rc=$?
check '[ $rc -eq 0 ]' "select: $(cat "$T/sel.out")"
V="${A/--steps 24/--steps 30}"
"$S" train $V --data "$T/tiny.view" --run_dir "$T/view" > "$T/view.out" 2>&1
rc=$?
check '[ $rc -eq 0 ]' "the run on the view: $(tail -3 "$T/view.out")"
python3 - "$T/view/doc_signals.bin" > "$T/eval.out" 2>&1 <<'PY'
import sys
from docsig import records
docs = sorted({r[0] for r in records(sys.argv[1])})
assert docs == [0, 3, 6, 9], "documents %s, the view keeps 0 3 6 9" % docs
print("the view's documents:", docs)
PY
rc=$?
check '[ $rc -eq 0 ]' "view records: $(cat "$T/eval.out")"

# dynamics: several visits of 12 short documents; scores against a recomputation
"$S" train $V --data "$T/tiny" --run_dir "$T/tinyrun" > "$T/tiny.out" 2>&1
rc=$?
check '[ $rc -eq 0 ]' "the run on tiny: $(tail -3 "$T/tiny.out")"
for m in first drop forget; do
  "$S" data score "$T/tiny" --dynamics "$T/tinyrun" --metric $m -o "$T/dyn_$m.scores" > "$T/dyn_$m.out" 2>&1
  rc=$?
  check '[ $rc -eq 0 ]' "score --dynamics --metric $m: $(cat "$T/dyn_$m.out")"
  "$S" data inspect "$T/dyn_$m.scores" --docs 100 | sed -n 's/^  document \([0-9]*\): score \([^ ]*\).*/\1 \2/p' > "$T/dyn_$m.txt"
done
python3 - "$T/tinyrun/doc_signals.bin" "$T" > "$T/eval.out" 2>&1 <<'PY'
import sys
from docsig import records
visits = {}
for doc, step, s, n, visit, src in records(sys.argv[1]):
    v = visits.setdefault(doc, {}).setdefault(visit, [0.0, 0])
    v[0] += s; v[1] += n
ref = {"first": {}, "drop": {}, "forget": {}}
for doc, vs in visits.items():
    means = [vs[k][0] / vs[k][1] for k in sorted(vs)]
    ref["first"][doc] = means[0]
    ref["drop"][doc] = means[0] - means[-1]
    ref["forget"][doc] = sum(b > a for a, b in zip(means, means[1:]))
assert len(visits) == 12 and min(len(v) for v in visits.values()) >= 3, "visits %s" % {d: len(v) for d, v in visits.items()}
last = max(k for vs in visits.values() for k in vs)
for doc, vs in visits.items(): # every target of a visit's document is its, none another's (the last pass may be cut)
    for k, (s, n) in vs.items():
        assert n == 30 + 3 * doc or k == last, "document %d (%d tokens), visit %d: %d targets" % (doc, 30 + 3 * doc, k, n)
for m in ref:
    got = {int(a): float(b) for a, b in (l.split() for l in open("%s/dyn_%s.txt" % (sys.argv[2], m)))}
    assert sorted(got) == list(range(12)), "%s: documents %s" % (m, sorted(got))
    for d in got:
        assert abs(got[d] - ref[m][d]) <= 1e-5 * max(1, abs(ref[m][d])), "%s of document %d: %s, recomputed %s" % (m, d, got[d], ref[m][d])
print("12 documents, %d-%d visits; drop median %.3f; forgetting events %d" % (min(len(v) for v in visits.values()),
      max(len(v) for v in visits.values()), sorted(ref["drop"].values())[6], sum(ref["forget"].values())))
PY
rc=$?
check '[ $rc -eq 0 ]' "dynamics scores: $(cat "$T/eval.out")"
echo "train_doc_signals: $(cat "$T/eval.out")"

# refused: unseen documents (the 200 easy ones, 24 steps read a few), another dataset
"$S" data score "$T/easy" --dynamics "$T/full" -o "$T/u.scores" > "$T/u.out" 2>&1
rc=$?
check '[ $rc -ne 0 ] && grep -q "of the 200 documents of .* have no record" "$T/u.out" && [ ! -e "$T/u.scores" ]' "unseen (rc $rc): $(cat "$T/u.out")"
"$S" data score "$T/easy" --dynamics "$T/full" --unseen 0 -o "$T/u.scores" > "$T/u2.out" 2>&1
rc=$?
check '[ $rc -eq 0 ] && grep -q "source 0" "$T/u2.out"' "--unseen 0: $(cat "$T/u2.out")"
"$S" data score "$T/tiny" --dynamics "$T/full" --unseen 0 -o "$T/o.scores" > "$T/o.out" 2>&1
rc=$?
check '[ $rc -ne 0 ] && grep -q "none of them is" "$T/o.out" && [ ! -e "$T/o.scores" ]' "another dataset (rc $rc): $(cat "$T/o.out")"
"$S" data score "$T/tiny" --dynamics "$T/tinyrun" --metric best -o "$T/b.scores" > "$T/b.out" 2>&1
rc=$?
check '[ $rc -ne 0 ] && grep -q "metric" "$T/b.out" && [ ! -e "$T/b.scores" ]' "--metric best (rc $rc): $(cat "$T/b.out")"

[ $fail -eq 0 ] && rm -rf "$T"
exit $fail
