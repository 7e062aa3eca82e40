#!/usr/bin/env bash
# test_data_view.sh - a view trains, and reads only its documents: in a tiny dataset the
# documents to keep hold tokens below 100 and the others token 150, so a model of
# vocabulary 128 trains 3 steps on the view (3 x 8 x 33 tokens, more than the view's 612:
# every kept document is read), alone and mixed with weights with another view, while
# the base itself is refused at its first out-of-vocabulary token; strata data cat of the
# view gives the base's kept documents; inspect describes the view; a run on views stopped
# and resumed logs the losses of one that did not stop; the CLI refuses bad input naming
# the file and key and leaves no file.
set -u
. "$(dirname "$0")/lib_corpus.sh"
corpus_begin view

# The dataset, written from the Megatron layout (not by strata): 24 documents, even ones
# tokens 1..99 (document d: (d*7 + k) % 99 + 1), odd ones token 150; scores: even low.
python3 - "$T" <<'EOF'
import sys
from strata_megatron import write
t = sys.argv[1]
docs = []
for d in range(24):
    n = 40 + d
    docs.append([(d * 7 + k) % 99 + 1 for k in range(n)] if d % 2 == 0 else [150] * n)
write(t + "/base", docs)
with open(t + "/scores.txt", "w") as f:
    for d in range(24):
        f.write("%g\n" % (d if d % 2 == 0 else 100 + d))
with open(t + "/nan.txt", "w") as f:
    f.write("1\n" * 5 + "nan\n" + "1\n" * 18)
EOF
"$S" data score "$T/base" --from_text "$T/scores.txt" -o "$T/s.scores" > "$T/score.out" 2>&1
rc=$?
check '[ $rc -eq 0 ]' "data score --from_text: $(cat "$T/score.out")"
"$S" data select "$T/base" -o "$T/low.view" --scores "$T/s.scores" --keep lowest 0.5 > "$T/sel.out" 2>&1
rc=$?
check '[ $rc -eq 0 ] && grep -q "12 of 24 documents" "$T/sel.out"' "select lowest 0.5: $(cat "$T/sel.out")"
"$S" data select "$T/base" -o "$T/asc.view" --scores "$T/s.scores" --keep lowest 0.5 --order ascending > "$T/sel2.out" 2>&1
rc=$?
check '[ $rc -eq 0 ]' "select ascending: $(cat "$T/sel2.out")"

# inspect: base, rule, kept fraction and tokens
"$S" data inspect "$T/low.view" --json > "$T/insp.json" 2>&1
check 'grep -q "\"format\": \"view\"" "$T/insp.json" && grep -q "\"documents\": 12," "$T/insp.json" &&
       grep -q "\"kept_fraction\": 0.500000" "$T/insp.json" && grep -q "\"base\": \"[^\"]*/base\"" "$T/insp.json" &&
       grep -q "keep lowest 0.5" "$T/insp.json" && grep -q "\"kept_tokens\": 612," "$T/insp.json"' \
  "inspect VIEW --json: $(cat "$T/insp.json")"

# the view's documents are the base's even ones, byte for byte (as tokens)
ok=1
for i in 0 5 11; do
  "$S" data cat "$T/low.view" --doc $i --tokens > "$T/v.tok" 2>&1
  "$S" data cat "$T/base" --doc $((2 * i)) --tokens > "$T/b.tok" 2>&1
  cmp -s "$T/v.tok" "$T/b.tok" || ok=0
done
check '[ $ok -eq 1 ]' "view document i is not base document 2i"

small="--model gpt2-mini --n_layer 1 --n_embd 32 --n_head 2 --batch 8 --seq 32 --vocab_size 128 --quiet 1 --eval_every 0 --steps 3"
"$S" train $small --data "$T/low.view" --run_dir "$T/r1" > "$T/r1.out" 2>&1
rc=$?
check '[ $rc -eq 0 ] && [ $(grep -c "\"step\"" "$T/r1/metrics.jsonl") -ge 3 ]' "train on the view (rc $rc): $(tail -3 "$T/r1.out")"
"$S" train $small --data "$T/low.view:0.7,$T/asc.view:0.3" --run_dir "$T/r2" > "$T/r2.out" 2>&1
rc=$?
check '[ $rc -eq 0 ]' "train on two views mixed with weights (rc $rc): $(tail -3 "$T/r2.out")"
"$S" train $small --data "$T/base" --run_dir "$T/r3" > "$T/r3.out" 2>&1
rc=$?
check '[ $rc -ne 0 ] && grep -q "token 150" "$T/r3.out"' "training on the base should meet token 150 (rc $rc): $(tail -2 "$T/r3.out")"

# a run on views (shuffled and ordered, mixed) stopped at step 3 and resumed gives the
# losses of the run that did not stop
"$S" train $small --steps 6 --data "$T/low.view:0.7,$T/asc.view:0.3" --run_dir "$T/s1" > "$T/s1.out" 2>&1
"$S" train $small --steps 6 --stop_at 3 --data "$T/low.view:0.7,$T/asc.view:0.3" --run_dir "$T/s2" > "$T/s2.out" 2>&1
"$S" train --resume "$T/s2" --steps 6 > "$T/s3.out" 2>&1
rc=$?
losses() { python3 -c 'import json,sys; print(" ".join("%s:%s" % (j["step"], j["loss"]) for j in map(json.loads, open(sys.argv[1])) if "loss" in j))' "$1"; }
check '[ $rc -eq 0 ] && [ "$(losses "$T/s1/metrics.jsonl")" = "$(losses "$T/s2/metrics.jsonl")" ] &&
       [ $(losses "$T/s1/metrics.jsonl" | wc -w) -eq 6 ]' \
  "resumed run on views: $(losses "$T/s2/metrics.jsonl") vs $(losses "$T/s1/metrics.jsonl") (rc $rc: $(tail -1 "$T/s3.out"))"

# bad input: refused naming the file and the key, no file left
bad() { # args: WHAT PATTERN select-args...
  local what=$1 pat=$2; shift 2
  rm -f "$T/bad.view"
  "$S" data select "$T/base" -o "$T/bad.view" "$@" > "$T/bad.out" 2>&1
  local rc=$?
  check '[ $rc -ne 0 ] && grep -q -- "$pat" "$T/bad.out" && [ ! -e "$T/bad.view" ] && ! ls "$T" | grep -q "\.tmp\."' \
    "$what (rc $rc): $(cat "$T/bad.out")"
}
bad "fraction 0" "bad.view: key 'fraction' (--keep lowest|highest F) is 0" --scores "$T/s.scores" --keep lowest 0
bad "fraction 1.5" "key 'fraction' (--keep lowest|highest F) is 1.5" --scores "$T/s.scores" --keep highest 1.5
bad "band low > high" "low 0.7 > high 0.2" --scores "$T/s.scores" --keep band 0.7 0.2
bad "empty band" "selection is empty" --scores "$T/s.scores" --keep band 0.5 0.5
"$S" data score "$T/base" --from_text "$T/nan.txt" -o "$T/nan.scores" > "$T/nan.out" 2>&1
rc=$?
check '[ $rc -ne 0 ] && grep -q "nan.txt: line 6" "$T/nan.out" && [ ! -e "$T/nan.scores" ]' "NaN score (rc $rc): $(cat "$T/nan.out")"

"$S" data select "$T/low.view" -o "$T/bad.view" --scores "$T/s.scores" --keep lowest 0.5 > "$T/bad.out" 2>&1
rc=$?
check '[ $rc -ne 0 ] && grep -q "low.view is a view; .* give the view.s base" "$T/bad.out" && [ ! -e "$T/bad.view" ]' \
  "select over a view: $(cat "$T/bad.out")"
"$S" data dedup "$T/low.view" -o "$T/bad.dedup" > "$T/bad.out" 2>&1
rc=$?
check '[ $rc -ne 0 ] && grep -q "low.view is a view" "$T/bad.out" && [ ! -e "$T/bad.dedup" ]' "dedup of a view: $(cat "$T/bad.out")"

# the base changes under the view: train and inspect refuse it naming both
printf '\x07' | dd of="$T/base.bin" bs=1 seek=3 conv=notrunc status=none
"$S" train $small --data "$T/low.view" --run_dir "$T/r4" > "$T/r4.out" 2>&1
rc=$?
check '[ $rc -ne 0 ] && grep -q "low.view was made for another dataset than [^ ]*/base" "$T/r4.out"' \
  "a changed base refused by train (rc $rc): $(tail -2 "$T/r4.out")"
"$S" data inspect "$T/low.view" > "$T/r5.out" 2>&1
rc=$?
check '[ $rc -ne 0 ] && grep -q "CRC-32C" "$T/r5.out"' "a changed base refused by inspect (rc $rc): $(cat "$T/r5.out")"

if [ $fail -eq 0 ]; then rm -rf "$T"; echo "data_view: ok"; fi
exit $fail
