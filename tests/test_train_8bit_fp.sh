#!/usr/bin/env bash
# test_train_8bit_fp.sh - optim_state 8bit-fp (the float-map 8-bit moments, optim.h) as a
# run option: a run trains with it (its loss falls, as an f32 run's does, and ends within 5%
# of it), is recorded as such in config.json, and a run stopped at step 3 and resumed to 6
# logs the same losses, bit for bit in metrics.jsonl, as one run of 6 steps. Refused before
# anything is written: with state_paths (the disk state keeps f32 or 8bit), and a resume of
# an 8bit run with 8bit-fp (its moments are the other map's: the checkpoint is named). A toy
# GPT-2, a few seconds.
set -u
S=${STRATA_BIN:?STRATA_BIN not set}
T=$(mktemp -d /tmp/strata-test-8bit-fp-XXXXXX)
fail=0
check() { if ! eval "$1"; then echo "FAIL: $2"; fail=1; fi; }
TOY="--model gpt2-tiny --n_embd 64 --n_layer 2 --vocab_size 256 --max_seq 32 --batch 2 --seq 32 --eval_every 0
     --sample_every 0 --quiet 1 --ckpt_every 3 --lr 3e-3"
losses() { python3 -c "import json,sys; print(' '.join(repr(json.loads(l)['loss']) for l in open(sys.argv[1]) if 'loss' in l))" "$1"; }

"$S" train $TOY --steps 6 --optim_state 8bit-fp --run_dir "$T/fp" >"$T/fp.out" 2>&1
rc=$?
check '[ $rc -eq 0 ]' "the 8bit-fp run failed: $(tail -3 "$T/fp.out")"
check 'grep -q "\"optim_state\": *\"8bit-fp\"" "$T/fp/config.json"' "config.json does not record 8bit-fp"
"$S" train $TOY --steps 6 --optim_state f32 --run_dir "$T/f32" >"$T/f32.out" 2>&1
rc=$?
check '[ $rc -eq 0 ]' "the f32 run failed: $(tail -3 "$T/f32.out")"
read -r -a L8 <<<"$(losses "$T/fp/metrics.jsonl")"
read -r -a L32 <<<"$(losses "$T/f32/metrics.jsonl")"
check '[ ${#L8[@]} -eq 6 ] && [ ${#L32[@]} -eq 6 ]' "six losses each: ${#L8[@]}, ${#L32[@]}"
check 'python3 -c "import sys; a=[float(x) for x in sys.argv[1:7]]; b=[float(x) for x in sys.argv[7:13]];
sys.exit(0 if a[-1] < a[0] and abs(a[-1]-b[-1]) <= 0.05*b[-1] else 1)" ${L8[@]} ${L32[@]}' \
    "8bit-fp's loss does not fall as f32's: ${L8[*]} against ${L32[*]}"
check '[ "${L8[*]}" != "${L32[*]}" ]' "8bit-fp gave f32's losses exactly: the format was not applied"

# stopped at 3, resumed to 6: the same losses, bit for bit
"$S" train $TOY --steps 3 --optim_state 8bit-fp --run_dir "$T/cut" >"$T/cut.out" 2>&1
"$S" train --resume "$T/cut" --steps 6 >"$T/res.out" 2>&1
rc=$?
check '[ $rc -eq 0 ]' "the resume failed: $(tail -3 "$T/res.out")"
check '[ "$(losses "$T/cut/metrics.jsonl")" = "$(losses "$T/fp/metrics.jsonl")" ]' \
    "stopped and resumed: $(losses "$T/cut/metrics.jsonl"), one run: $(losses "$T/fp/metrics.jsonl")"

# refused with the disk state, naming the key, nothing written
"$S" train $TOY --steps 2 --optim_state 8bit-fp --state_paths "$T/disk" --run_dir "$T/nodisk" >"$T/d.out" 2>&1
rc=$?
check '[ $rc -ne 0 ] && grep -q "key .optim_state.: 8bit-fp is kept in host memory only" "$T/d.out"' \
    "8bit-fp with state_paths was not refused naming the key: $(tail -2 "$T/d.out")"
check '[ ! -e "$T/nodisk" ] && [ ! -e "$T/disk" ]' "the refused run wrote files"

# an 8bit run resumed as 8bit-fp: refused, the checkpoint named
"$S" train $TOY --steps 3 --optim_state 8bit --run_dir "$T/q8" >"$T/q8.out" 2>&1
rc=$?
check '[ $rc -eq 0 ]' "the 8bit run failed: $(tail -3 "$T/q8.out")"
"$S" train --resume "$T/q8" --steps 6 --optim_state 8bit-fp >"$T/x.out" 2>&1
rc=$?
check '[ $rc -ne 0 ] && grep -q "train_state.bin: optimizer state is format 1.*this run has format 2" "$T/x.out"' \
    "a resume of an 8bit run as 8bit-fp was not refused naming the state file: $(tail -2 "$T/x.out")"

rm -rf "$T"
if [ $fail -ne 0 ]; then echo "train_8bit_fp: FAILED"; exit 1; fi
echo "train_8bit_fp: ok"
