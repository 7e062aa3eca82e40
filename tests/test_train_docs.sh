#!/usr/bin/env bash
# test_train_docs.sh - strata train's doc_mask key end to end: on a `strata data pack`
# dataset (short documents, so rows hold several) doc_mask 1 (the default) changes the
# losses from doc_mask 0; on the embedded corpus (windows, no document index: one
# sequence a row) it changes no bit; doc_mask 1 under device_budget is refused naming
# the key, and a streamed run without the key still trains (rows attended whole, said).
set -u
S=${STRATA_BIN:?}
T=$(mktemp -d /tmp/strata-docs-XXXXXX)
fail=0; checks=0
check() { checks=$((checks+1)); if ! eval "$1"; then echo "FAIL: $2"; fail=$((fail+1)); fi; }
losses() { sed 's/.*"loss": *\([0-9.e+-]*\).*/\1/' "$1/metrics.jsonl" | tr '\n' ' '; }

small="--model gpt2-mini --n_layer 2 --n_embd 64 --n_head 2 --batch 2 --seq 64 --quiet 1 --eval_every 0 --sample_every 0"
for i in $(seq 1 300); do echo "doc $i: $((i*7)) apples."; done > "$T/a.txt"
"$S" data pack -o "$T/a" --split line "$T/a.txt" >/dev/null 2>&1
check '[ -f "$T/a.idx" ]' "data pack writes a document index"

"$S" train $small --vocab_size 257 --steps 3 --data "$T/a" --run_dir "$T/d1" >"$T/d1.txt" 2>&1
check '[ $? -eq 0 ] && [ $(wc -l < "$T/d1/metrics.jsonl") -eq 3 ]' "training with documents (default doc_mask): $(tail -2 "$T/d1.txt")"
"$S" train $small --vocab_size 257 --steps 3 --data "$T/a" --doc_mask 0 --run_dir "$T/d0" >"$T/d0.txt" 2>&1
check '[ $? -eq 0 ]' "training with --doc_mask 0: $(tail -2 "$T/d0.txt")"
"$S" train $small --vocab_size 257 --steps 3 --data "$T/a" --doc_mask 1 --run_dir "$T/d1b" >"$T/d1b.txt" 2>&1
check '[ "$(losses "$T/d1")" = "$(losses "$T/d1b")" ]' "doc_mask 1 is the default: $(losses "$T/d1") vs $(losses "$T/d1b")"
check '[ "$(losses "$T/d1")" != "$(losses "$T/d0")" ]' "documents change the losses: $(losses "$T/d1") vs $(losses "$T/d0")"
check 'grep -q "\"doc_mask\": *-1" "$T/d1/config.json"' "config.json records doc_mask"

"$S" train $small --steps 3 --run_dir "$T/e1" >"$T/e1.txt" 2>&1
"$S" train $small --steps 3 --doc_mask 0 --run_dir "$T/e0" >"$T/e0.txt" 2>&1
check '[ -n "$(losses "$T/e1")" ] && [ "$(losses "$T/e1")" = "$(losses "$T/e0")" ]' \
  "the embedded corpus (one sequence a row) trains the same bits either way: $(losses "$T/e1") vs $(losses "$T/e0")"

"$S" train $small --steps 1 --doc_mask 1 --device_budget 4e6 --run_dir "$T/s1" >"$T/s1.txt" 2>&1; rc=$?
check '[ $rc -ne 0 ] && grep -q "doc_mask" "$T/s1.txt"' "doc_mask 1 under device_budget is refused naming the key (rc $rc): $(tail -1 "$T/s1.txt")"
"$S" train $small --steps 1 --device_budget 4e6 --run_dir "$T/s0" >"$T/s0.txt" 2>&1; rc=$?
check '[ $rc -eq 0 ] && grep -q "doc_mask" "$T/s0.txt"' "a streamed run without the key trains, saying rows are whole (rc $rc): $(tail -2 "$T/s0.txt")"

echo "train_docs: $checks checks, $((checks-fail)) passed, $fail failed"
[ $fail -eq 0 ] && rm -rf "$T"
[ $fail -eq 0 ]
