#!/usr/bin/env bash
# test_train_8bit_fp.sh - optim_state 8bit-fp (the float-map 8-bit moments, optim.h) as a
# run option: a run trains with it (its loss falls, as an f32 run's does, and ends within 5%
# of it), is recorded as such in config.json, and a run stopped at step 3 and resumed to 6
# logs the same losses, bit for bit in metrics.jsonl, as one run of 6 steps. With the disk
# state (state_paths) the same losses bit for bit, resumed too. Refused before anything is
# written: a resume of an 8bit run with 8bit-fp (its moments are the other map's: the
# checkpoint or the store's manifest is named). A toy GPT-2, a few seconds.
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

# with the disk state (state_paths): the moments live in the store in the float map; the
# losses equal the in-memory run's bit for bit, the manifest records the format, a run stopped
# at 3 and resumed from the store continues bit for bit, and an 8bit store resumed as 8bit-fp
# is refused naming the manifest, the store left as it was
mkdir -p "$T/disk" "$T/disk3" "$T/disk8"
"$S" train $TOY --steps 6 --optim_state 8bit-fp --state_paths "$T/disk" --run_dir "$T/d6" >"$T/d6.out" 2>&1
rc=$?
check '[ $rc -eq 0 ]' "8bit-fp with state_paths failed: $(tail -3 "$T/d6.out")"
check '[ "$(losses "$T/d6/metrics.jsonl")" = "$(losses "$T/fp/metrics.jsonl")" ]' \
    "8bit-fp on disk: $(losses "$T/d6/metrics.jsonl"), in memory: $(losses "$T/fp/metrics.jsonl")"
# strata plan's disk tier: the store's two regions of master and moments, within 5% of the
# file the run wrote (its regions are aligned), the moments named in their format
"$S" plan $TOY --steps 6 --optim_state 8bit-fp --state_paths "$T/disk" >"$T/plan.out" 2>&1
pdisk=$(awk '$1 == "disk" && $2 ~ /^[0-9]+$/ {print $2}' "$T/plan.out")
fsize=$(stat -c %s "$T/disk/strata-state.bin" 2>/dev/null || echo 0)
check 'python3 -c "import sys; p,f=float(sys.argv[1] or 0),float(sys.argv[2]); sys.exit(0 if p > 0 and abs(p-f) <= 0.05*f else 1)" "$pdisk" "$fsize"' \
    "strata plan's disk tier ${pdisk:-none} bytes, the store's file $fsize"
check 'grep -q "moments, 8-bit blockwise.*disk *optim_state 8bit-fp" "$T/plan.out"' \
    "strata plan does not place 8bit-fp moments on disk: $(grep moments "$T/plan.out")"
"$S" inspect "$T/disk/strata-state.manifest" >"$T/insp.out" 2>&1
check 'grep -q "8bit-fp states" "$T/insp.out"' "strata inspect does not name the store's 8bit-fp format: $(head -3 "$T/insp.out")"
"$S" train $TOY --steps 3 --optim_state 8bit-fp --state_paths "$T/disk3" --run_dir "$T/dcut" >"$T/dcut.out" 2>&1
"$S" train --resume "$T/dcut" --steps 6 >"$T/dres.out" 2>&1
rc=$?
check '[ $rc -eq 0 ]' "the disk-state resume failed: $(tail -3 "$T/dres.out")"
check '[ "$(losses "$T/dcut/metrics.jsonl")" = "$(losses "$T/fp/metrics.jsonl")" ]' \
    "8bit-fp on disk stopped and resumed: $(losses "$T/dcut/metrics.jsonl"), one run: $(losses "$T/fp/metrics.jsonl")"
"$S" train $TOY --steps 3 --optim_state 8bit --state_paths "$T/disk8" --run_dir "$T/d8" >"$T/d8.out" 2>&1
sum_before=$(cat "$T"/disk8/strata-state.bin "$T"/disk8/strata-state.manifest* | md5sum)
"$S" train --resume "$T/d8" --steps 6 --optim_state 8bit-fp >"$T/d8x.out" 2>&1
rc=$?
check '[ $rc -ne 0 ] && grep -q "strata-state.manifest.*8bit states.*8bit-fp" "$T/d8x.out"' \
    "an 8bit store resumed as 8bit-fp was not refused naming the manifest: $(tail -2 "$T/d8x.out")"
check '[ "$(cat "$T"/disk8/strata-state.bin "$T"/disk8/strata-state.manifest* | md5sum)" = "$sum_before" ]' "the refused resume changed the 8bit store (its state or manifests; the lock records its holder)"

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
