#!/usr/bin/env bash
# test_train_act_bf16.sh - strata train's key act_dtype bf16: the activations each block
# keeps for its backward stored in bf16 (st_stream_plan.act_dtype). Checks:
#   - in memory and layer-streamed with every block kept, recomputed or offloaded (and a mix)
#     the runs end with the same weights and optimizer state, bit for bit, and log the same
#     losses (GPT-2 and the Llama family's set layouts);
#   - the bf16 run is not the fp32 run (the rounding is applied), and its last loss is within
#     2% of the fp32 run's;
#   - refusals naming the key: a bad value, method lora and poetx, a plan file made for the
#     other dtype, and a resume with another act_dtype than the run's config.json records
#     (nothing written; force_resume 1 runs it, warned, recorded as bf16 and force_resume 0);
#   - strata plan takes and shows act_dtype: a kept plan's device bytes are smaller in bf16.
# Toy models of 4 blocks, about 10 s in all.
set -u
S=${STRATA_BIN:?STRATA_BIN not set}
T=$(mktemp -d /tmp/strata-test-act-bf16-XXXXXX)
fail=0
check() { if ! eval "$1"; then echo "FAIL: $2"; fail=1; fi; }
GPT="--model gpt2-tiny --n_embd 64 --n_layer 4 --vocab_size 256 --max_seq 32 --batch 2 --seq 32 --eval_every 0
     --sample_every 0 --quiet 1 --threads 2 --ckpt_every 0"
LLAMA="--model llama-tiny --n_layer 4 --vocab_size 256 --max_seq 32 --batch 2 --seq 32 --eval_every 0
       --sample_every 0 --quiet 1 --threads 2 --ckpt_every 0"
BUDGET="--device_budget 2e8"
losses() { jq -r 'select(.loss != null) | .loss' "$1/metrics.jsonl" 2>/dev/null | tr '\n' ' '; }
last_ckpt() { ls -d "$1"/checkpoints/step_* 2>/dev/null | tail -1; }
# same_state A B: the last checkpoints' weights and optimizer state are the same bytes
same_state() {
    local a b
    a=$(last_ckpt "$1"); b=$(last_ckpt "$2")
    [ -n "$a" ] && [ -n "$b" ] && cmp -s "$a/model.safetensors" "$b/model.safetensors" &&
        cmp -s "$a/train_state.bin" "$b/train_state.bin"
}

for fam in gpt llama; do
    if [ $fam = gpt ]; then M=$GPT; else M=$LLAMA; fi
    steps=8
    run() { # name, extra keys
        local n=$1; shift
        "$S" train $M --steps $steps "$@" --run_dir "$T/$fam-$n" >"$T/$fam-$n.out" 2>&1
        rc=$?
        check '[ $rc -eq 0 ]' "$fam $n ($*) failed: $(tail -3 "$T/$fam-$n.out")"
    }
    run mem32 --act_dtype f32
    run mem16 --act_dtype bf16
    run keep16 --act_dtype bf16 $BUDGET --act keep
    run rc16 --act_dtype bf16 $BUDGET --act recompute
    run off16 --act_dtype bf16 $BUDGET --act offload
    run mix16 --act_dtype bf16 $BUDGET --act 0:offload,1:recompute,2:offload,3:keep
    ref=$(losses "$T/$fam-mem16")
    check '[ -n "$ref" ]' "$fam: the bf16 run in memory logged no losses"
    for n in keep16 rc16 off16 mix16; do
        check 'same_state "$T/$fam-mem16" "$T/$fam-$n"' \
            "$fam: bf16 $n (streamed) does not end with the in-memory bf16 run's weights and state, bit for bit"
        check '[ "$(losses "$T/$fam-$n")" = "$ref" ]' \
            "$fam: bf16 $n losses $(losses "$T/$fam-$n") differ from the in-memory run's $ref"
    done
    check '! same_state "$T/$fam-mem16" "$T/$fam-mem32"' "$fam: the bf16 run ended with the fp32 run's weights"
    check 'grep -q "activations (blocks 0-3 offload)" "$T/$fam-off16.out"' \
        "$fam: the offload run's log does not name its plan: $(grep activations "$T/$fam-off16.out")"
done

# the loss within 2% of fp32's over a longer toy run
"$S" train $GPT --steps 40 --act_dtype f32 --run_dir "$T/long32" >"$T/long32.out" 2>&1
"$S" train $GPT --steps 40 --act_dtype bf16 --run_dir "$T/long16" >"$T/long16.out" 2>&1
l32=$(jq -r 'select(.step == 40) | .loss' "$T/long32/metrics.jsonl" 2>/dev/null)
l16=$(jq -r 'select(.step == 40) | .loss' "$T/long16/metrics.jsonl" 2>/dev/null)
first=$(jq -r 'select(.step == 1) | .loss' "$T/long16/metrics.jsonl" 2>/dev/null)
check '[ -n "$l32" ] && [ -n "$l16" ] && awk -v a="$l32" -v b="$l16" -v f="$first" \
    "BEGIN { d = (b - a) / a; if (d < 0) d = -d; exit !(d <= 0.02 && b < f - 0.2) }"' \
    "bf16's loss at step 40 ($l16) is not within 2% of fp32's ($l32), or did not fall from $first"

# refusals naming the key
"$S" train $GPT --steps 1 --act_dtype fp16 --run_dir "$T/bad" >"$T/bad.out" 2>&1
rc=$?
check '[ $rc -ne 0 ] && grep -q "key .act_dtype.: .fp16. is not f32 or bf16" "$T/bad.out" && [ ! -e "$T/bad" ]' \
    "act_dtype fp16 is not refused naming the key: $(tail -1 "$T/bad.out")"
for method in lora poetx; do
    extra=""
    [ $method = poetx ] && extra="--poetx_block 8"
    "$S" train $GPT --steps 1 --method $method $extra --act_dtype bf16 --run_dir "$T/$method" >"$T/$method.out" 2>&1
    rc=$?
    check '[ $rc -ne 0 ] && grep -q "key .act_dtype.*method $method" "$T/$method.out" && [ ! -e "$T/$method" ]' \
        "method $method with act_dtype bf16 is not refused naming the key: $(tail -1 "$T/$method.out")"
    "$S" train $GPT --steps 1 --method $method $extra --act_dtype f32 --run_dir "$T/$method-f32" >"$T/$method-f32.out" 2>&1
    rc=$?
    check '[ $rc -eq 0 ]' "method $method with act_dtype f32 failed: $(tail -2 "$T/$method-f32.out")"
done

# strata plan: takes and shows act_dtype; a kept plan holds fewer device bytes in bf16
P="--model gpt2-tiny --n_embd 64 --n_layer 4 --vocab_size 256 --max_seq 32 --batch 2 --seq 32"
"$S" plan $P --device_budget 2e8 --act keep --json -o "$T/plan32.json" >"$T/p32.json" 2>"$T/p32.err"
"$S" plan $P --device_budget 2e8 --act keep --act_dtype bf16 --json -o "$T/plan16.json" >"$T/p16.json" 2>"$T/p16.err"
if [ -s "$T/plan16.json" ]; then
    check 'jq -e ".act_dtype == \"bf16\"" "$T/plan16.json" >/dev/null' "the bf16 plan file does not say act_dtype bf16"
    check 'jq -e ".act_dtype == \"f32\"" "$T/plan32.json" >/dev/null' "the fp32 plan file does not say act_dtype f32"
    b32=$(jq -r .device_bytes "$T/plan32.json"); b16=$(jq -r .device_bytes "$T/plan16.json")
    check '[ "$b16" -lt "$b32" ]' "a kept plan's device bytes in bf16 ($b16) are not below fp32's ($b32)"
    "$S" plan $P --act_dtype bf16 >"$T/ptext.out" 2>&1
    check 'grep -q "act_dtype bf16" "$T/ptext.out"' "strata plan's text does not show act_dtype: $(head -2 "$T/ptext.out")"
    # a plan file of the other dtype is refused, naming the key
    "$S" train $GPT --steps 1 --plan "$T/plan16.json" --run_dir "$T/planmis" >"$T/planmis.out" 2>&1
    rc=$?
    check '[ $rc -ne 0 ] && grep -q "key .act_dtype.: f32, but plan file .* keeps bf16" "$T/planmis.out"' \
        "a bf16 plan file run with act_dtype f32 is not refused naming the key: $(tail -1 "$T/planmis.out")"
    "$S" train $GPT --steps 2 --plan "$T/plan16.json" --act_dtype bf16 --run_dir "$T/planok" >"$T/planok.out" 2>&1
    rc=$?
    check '[ $rc -eq 0 ]' "the bf16 plan file with act_dtype bf16 failed: $(tail -2 "$T/planok.out")"
else
    echo "act_bf16: strata plan made no plan file (no GLPK?): $(tail -1 "$T/p16.err"); its checks skipped"
fi

# a resume with another act_dtype: refused before anything is written; forced: warned
"$S" train $GPT --steps 2 --ckpt_every 2 --act_dtype f32 --run_dir "$T/res" >"$T/r1.out" 2>&1
rc=$?
check '[ $rc -eq 0 ]' "the run to resume failed: $(tail -2 "$T/r1.out")"
cp "$T/res/config.json" "$T/config.before"
ls -R "$T/res" >"$T/tree.before"
"$S" train --resume "$T/res" --steps 4 --act_dtype bf16 >"$T/r2.out" 2>&1
rc=$?
check '[ $rc -ne 0 ] && grep -q "key .act_dtype.*trained with act_dtype f32.*this resume gives bf16.*force_resume 1" "$T/r2.out"' \
    "a bf16 resume of an f32 run is not refused naming the key and both: $(cat "$T/r2.out")"
ls -R "$T/res" >"$T/tree.after"
check 'cmp -s "$T/config.before" "$T/res/config.json" && cmp -s "$T/tree.before" "$T/tree.after"' \
    "the refused resume wrote something"
"$S" train --resume "$T/res" --steps 3 --act_dtype f32 >"$T/r3.out" 2>&1
rc=$?
check '[ $rc -eq 0 ]' "a resume with the run's own act_dtype failed: $(tail -2 "$T/r3.out")"
"$S" train --resume "$T/res" --steps 4 --act_dtype bf16 --force_resume 1 >"$T/r4.out" 2>&1
rc=$?
check '[ $rc -eq 0 ] && grep -q "warning: key .act_dtype.*trained with act_dtype f32" "$T/r4.out"' \
    "the forced resume failed or did not warn: $(tail -2 "$T/r4.out")"
check 'grep -q "\"act_dtype\": *\"bf16\"" "$T/res/config.json" && grep -q "\"force_resume\": *0" "$T/res/config.json"' \
    "config.json does not record act_dtype bf16 and force_resume 0 after the forced resume"

[ $fail -eq 0 ] && rm -rf "$T" && echo "train_act_bf16: all checks passed"
exit $fail
