#!/usr/bin/env bash
# test_cli.sh - the strata program end to end: help texts, a short training run and
# its outputs, Ctrl-C (SIGINT) leaving a checkpoint that resumes, and clear errors.
set -u
S=${STRATA_BIN:?}
T=$(mktemp -d /tmp/strata-cli-XXXXXX)
fail=0; checks=0
check() { checks=$((checks+1)); if ! eval "$1"; then echo "FAIL: $2"; fail=$((fail+1)); fi; }

check '"$S" --help | grep -q "train"' "strata --help lists train"
for c in train data bench inspect; do
  check '"$S" $c --help >/dev/null 2>&1' "strata $c --help exits 0"
done
check '"$S" bench step --help | grep -q "FLOPs per token"' "bench step --help documents the FLOP formula"

small="--model gpt2-mini --n_layer 2 --n_embd 64 --n_head 2 --batch 4 --seq 32"
"$S" train $small --steps 5 --run_dir "$T/run" >"$T/out.txt" 2>&1
check '[ $? -eq 0 ]' "short training run succeeds"
check '[ $(wc -l < "$T/run/metrics.jsonl") -eq 5 ]' "metrics.jsonl has one line per step"
check 'grep -q "^step      5/5 | loss" "$T/out.txt"' "each step prints a line"
check 'grep -q "GFLOP/s" "$T/out.txt"' "step line shows achieved GFLOP/s"
check '[ "$(cat "$T/run/checkpoints/latest")" = step_00000005 ]' "checkpoints/latest names the last step"
check '"$S" inspect "$T/run" | grep -q "transformer.h.1.mlp.c_proj.weight"' "inspect lists HF tensor names"
check '"$S" inspect "$T/run" | grep -q "step 5"' "inspect shows the training state"

# unknown key, bad value, missing config: exit 2 with the key named
"$S" train --bogus 1 >"$T/e1.txt" 2>&1; rc=$?
check '[ $rc -eq 2 ] && grep -q "bogus" "$T/e1.txt"' "unknown key is named"
"$S" train --lr abc >"$T/e2.txt" 2>&1; rc=$?
check '[ $rc -eq 2 ] && grep -q "key .lr." "$T/e2.txt"' "bad value names the key"
"$S" train --config "$T/none.json" >"$T/e3.txt" 2>&1; rc=$?
check '[ $rc -eq 2 ] && grep -q "none.json" "$T/e3.txt"' "missing config file is named"
"$S" inspect "$T/none" >"$T/e4.txt" 2>&1; rc=$?
check '[ $rc -ne 0 ] && grep -q "no such file" "$T/e4.txt"' "inspect of a missing path"

# train on packed datasets, mixed by weight
for i in $(seq 1 200); do echo "line $i of the first corpus, with some words in it."; done > "$T/a.txt"
for i in $(seq 1 200); do echo "second corpus line $i: numbers $((i*7)) and $((i*13))."; done > "$T/b.txt"
"$S" data pack -o "$T/a" --split line "$T/a.txt" >/dev/null 2>&1 && "$S" data pack -o "$T/b" --split line "$T/b.txt" >/dev/null 2>&1
check '[ -f "$T/a.idx" ] && [ -f "$T/b.bin" ]' "data pack writes .bin/.idx"
"$S" train $small --vocab_size 257 --steps 3 --data "$T/a:0.7,$T/b:0.3" --run_dir "$T/mix" >"$T/mix.txt" 2>&1
check '[ $? -eq 0 ] && [ $(wc -l < "$T/mix/metrics.jsonl") -eq 3 ]' "training on a weighted mix of packed datasets"
"$S" train $small --steps 1 --data "$T/a" --run_dir "$T/mixbad" >"$T/e5.txt" 2>&1; rc=$?
check '[ $rc -ne 0 ] && grep -q "a.bin" "$T/e5.txt" && grep -q "256" "$T/e5.txt"' "a token outside the vocabulary names the file"
"$S" train $small --steps 1 --data "$T/missing" --run_dir "$T/mixbad2" >"$T/e6.txt" 2>&1; rc=$?
check '[ $rc -ne 0 ] && grep -q "missing" "$T/e6.txt"' "a missing data file is named"

# Llama family: train from a preset, write a Hugging Face directory, fine-tune from it
"$S" train --model llama-tiny --vocab_size 256 --max_seq 64 --seq 32 --batch 4 --steps 3 --run_dir "$T/ll" \
  --save_hf "$T/hf" >"$T/ll.txt" 2>&1
check '[ $? -eq 0 ] && [ -f "$T/hf/config.json" ] && [ -f "$T/hf/model.safetensors" ]' "--save_hf writes an HF directory"
check 'grep -q LlamaForCausalLM "$T/hf/config.json"' "the HF config names the architecture"
"$S" train --init-from "$T/hf" --seq 32 --batch 4 --steps 2 --run_dir "$T/ft" --save_hf "$T/hf16" --save_hf_dtype bf16 >"$T/ft.txt" 2>&1
check '[ $? -eq 0 ] && grep -q "BF16" <("$S" inspect "$T/hf16")' "--init-from fine-tunes and bf16 save works"
check '"$S" inspect "$T/hf" | grep -q "kv heads 2"' "inspect describes an HF directory"
"$S" train --init-from "$T/nothing" --steps 1 --run_dir "$T/bad" >"$T/e7.txt" 2>&1; rc=$?
check '[ $rc -ne 0 ] && grep -q "init_from" "$T/e7.txt"' "a missing HF directory names the key"
"$S" train --model gpt2-mini --n_layer 1 --n_embd 64 --n_head 2 --batch 2 --seq 16 --steps 1 --run_dir "$T/g" --save_hf "$T/hfg" >/dev/null 2>&1
check 'grep -q GPT2LMHeadModel "$T/hfg/config.json" && "$S" inspect "$T/hfg/model.safetensors" | grep -q transformer.wte.weight' "GPT-2 --save_hf"

# Ctrl-C: the step finishes, a checkpoint is written, resume continues to the end
"$S" train $small --steps 400 --run_dir "$T/int" >"$T/int.txt" 2>&1 &
pid=$!
for i in $(seq 1 100); do [ -s "$T/int/metrics.jsonl" ] && break; sleep 0.1; done
kill -INT $pid; wait $pid; rc=$?
check '[ $rc -eq 0 ]' "SIGINT stops cleanly (rc $rc)"
check '[ -f "$T/int/checkpoints/latest" ]' "SIGINT leaves a checkpoint"
stopped=$(sed 's/step_0*//' "$T/int/checkpoints/latest")
"$S" train --resume "$T/int" --steps $((stopped + 2)) >"$T/res.txt" 2>&1
check '[ $? -eq 0 ] && grep -q "resumed from" "$T/res.txt"' "resume after SIGINT"
check '[ $(wc -l < "$T/int/metrics.jsonl") -eq $((stopped + 2)) ]' "metrics continue after resume"

echo "cli: $checks checks, $((checks-fail)) passed, $fail failed"
[ $fail -eq 0 ] && rm -rf "$T"
[ $fail -eq 0 ]
