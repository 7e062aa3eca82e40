#!/usr/bin/env bash
# test_sample_cli.sh - strata sample end to end: from a run directory made by a short
# strata train, from one of its checkpoints and from its Hugging Face export (GPT-2 and
# a Llama-family model; with a tokenizer.json beside it, text in and out); the KV cache
# and --no-cache give the same text; a seed repeats its text; --json; clear errors.
# strata train --sample_every prints samples, and the one at the last step is exactly
# what strata sample draws from the saved weights with the same prompt and seed, in
# memory and under layer streaming (--device_budget).
set -u
S=${STRATA_BIN:?}
T=$(mktemp -d /tmp/strata-sample-XXXXXX)
fail=0; checks=0
check() { checks=$((checks+1)); if ! eval "$1"; then echo "FAIL: $2"; fail=$((fail+1)); fi; }

check '"$S" --help | grep -q "sample"' "strata --help lists sample"
check '"$S" sample --help | grep -q -- "--no-cache"' "strata sample --help documents --no-cache"
check '"$S" bench --help 2>&1 | grep -q "sample"' "strata bench --help lists sample"

# no validation passes where this strata has them: they are not what is tested here
noeval=""; "$S" train --help | grep -q -- "--eval_every" && noeval="--eval_every 0"
small="--model gpt2-mini --n_layer 2 --n_embd 64 --n_head 2 --batch 4 --seq 32 $noeval"
"$S" train $small --steps 4 --sample_every 2 --save_hf "$T/hf" --run_dir "$T/run" >"$T/train.txt" 2>"$T/train.err"
check '[ $? -eq 0 ]' "short training run with samples succeeds: $(tail -2 "$T/train.err")"
check '[ $(grep -c "^sample at step [24]: " "$T/train.txt") -eq 2 ]' "sample_every 2 prints samples at steps 2 and 4"

# the last step's sample is strata sample's draw from the checkpoint (prompt, seed 1337 + 4)
sample_matches() { # $1 training stdout, $2 run dir, $3 step, $4 seed
  python3 - "$1" "$3" >"$T/prompt.bin" 2>"$T/expect.bin" <<'EOF' || return 1
import re, sys
text = open(sys.argv[1], 'rb').read()
label = b"sample at step %s: " % sys.argv[2].encode()
body = text[text.index(label) + len(label):]
body = body[:re.search(rb"\n(done: |wrote |step |val)", body).start()]
unesc = lambda s: re.sub(rb'\\(\\|x[0-9a-f]{2})', lambda m: b'\\' if m.group(1) == b'\\' else bytes([int(m.group(1)[1:], 16)]), s)
prompt, sample = body.split(b"|", 1)
sys.stdout.buffer.write(unesc(prompt)); sys.stderr.buffer.write(unesc(sample))
EOF
  "$S" sample --from "$2" --prompt "$(cat "$T/prompt.bin")" --max_new 96 --seed "$4" >"$T/got.bin" 2>/dev/null || return 1
  cat "$T/prompt.bin" "$T/expect.bin" >"$T/want.bin"; printf '\n' >>"$T/want.bin"
  cmp -s "$T/got.bin" "$T/want.bin"
}
check 'sample_matches "$T/train.txt" "$T/run" 4 1341' "the training sample at step 4 is strata sample's draw from the run"

"$S" sample --from "$T/run" --prompt "the " --max_new 24 --temperature 0 >"$T/g1.txt" 2>"$T/g1.err"
check '[ $? -eq 0 ]' "strata sample --from RUN_DIR succeeds: $(cat "$T/g1.err")"
check '[ "$(head -c 4 "$T/g1.txt")" = "the " ] && [ $(wc -c < "$T/g1.txt") -eq 29 ]' "prompt, 24 bytes and a newline"
check 'grep -q "tokens/s" "$T/g1.err" && grep -q "checkpoints/step_00000004" "$T/g1.err"' "tokens/s and the checkpoint read reported"
"$S" sample --from "$T/run" --prompt "the " --max_new 24 --temperature 0 --no-cache >"$T/g2.txt" 2>/dev/null
check 'cmp -s "$T/g1.txt" "$T/g2.txt"' "greedy: --no-cache gives the same text as the KV cache"
"$S" sample --from "$T/run/checkpoints/step_00000004" --prompt "the " --max_new 24 --temperature 0 >"$T/g3.txt" 2>/dev/null
check 'cmp -s "$T/g1.txt" "$T/g3.txt"' "a checkpoint directory gives the run's text"
"$S" sample --from "$T/hf" --prompt "the " --max_new 24 --temperature 0 >"$T/g4.txt" 2>/dev/null
check 'cmp -s "$T/g1.txt" "$T/g4.txt"' "the Hugging Face export (GPT2LMHeadModel) gives the run's text"
for opt in "" "--no-cache"; do
  "$S" sample --from "$T/run" --prompt "a " --max_new 40 --seed 9 --top_k 20 --top_p 0.9 $opt >"$T/s9$opt.txt" 2>/dev/null
done
check 'cmp -s "$T/s9.txt" "$T/s9--no-cache.txt"' "seeded sampling: --no-cache draws the same text as the KV cache"
"$S" sample --from "$T/run" --prompt "a " --max_new 40 --seed 9 --top_k 20 --top_p 0.9 >"$T/s9b.txt" 2>/dev/null
"$S" sample --from "$T/run" --prompt "a " --max_new 40 --seed 10 --top_k 20 --top_p 0.9 >"$T/s10.txt" 2>/dev/null
check 'cmp -s "$T/s9.txt" "$T/s9b.txt" && ! cmp -s "$T/s9.txt" "$T/s10.txt"' "a seed repeats its text, another seed differs"
"$S" sample --from "$T/run" --prompt "x" --max_new 8 --json >"$T/j.json" 2>/dev/null
check 'python3 -c "import json,sys; d=json.load(open(sys.argv[1])); assert len(d[\"tokens\"])==8 and d[\"tokens_per_s\"]>0 and d[\"cache\"]" "$T/j.json"' "--json: tokens and tokens/s"

# a Llama-family model: run directory and its Hugging Face export agree
llama="--model llama-tiny --vocab_size 256 --batch 2 --seq 16 $noeval"
"$S" train $llama --steps 1 --sample_every 0 --save_hf "$T/lhf" --run_dir "$T/lrun" >"$T/ltrain.txt" 2>&1
check '[ $? -eq 0 ] && ! grep -q "^sample at" "$T/ltrain.txt"' "llama-tiny trains; sample_every 0 prints no sample"
"$S" sample --from "$T/lrun" --prompt "the " --max_new 10 --temperature 0 >"$T/l1.txt" 2>/dev/null
"$S" sample --from "$T/lhf" --prompt "the " --max_new 10 --temperature 0 >"$T/l2.txt" 2>/dev/null
"$S" sample --from "$T/lrun" --prompt "the " --max_new 10 --temperature 0 --no-cache >"$T/l3.txt" 2>/dev/null
check '[ $(wc -c < "$T/l1.txt") -eq 15 ] && cmp -s "$T/l1.txt" "$T/l2.txt" && cmp -s "$T/l1.txt" "$T/l3.txt"' \
  "llama: run dir, HF export and --no-cache give the same greedy text"

# under layer streaming the sample reads the host weights, the ones the checkpoint saves
"$S" train $small --steps 3 --sample_every 3 --device_budget 20000000 --run_dir "$T/srun" >"$T/strain.txt" 2>"$T/strain.err"
check '[ $? -eq 0 ] && grep -q "layer streaming" "$T/strain.err"' "streamed training run succeeds: $(tail -1 "$T/strain.err")"
check 'sample_matches "$T/strain.txt" "$T/srun" 3 1340' "under --device_budget the training sample is strata sample's draw from the run"

# a tokenizer.json beside the model: text in, text out (tests/fixtures/tok_gpt2.json, 600 tokens)
"$S" train --model gpt2-tiny --vocab_size 600 --batch 2 --seq 16 --steps 1 --sample_every 0 $noeval \
  --save_hf "$T/thf" --run_dir "$T/trun" >/dev/null 2>&1
cp "${STRATA_SOURCE_DIR:?}/tests/fixtures/tok_gpt2.json" "$T/thf/tokenizer.json"
"$S" sample --from "$T/thf" --prompt "Hello world" --max_new 8 --temperature 0 --json >"$T/tok.json" 2>"$T/tok.err"
check 'grep -q "text as tokenizer.json" "$T/tok.err" && python3 -c "import json,re,sys; d=json.load(open(sys.argv[1])); assert 1 < d[\"prompt_tokens\"] < 11 and len(d[\"tokens\"]) == 8 and not re.fullmatch(r\"( [0-9]+)+\", d[\"text\"])" "$T/tok.json"' \
  "tokenizer.json: the prompt is BPE-encoded and the output decoded: $(cat "$T/tok.json")"
"$S" sample --from "$T/thf" --prompt "Hello world" --max_new 8 --temperature 0 >"$T/tok.txt" 2>/dev/null
check '[ "$(head -c 11 "$T/tok.txt")" = "Hello world" ]' "tokenizer.json: the prompt echoed as text"
cp -r "$T/hf" "$T/hf600" && cp "$T/thf/tokenizer.json" "$T/hf600/"
"$S" sample --from "$T/hf600" --prompt "Hello" >"$T/e5.txt" 2>&1; rc=$?
check '[ $rc -eq 1 ] && grep -q "600 tokens" "$T/e5.txt"' "a tokenizer larger than the model's vocabulary is refused"

# errors: exit 2 and a message that names the problem
"$S" sample --prompt x >"$T/e1.txt" 2>&1; rc=$?
check '[ $rc -eq 2 ] && grep -q -- "--from" "$T/e1.txt"' "no --from or --model"
"$S" sample --from "$T/none" >"$T/e2.txt" 2>&1; rc=$?
check '[ $rc -eq 1 ] && grep -q "none" "$T/e2.txt"' "a missing directory is named"
"$S" sample --from "$T/run" --temperature -1 >"$T/e3.txt" 2>&1; rc=$?
check '[ $rc -eq 2 ] && grep -q "temperature" "$T/e3.txt"' "a negative temperature is refused"
"$S" sample --model gpt2-tiny --prompt "hello" >"$T/e4.txt" 2>&1; rc=$?
check '[ $rc -eq 1 ] && grep -q "token id" "$T/e4.txt"' "text for a vocabulary without a tokenizer asks for token ids"
"$S" sample --model gpt2-tiny --prompt "1 2 3" --max_new 5 --temperature 0 >"$T/ids.txt" 2>/dev/null
check 'grep -Eq "^1 2 3( [0-9]+){5}$" "$T/ids.txt"' "token ids in, token ids out: $(cat "$T/ids.txt")"

# bench sample: both paths, same tokens, a speedup figure
"$S" bench sample --model gpt2-mini --prompt_len 8 --max_new 24 --json >"$T/b.json" 2>/dev/null
check 'python3 -c "import json,sys; d=json.load(open(sys.argv[1])); assert d[\"same_tokens\"] and d[\"speedup\"]>0" "$T/b.json"' "bench sample --json"

echo "sample_cli: $checks checks, $((checks-fail)) passed, $fail failed"
if [ $fail -eq 0 ]; then rm -rf "$T"; exit 0; fi
echo "outputs kept in $T"; exit 1
