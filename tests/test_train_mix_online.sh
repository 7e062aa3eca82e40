#!/usr/bin/env bash
# test_train_mix_online.sh - strata train --mix online: two sources written here (an easy one,
# a short phrase repeated, and a hard one, uniformly random tokens), grad_accum 2. Every step
# of metrics.jsonl logs mix_weights, two numbers summing to 1; the weights move towards the
# source with the higher loss (the random one); a run stopped at step 12 and resumed logs the
# same losses and weights as one that did not stop, bit for bit; the same run twice is the
# same; with the disk state too, and killed between the store's commit and the bandit's
# update; a single source and a bad mix are refused naming the key.
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
# with the disk state (state_paths): the mixture's state is committed with each step in the
# store; the same losses and weights as the run in memory, bit for bit, and a run killed right
# after step 12's commit, before the bandit's update, resumes from the store (the update
# replayed from the committed sums) and logs steps 13 to 24 as the full run did
mkdir -p "$T/st" "$T/st2"
"$S" train $A --state_paths "$T/st" --run_dir "$T/sp" > "$T/sp.out" 2>&1
rc=$?
check '[ $rc -eq 0 ]' "online mixing with state_paths: $(tail -3 "$T/sp.out")"
{ STRATA_FAILPOINT=train_update_committed:12 "$S" train $A --state_paths "$T/st2" --run_dir "$T/kill" > "$T/kill.out" 2>&1; } 2>/dev/null
rc=$?
check '[ $rc -eq 137 ]' "the run was not killed at the failpoint (rc $rc): $(tail -2 "$T/kill.out")"
"$S" train $A --state_paths "$T/st2" --resume "$T/kill" --run_dir "$T/kill" > "$T/kres.out" 2>&1
rc=$?
check '[ $rc -eq 0 ] && grep -q "resumed from the state store .* at step 12" "$T/kres.out"' \
  "the resume from the store: rc $rc $(tail -3 "$T/kres.out")"
python3 - "$T/full/metrics.jsonl" "$T/sp/metrics.jsonl" "$T/kill/metrics.jsonl" > "$T/sp.eval" 2>&1 <<'EOF'
import json, sys
full, disk, kill = [[json.loads(l) for l in open(p)] for p in sys.argv[1:]]
assert len(disk) == 24, "disk-state steps logged: %d" % len(disk)
for a, b in zip(full, disk):
    assert a["loss"] == b["loss"] and a["mix_weights"] == b["mix_weights"], \
        "step %d: disk state %s %s, in memory %s %s" % (a["step"], b["loss"], b["mix_weights"], a["loss"], a["mix_weights"])
got = {r["step"]: r for r in kill}
assert all(s in got for s in range(13, 25)), "steps after the kill: %s" % sorted(got)
for a in full:
    b = got.get(a["step"])
    if b is None: continue
    assert a["loss"] == b["loss"] and a["mix_weights"] == b["mix_weights"], \
        "step %d: killed and resumed %s %s, full %s %s" % (a["step"], b["loss"], b["mix_weights"], a["loss"], a["mix_weights"])
print("disk state and kill-resume equal the run in memory, %d and %d steps" % (len(disk), len(got)))
EOF
rc=$?
check '[ $rc -eq 0 ]' "disk state: $(cat "$T/sp.eval")"
echo "train_mix_online: $(cat "$T/sp.eval")"
# refused before anything is written, naming the key or the store: a resume of that disk state
# without online mixing (its loop state holds the mixture's), and a grad_accum whose per-step
# sums would not fit the store's blob (no store made)
"$S" train $A --mix weights --state_paths "$T/st" --resume "$T/sp" --run_dir "$T/sp" > "$T/nomix.out" 2>&1
rc=$?
check '[ $rc -ne 0 ] && grep -q "strata-state.manifest: the store.s loop state has [0-9]* bytes, this run.s [0-9]*" "$T/nomix.out"' \
  "a resume without mix online: rc $rc $(tail -2 "$T/nomix.out")"
"$S" train $A --grad_accum 4096 --state_paths "$T/st3" --run_dir "$T/big" > "$T/big.out" 2>&1
rc=$?
check '[ $rc -ne 0 ] && grep -q "key .mix.: online mixing with state_paths commits" "$T/big.out" && [ ! -e "$T/st3/strata-state.manifest" ]' \
  "grad_accum 4096 with the disk state: rc $rc $(tail -2 "$T/big.out")"

[ $fail -eq 0 ] && rm -rf "$T"
exit $fail
