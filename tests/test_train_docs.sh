#!/usr/bin/env bash
# test_train_docs.sh - strata train's doc_mask key end to end: on a `strata data pack`
# dataset (short documents, so rows hold several) doc_mask 1 (the default) changes the
# losses from doc_mask 0; on the embedded corpus (windows, no document index: one
# sequence a row) it changes no bit. Layer streaming (device_budget) keeps documents
# apart too: a streamed run equals the run in memory, losses and final weights bit for
# bit, with doc_mask 1 (the default) and 0, for GPT-2 and Qwen3, with activations kept,
# offloaded and recomputed, two micro-batches a step and validation; a chunked
# vocabulary (whose head is not the in-memory bits) still trains the in-memory losses;
# 2 ranks streaming equal one process with 2 micro-batches in memory.
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

# streamed = in memory, bit for bit (model.safetensors of the last step)
wts() { cmp -s "$1/checkpoints/step_00000003/model.safetensors" "$2/checkpoints/step_00000003/model.safetensors"; }
same() { [ -n "$(losses "$1")" ] && [ "$(losses "$1")" = "$(losses "$2")" ] && wts "$1" "$2"; }
val() { grep -o '"val_loss": *[0-9.e+-]*' "$1/metrics.jsonl" | tr '\n' ' '; }
gpt="$small --vocab_size 257 --steps 3 --data $T/a"
qwen="--model qwen3-tiny --n_layer 2 --batch 2 --seq 64 --max_seq 64 --quiet 1 --eval_every 0 --sample_every 0 --vocab_size 257 --steps 3 --data $T/a"
"$S" train $gpt --device_budget 4e6 --run_dir "$T/s1" >"$T/s1.txt" 2>&1; rc=$?
check '[ $rc -eq 0 ] && grep -q "layer streaming" "$T/s1.txt"' "a streamed run with documents (rc $rc): $(tail -2 "$T/s1.txt")"
check 'same "$T/d1" "$T/s1"' "gpt2 streamed doc_mask 1 = in memory: $(losses "$T/s1") vs $(losses "$T/d1")"
"$S" train $gpt --device_budget 4e6 --doc_mask 0 --run_dir "$T/s0" >"$T/s0.txt" 2>&1
check 'same "$T/d0" "$T/s0"' "gpt2 streamed doc_mask 0 = in memory: $(losses "$T/s0") vs $(losses "$T/d0")"
# a plan that offloads block 0 and recomputes block 1 (each micro-batch's recompute sees its documents)
sed -E '/"blocks"/{n;s/"[a-z]+"/"offload"/;n;s/"[a-z]+"/"recompute"/}' "$T/s1/plan.json" > "$T/p_or.json"
sed -E 's/"vocab_chunk": *[0-9]+/"vocab_chunk":64/' "$T/p_or.json" > "$T/p_vc.json"
check 'grep -q "\"recompute\"" "$T/p_or.json" && grep -q "\"offload\"" "$T/p_or.json"' "plan edited: $(tr -d ' \n' < "$T/p_or.json")"
# two micro-batches: the weights and validation bit for bit; the step's loss, a float when
# streamed (st_stream_step_stats) and a double in memory, may print one digit apart
ev="--grad_accum 2 --eval_every 2 --val_data $T/a"
"$S" train $gpt $ev --run_dir "$T/ga" >"$T/ga.txt" 2>&1
"$S" train $gpt $ev --device_budget 4e6 --plan "$T/p_or.json" --run_dir "$T/gs" >"$T/gs.txt" 2>&1; rc=$?
check '[ $rc -eq 0 ] && wts "$T/ga" "$T/gs" && [ -n "$(val "$T/ga")" ] && [ "$(val "$T/ga")" = "$(val "$T/gs")" ]' \
  "gpt2 streamed (offload, recompute, 2 micro-batches, validation) = in memory (rc $rc): $(losses "$T/gs") $(val "$T/gs") vs $(losses "$T/ga") $(val "$T/ga")"
"$S" train $gpt --device_budget 4e6 --plan "$T/p_vc.json" --run_dir "$T/sv" >"$T/sv.txt" 2>&1; rc=$?
check '[ $rc -eq 0 ] && grep -q "vocabulary chunked" "$T/sv.txt" && [ "$(losses "$T/sv")" = "$(losses "$T/d1")" ]' \
  "gpt2 streamed, chunked vocabulary (host embedding), the in-memory losses (rc $rc): $(losses "$T/sv") vs $(losses "$T/d1")"
# a budget of exactly the plan's device bytes holds the documents' buffers too (counted in the
# blocks' bind bytes, allocated before the first packed batch)
need=$(jq '.device_bytes' "$T/s1/plan.json")
"$S" train $gpt --device_budget "$need" --plan "$T/s1/plan.json" --run_dir "$T/sx" >"$T/sx.txt" 2>&1; rc=$?
check '[ $rc -eq 0 ] && same "$T/d1" "$T/sx"' "gpt2 streamed in exactly the plan's $need device bytes (rc $rc): $(tail -2 "$T/sx.txt")"

"$S" train $qwen --run_dir "$T/q1" >"$T/q1.txt" 2>&1
"$S" train $qwen --doc_mask 0 --run_dir "$T/q0" >"$T/q0.txt" 2>&1
check '[ "$(losses "$T/q1")" != "$(losses "$T/q0")" ]' "qwen3: documents change the losses: $(losses "$T/q1") vs $(losses "$T/q0")"
"$S" train $qwen --device_budget 4e6 --run_dir "$T/qs1" >"$T/qs1.txt" 2>&1
check 'grep -q "layer streaming" "$T/qs1.txt" && same "$T/q1" "$T/qs1"' "qwen3 streamed doc_mask 1 = in memory: $(losses "$T/qs1") vs $(losses "$T/q1")"
need=$(jq '.device_bytes' "$T/qs1/plan.json")
"$S" train $qwen --device_budget "$need" --plan "$T/qs1/plan.json" --run_dir "$T/qsx" >"$T/qsx.txt" 2>&1; rc=$?
check '[ $rc -eq 0 ] && same "$T/q1" "$T/qsx"' "qwen3 streamed in exactly the plan's $need device bytes (rc $rc): $(tail -2 "$T/qsx.txt")"
"$S" train $qwen --device_budget 4e6 --doc_mask 0 --run_dir "$T/qs0" >"$T/qs0.txt" 2>&1
check 'same "$T/q0" "$T/qs0"' "qwen3 streamed doc_mask 0 = in memory: $(losses "$T/qs0") vs $(losses "$T/q0")"
sed -E '/"blocks"/{n;s/"[a-z]+"/"offload"/;n;s/"[a-z]+"/"recompute"/}' "$T/qs1/plan.json" > "$T/q_or.json"
"$S" train $qwen $ev --run_dir "$T/qa" >"$T/qa.txt" 2>&1
"$S" train $qwen $ev --device_budget 4e6 --plan "$T/q_or.json" --run_dir "$T/qgs" >"$T/qgs.txt" 2>&1; rc=$?
check '[ $rc -eq 0 ] && wts "$T/qa" "$T/qgs" && [ "$(val "$T/qa")" = "$(val "$T/qgs")" ]' \
  "qwen3 streamed (offload, recompute, 2 micro-batches, validation) = in memory (rc $rc): $(losses "$T/qgs") $(val "$T/qgs") vs $(losses "$T/qa") $(val "$T/qa")"

# the ranks' streamed step (2 ranks, zero 1) = one process with 2 micro-batches in memory
# (where mpirun and an MPI build are at hand; else said and skipped)
MPI="mpirun --allow-run-as-root --oversubscribe --bind-to none"
if command -v mpirun >/dev/null; then
  . "$(dirname "$0")/mpi_sanitized.sh" # OpenMPI's own leaks, under the sanitizers
  $MPI -np 2 "$S" train $gpt --threads 1 --zero 1 --device_budget 4e6 --run_dir "$T/r2" >"$T/r2.txt" 2>&1; rc=$?
  if grep -q "built without MPI" "$T/r2.txt"; then echo "skipped: 2 ranks (strata built without MPI)"
  else
    "$S" train $gpt --threads 1 --grad_accum 2 --run_dir "$T/r1" >"$T/r1.txt" 2>&1
    check '[ $rc -eq 0 ] && grep -q "layer streaming" "$T/r2.txt" && same "$T/r1" "$T/r2"' \
      "2 ranks streamed doc_mask 1 = 1 process, 2 micro-batches, in memory (rc $rc): $(losses "$T/r2") vs $(losses "$T/r1") $(tail -2 "$T/r2.txt")"
  fi
else echo "skipped: 2 ranks (mpirun not found)"; fi

echo "train_docs: $checks checks, $((checks-fail)) passed, $fail failed"
[ $fail -eq 0 ] && rm -rf "$T"
[ $fail -eq 0 ]
