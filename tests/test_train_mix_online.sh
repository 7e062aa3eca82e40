#!/usr/bin/env bash
# test_train_mix_online.sh - strata train --mix online: two sources written here (an easy one,
# a short phrase repeated, and a hard one, uniformly random tokens), grad_accum 2. Every step
# of metrics.jsonl logs mix_weights, two numbers summing to 1; the weights move towards the
# source with the higher loss (the random one); a run stopped at step 12 and resumed logs the
# same losses and weights as one that did not stop, bit for bit; the same run twice is the
# same; a single source, a bad mix and online mixing with state_paths are refused naming the
# key.
set -u
. "$(dirname "$0")/lib_corpus.sh"
corpus_begin mixo

corpus_easy_hard
A="--model gpt2-mini --n_layer 1 --n_embd 32 --n_head 2 --vocab_size 256 --batch 4 --seq 32 --grad_accum 2
   --steps 24 --lr 1e-2 --eval_every 0 --quiet 1 --threads 2 --seed 7 --mix online --data $T/easy,$T/hard"
"$S" train $A --run_dir "$T/full" > "$T/full.out" 2>&1
rc=$?
check '[ $rc -eq 0 ]' "the full run: $(tail -3 "$T/full.out")"
"$S" train $A --run_dir "$T/again" > /dev/null 2>&1
"$S" train $A --stop_at 12 --run_dir "$T/part" > "$T/part.out" 2>&1
rc=$?
check '[ $rc -eq 0 ]' "the run stopped at 12: $(tail -3 "$T/part.out")"
"$S" train $A --resume "$T/part" --run_dir "$T/part" > "$T/res.out" 2>&1
rc=$?
check '[ $rc -eq 0 ]' "the resumed run: $(tail -3 "$T/res.out")"
python3 - "$T/full/metrics.jsonl" "$T/part/metrics.jsonl" "$T/again/metrics.jsonl" > "$T/eval.out" 2>&1 <<'EOF'
import json, sys
runs = [[json.loads(l) for l in open(p)] for p in sys.argv[1:]]
full, part, again = runs
assert len(full) == 24 and len(part) == 24, "steps logged: %d, %d" % (len(full), len(part))
for r in full:
    w = r["mix_weights"]
    assert len(w) == 2 and abs(sum(w) - 1) < 1e-5 and min(w) > 0, "step %d: weights %s" % (r["step"], w)
for a, b in zip(full, part):
    assert a["loss"] == b["loss"] and a["mix_weights"] == b["mix_weights"], \
        "step %d: resumed %s %s, full %s %s" % (a["step"], b["loss"], b["mix_weights"], a["loss"], a["mix_weights"])
for a, b in zip(full, again):
    assert a["loss"] == b["loss"] and a["mix_weights"] == b["mix_weights"], "step %d differs between two runs" % a["step"]
w = full[-1]["mix_weights"]
assert w[1] > w[0] + 0.02, "the random source's weight %s did not rise over the easy one's %s" % (w[1], w[0])
print("weights at steps 1, 12, 24:", full[0]["mix_weights"], full[11]["mix_weights"], w)
EOF
rc=$?
check '[ $rc -eq 0 ]' "metrics: $(cat "$T/eval.out")"
echo "train_mix_online: $(cat "$T/eval.out")"

"$S" train $A --data "$T/easy" --run_dir "$T/one" > "$T/one.out" 2>&1
rc=$?
check '[ $rc -ne 0 ] && grep -q "key .mix.*1 sources" "$T/one.out"' "one source: $(cat "$T/one.out")"
"$S" train $A --mix bandit --run_dir "$T/bad" > "$T/bad.out" 2>&1
rc=$?
check '[ $rc -ne 0 ] && grep -q "key .mix.: .bandit. is not weights or online" "$T/bad.out"' "mix bandit: $(cat "$T/bad.out")"
"$S" train $A --state_paths "$T/st" --run_dir "$T/sp" > "$T/sp.out" 2>&1
rc=$?
check '[ $rc -ne 0 ] && grep -q "key .mix.: online mixing keeps its state in checkpoints" "$T/sp.out"' \
  "state_paths: $(cat "$T/sp.out")"

[ $fail -eq 0 ] && rm -rf "$T"
exit $fail
