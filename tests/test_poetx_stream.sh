#!/usr/bin/env bash
# test_poetx_stream.sh - strata train --method poetx under layer streaming (device_budget on the
# cpu device): the base's blocks (W0 in them: fp32, or as held in bf16/int8) stream through the budget, POET-X's hook runs
# R W0 P on them and takes the gradients of Q and of the base's embeddings, norms and biases to
# the POET-X vector, and the in-memory step's optimizer updates it (a merge every 3 steps).
#  - gpt2-tiny (6 blocks, fewer weight slots than blocks: they stream) with every block
#    recomputed, offloaded or kept gives the in-memory run's losses exactly over 6 steps with two
#    merges, a byte-identical checkpoint (the trained vector, W0 and the permutations; the
#    optimizer state) and a byte-identical merged model (--save_hf): the same ops in the same order;
#  - poetx_recompute 1 and grad_accum 2, and matmul bf16 (where there is one): the same;
#  - validation between the steps (eval_every 2) gives the in-memory run's losses and val_loss;
#  - llama-tiny (4 blocks, an untied head) recomputed: the same;
#  - a streamed run resumed (4 + 4 steps, a merge at 6) equals the straight streamed run bit for bit;
#  - strata plan's memory account counts the executor's tables (no gradient slots, the
#    embedding's and head's gradients);
#  - (a chunked vocabulary: tests/test_poetx_stream_vocab.sh);
#  - frozen_dtype bf16 and int8: W0 streams as held (codes, int8's scales and zeros) beside the
#    block's norms and biases, the merges round the new W0 into the host store and the blocks are
#    sent again; recomputed, offloaded and kept, poetx_recompute 1 with grad_accum 2 and validation
#    between the steps, each equals the same held run in memory bit for bit over 6 steps with two
#    merges (losses, val_loss, checkpoint with W0 as held, merged model), llama-tiny, qwen2-tiny
#    (q, k, v biases) and qwen3-tiny (q, k norms) bf16 too, int8 under matmul bf16, and an int8
#    streamed run resumed (4 + 4, the merge at 6 after the resume) equals 8 steps in memory; strata plan's
#    device bytes count a held slot in place of the fp32 slab;
#  - with the disk state (state_paths; the store holds the POET-X vector, W0 of each merge in a
#    file beside it, written from the streamed base): fp32 and int8 W0 equal the streamed runs with
#    the state in RAM bit for bit over 6 steps with two merges (losses, final weights, merged
#    model); an int8 run stopped right after a merge (3) and before one (4) and resumed with its
#    store, and one killed after the store committed a merge's step and before W0's file (the merge
#    made again on resume, into the streamed base), equal the straight streamed run with the store
#    and 8 steps in memory bit for bit; strata plan's account counts the store's buffers as its
#    layout of the trained vector takes them (not state_budget) and its disk section the trained
#    elements only;
#  - refused before a run directory exists, naming the key: device cuda with device_budget,
#    plan_state auto (2 ranks streamed: tests/test_poetx_stream_dist.sh).
set -u
. "$(dirname "$0")/lib_method_cli.sh"
method_begin poetx_stream
px="--method poetx --poetx_block 8 --poetx_merge_every 3 --lr 1e-2 --warmup_steps 2"
g6="--model gpt2-tiny --n_layer 6 $tiny $px"
budget=400000 # every block recomputed: prefetch depth 1, the head resident

depth_of() { sed -n 's/.*prefetch depth \([0-9]*\).*/\1/p' "$1" | head -1; }
ck() { echo "$1/checkpoints/step_$(printf %08d "$2")"; }
same_run() { # NAME DIR_A DIR_B STEPS: equal losses, byte-identical last checkpoint
    local name=$1 a=$2 b=$3 n=$4
    check '[ "$(losses "$a")" = "$(losses "$b")" ] && [ "$(jq -r .step "$b/metrics.jsonl" | wc -l)" = "$n" ]' \
      "$name: losses ($(losses "$b")) equal the in-memory run's ($(losses "$a"))"
    check 'cmp -s "$(ck "$a" $n)/model.safetensors" "$(ck "$b" $n)/model.safetensors" &&
           cmp -s "$(ck "$a" $n)/train_state.bin" "$(ck "$b" $n)/train_state.bin"' \
      "$name: the checkpoint of step $n (trained vector, W0, permutations, optimizer state) is byte-identical"
}
run() { # DIR ARGS...: its status
    local d=$1
    shift
    "$S" train "$@" --run_dir "$d" >"$d.out" 2>&1
}

# --- gpt2-tiny in memory, then streamed three ways (the blocks stream: a prefetch depth under 5)
run "$T/mem" $g6 --steps 6 --save_hf "$T/mem.hf"
rc=$?
check '[ $rc -eq 0 ]' "in-memory run: $(tail -2 "$T/mem.out")"
for ab in recompute:$budget offload:460000 keep:700000; do
    act=${ab%:*}
    run "$T/s_$act" $g6 --steps 6 --device_budget ${ab#*:} --act $act --save_hf "$T/s_$act.hf"
    rc=$?
    check '[ $rc -eq 0 ] && grep -q "layer streaming: device budget" "$T/s_$act.out"' \
      "streamed $act runs (rc $rc): $(tail -2 "$T/s_$act.out")"
    d=$(depth_of "$T/s_$act.out")
    check '[ -n "$d" ] && [ $((d + 1)) -lt 6 ] && grep -q "vocab_chunk 0" "$T/s_$act.out"' \
      "streamed $act: fewer weight slots than blocks, the head resident (prefetch depth '$d' of 6 blocks)"
    same_run "gpt2-tiny $act" "$T/mem" "$T/s_$act" 6
    check 'cmp -s "$T/mem.hf/model.safetensors" "$T/s_$act.hf/model.safetensors"' \
      "gpt2-tiny $act: the merged model (--save_hf) is byte-identical to the in-memory run's"
done

# --- poetx_recompute 1 (the hook forms h again in the backward) and grad_accum 2
run "$T/mem_rc" $g6 --steps 4 --poetx_recompute 1 --grad_accum 2
run "$T/s_rc" $g6 --steps 4 --poetx_recompute 1 --grad_accum 2 --device_budget $budget --act recompute
rc=$?
check '[ $rc -eq 0 ]' "streamed poetx_recompute 1, grad_accum 2 runs: $(tail -2 "$T/s_rc.out")"
same_run "poetx_recompute 1, grad_accum 2" "$T/mem_rc" "$T/s_rc" 4

# --- matmul bf16 (where this build and CPU have it): the executor's bf16 copy of the weights is
# not what the hook reads (W0 from the fp32 block), the same steps as in memory
if run "$T/mem_bf" $g6 --steps 6 --matmul bf16; then
    run "$T/s_bf" $g6 --steps 6 --matmul bf16 --device_budget $budget --act recompute
    rc=$?
    check '[ $rc -eq 0 ]' "streamed matmul bf16 runs: $(tail -2 "$T/s_bf.out")"
    same_run "matmul bf16" "$T/mem_bf" "$T/s_bf" 6
else
    echo "matmul bf16 not available here: $(tail -1 "$T/mem_bf.out")"
fi

# --- validation every 2 steps between the steps (and after the merge at 3)
vl() { jq -r '[.loss, .val_loss] | @text' "$1/metrics.jsonl" | tr '\n' ' '; }
run "$T/ev_mem" $g6 --steps 6 --eval_every 2
run "$T/ev_s" $g6 --steps 6 --eval_every 2 --device_budget $budget --act recompute
check '[ "$(vl "$T/ev_s")" = "$(vl "$T/ev_mem")" ] && [ "$(jq -r .val_loss "$T/ev_s/metrics.jsonl" | grep -vc null)" = 3 ]' \
  "eval_every 2: losses and validation losses ($(vl "$T/ev_s")) equal the in-memory run's ($(vl "$T/ev_mem"))"

# --- llama-tiny at 4 blocks (an untied head: the post-block gradients are the norm's and the head's)
l4="--model llama-tiny --n_layer 4 $tiny $px"
run "$T/lmem" $l4 --steps 6 --save_hf "$T/lmem.hf"
run "$T/ls" $l4 --steps 6 --device_budget 380000 --act recompute --save_hf "$T/ls.hf"
rc=$?
d=$(depth_of "$T/ls.out")
check '[ $rc -eq 0 ] && [ -n "$d" ] && [ $((d + 1)) -lt 4 ]' "llama-tiny streamed runs, prefetch depth '$d': $(tail -2 "$T/ls.out")"
same_run "llama-tiny recompute" "$T/lmem" "$T/ls" 6
check 'cmp -s "$T/lmem.hf/model.safetensors" "$T/ls.hf/model.safetensors"' \
  "llama-tiny: the merged model (--save_hf) is byte-identical to the in-memory run's"

# --- resume of a streamed run: 4 + 4 (the merge at 6 after the resume) equals 8 straight
run "$T/r8" $g6 --steps 8 --ckpt_every 4 --device_budget 460000 --act offload
run "$T/r44" $g6 --steps 8 --ckpt_every 4 --stop_at 4 --device_budget 460000 --act offload
"$S" train --resume "$T/r44" --stop_at 0 >"$T/r44b.out" 2>&1
rc=$?
check '[ $rc -eq 0 ] && grep -q "layer streaming: device budget" "$T/r44b.out"' "streamed resume runs streamed (rc $rc): $(tail -2 "$T/r44b.out")"
same_run "streamed resume" "$T/r8" "$T/r44" 8

# --- strata plan's memory account: a streamed POET-X run's device tables are full's less the 2
# gradient slots (12 C^2 + 13 C floats each at C 32) and nothing else (the embedding's and head's
# gradients are formed); the hook's kept h and scratch on the host besides
for m in full poetx; do
    mk=$([ $m = poetx ] && echo "$px" || echo "--method full")
    "$S" plan --model gpt2-tiny --n_layer 6 $tiny $mk --device_budget $budget --act recompute --json \
      >"$T/pj_$m.json" 2>"$T/pj_$m.err"
done
af=$(jq -r .memory.classes.activations.bytes "$T/pj_full.json"); ap=$(jq -r .memory.classes.activations.bytes "$T/pj_poetx.json")
check '[ "$((af - ap))" = $((2 * 4 * (12 * 32 * 32 + 13 * 32))) ]' \
  "strata plan: poetx's device bytes ($ap) are full's ($af) less the gradient slots only"
check 'jq -e ".memory.tiers.device.fits" "$T/pj_poetx.json" >/dev/null' \
  "strata plan: the streamed POET-X plan fits $budget: $(head -c 300 "$T/pj_poetx.json") $(tail -1 "$T/pj_poetx.err")"

# --- frozen_dtype bf16 and int8: W0 streams as held (the slots are held slabs; these budgets still
# leave fewer slots than blocks), two merges in 6 steps
for fd in bf16 int8; do
    run "$T/hm_$fd" $g6 --steps 6 --frozen_dtype $fd --save_hf "$T/hm_$fd.hf"
    rc=$?
    check '[ $rc -eq 0 ]' "$fd in memory runs: $(tail -2 "$T/hm_$fd.out")"
    ob=$([ $fd = bf16 ] && echo 380000 || echo 360000) # fewer weight slots than blocks
    for ab in recompute:320000 offload:$ob keep:650000; do
        act=${ab%:*} h="$T/hs_${fd}_${ab%:*}"
        run "$h" $g6 --steps 6 --frozen_dtype $fd --device_budget ${ab#*:} --act $act --save_hf "$h.hf"
        rc=$?
        d=$(depth_of "$h.out")
        check '[ $rc -eq 0 ] && grep -q "layer streaming: device budget" "$h.out" && [ -n "$d" ] && [ $((d + 1)) -lt 6 ]' \
          "$fd streamed $act runs with fewer weight slots than blocks (rc $rc, prefetch depth '$d'): $(tail -2 "$h.out")"
        same_run "$fd $act" "$T/hm_$fd" "$h" 6
        check 'cmp -s "$T/hm_$fd.hf/model.safetensors" "$h.hf/model.safetensors"' \
          "$fd $act: the merged model (--save_hf) is byte-identical to the in-memory run's"
    done
    run "$T/hma_$fd" $g6 --steps 6 --frozen_dtype $fd --poetx_recompute 1 --grad_accum 2 --eval_every 2
    run "$T/hsa_$fd" $g6 --steps 6 --frozen_dtype $fd --poetx_recompute 1 --grad_accum 2 --eval_every 2 \
      --device_budget 320000 --act recompute
    check '[ "$(vl "$T/hsa_$fd")" = "$(vl "$T/hma_$fd")" ] && [ "$(jq -r .val_loss "$T/hsa_$fd/metrics.jsonl" | grep -vc null)" = 3 ]' \
      "$fd poetx_recompute 1, grad_accum 2, eval_every 2: losses and validation losses ($(vl "$T/hsa_$fd")) equal the in-memory run's ($(vl "$T/hma_$fd"))"
    same_run "$fd poetx_recompute 1, grad_accum 2, eval_every 2" "$T/hma_$fd" "$T/hsa_$fd" 6
done
# held W0 under matmul bf16 (where there is one): the executor's bf16 copy holds only the ends (the
# blocks' matmul weights are held by the hook), the same steps as in memory
if run "$T/hm_bf" $g6 --steps 6 --frozen_dtype int8 --matmul bf16; then
    run "$T/hs_bf" $g6 --steps 6 --frozen_dtype int8 --matmul bf16 --device_budget 320000 --act recompute
    rc=$?
    check '[ $rc -eq 0 ]' "int8 streamed under matmul bf16 runs: $(tail -2 "$T/hs_bf.out")"
    same_run "int8, matmul bf16" "$T/hm_bf" "$T/hs_bf" 6
fi
# qwen2-tiny (q, k, v biases packed in the held slab) and qwen3-tiny (q and k norms) bf16, streamed
for q in qwen2-tiny:280000 qwen3-tiny:380000; do
    m="$T/hqm_${q%:*}" h="$T/hqs_${q%:*}"
    run "$m" --model ${q%:*} --n_layer 4 $tiny $px --steps 6 --frozen_dtype bf16
    run "$h" --model ${q%:*} --n_layer 4 $tiny $px --steps 6 --frozen_dtype bf16 --device_budget ${q#*:} --act recompute
    rc=$?
    d=$(depth_of "$h.out")
    check '[ $rc -eq 0 ] && [ -n "$d" ] && [ $((d + 1)) -lt 4 ]' \
      "${q%:*} bf16 streamed with fewer weight slots than blocks (rc $rc, prefetch depth '$d'): $(tail -2 "$h.out")"
    same_run "${q%:*} bf16" "$m" "$h" 6
done
# llama-tiny bf16 (the held slab packs the norms; q|k|v and gate|up held apart)
run "$T/hlm" $l4 --steps 6 --frozen_dtype bf16
run "$T/hls" $l4 --steps 6 --frozen_dtype bf16 --device_budget 330000 --act recompute
rc=$?
d=$(depth_of "$T/hls.out")
check '[ $rc -eq 0 ] && [ -n "$d" ] && [ $((d + 1)) -lt 4 ]' "llama-tiny bf16 streamed runs, prefetch depth '$d': $(tail -2 "$T/hls.out")"
same_run "llama-tiny bf16 recompute" "$T/hlm" "$T/hls" 6
# a streamed int8 run stopped at 4 and resumed streamed (the merge at 6 after it) equals 8 in memory
run "$T/hr8" $g6 --steps 8 --ckpt_every 4 --frozen_dtype int8
run "$T/hr44" $g6 --steps 8 --ckpt_every 4 --stop_at 4 --frozen_dtype int8 --device_budget 360000 --act offload
"$S" train --resume "$T/hr44" --stop_at 0 >"$T/hr44b.out" 2>&1
rc=$?
check '[ $rc -eq 0 ] && grep -q "layer streaming: device budget" "$T/hr44b.out"' "int8 streamed resume runs streamed (rc $rc): $(tail -2 "$T/hr44b.out")"
same_run "int8 streamed 4 + 4 against 8 in memory" "$T/hr8" "$T/hr44" 8
# strata plan: at its default plan (2 weight slots) the account's device bytes are fp32's less 2 x
# (the fp32 slab of 12 C^2 + 13 C floats less a held slot: the 13 C floats of the norms and biases
# rounded to 64 bytes, 1664, and W0 held: bf16 2 x 12 C^2 bytes; int8 12 C^2 codes and per weight
# (4 of them) a 64-byte run of scales and one of zeros), at C 32
for fd in bf16 int8; do
    "$S" plan $g6 --frozen_dtype $fd --device_budget 320000 --act recompute --json >"$T/pj_$fd.json" 2>"$T/pj_$fd.err"
done
slab=$((4 * (12 * 32 * 32 + 13 * 32)))
ah=$(jq -r .memory.classes.activations.bytes "$T/pj_bf16.json"); ai=$(jq -r .memory.classes.activations.bytes "$T/pj_int8.json")
check '[ "$((ap - ah))" = $((2 * (slab - 1664 - 2 * 12 * 32 * 32))) ] && [ "$((ap - ai))" = $((2 * (slab - 1664 - 12 * 32 * 32 - 4 * 2 * 64))) ]' \
  "strata plan: the device bytes of bf16 ($ah) and int8 ($ai) are fp32's ($ap) less 2 x a slab's fp32 matmul weights, plus W0's held bytes"
check '[ "$ap" -gt 320000 ] && jq -e ".memory.tiers.device.fits and .device_bytes <= 320000" "$T/pj_bf16.json" >/dev/null' \
  "strata plan: bf16's plan fits 320000 bytes, under fp32's smallest ($ap): $(jq -c "[.prefetch_depth, .device_bytes]" "$T/pj_bf16.json")"

# --- the disk state under streaming: the store holds the POET-X vector, W0's files beside it
disk_run() { # DIR STATE ARGS...: a streamed run with its store in STATE (made); its status
    local d=$1 st=$2
    shift 2
    mkdir -p "$st"
    "$S" train "$@" --run_dir "$d" --state_paths "$st" >"$d.out" 2>&1
}
same_disk() { # NAME REF REF_CK DIR: DIR's losses are REF's, its final weights REF's checkpoint REF_CK's
    local name=$1 a=$2 w=$3 b=$4
    check '[ "$(losses "$b")" = "$(losses "$a")" ] && [ -n "$(losses "$a")" ] && cmp -s "$w" "$b/model.safetensors"' \
      "$name: losses ($(losses "$b")) equal ($(losses "$a")) and the final weights are byte-identical"
}
disk_run "$T/sd" "$T/sd.st" $g6 --steps 6 --device_budget $budget --act recompute --save_hf "$T/sd.hf"
rc=$?
check '[ $rc -eq 0 ] && grep -q "layer streaming: device budget" "$T/sd.out" && grep -q "state store:" "$T/sd.out" &&
       [ -f "$T/sd.st/strata-state.poetx-w0-000000006.safetensors" ] && [ ! -e "$T/sd/checkpoints" ]' \
  "streamed with state_paths runs, W0 of the merge at 6 beside the store (rc $rc): $(tail -2 "$T/sd.out")"
same_disk "streamed, state_paths against the state in RAM" "$T/s_recompute" "$(ck "$T/s_recompute" 6)/model.safetensors" "$T/sd"
check 'cmp -s "$T/s_recompute.hf/model.safetensors" "$T/sd.hf/model.safetensors"' \
  "streamed, state_paths: the merged model (--save_hf) is byte-identical to the state in RAM's"
disk_run "$T/sdi" "$T/sdi.st" $g6 --steps 6 --frozen_dtype int8 --device_budget 320000 --act recompute
same_disk "int8 streamed, state_paths against the state in RAM" "$T/hs_int8_recompute" \
  "$(ck "$T/hs_int8_recompute" 6)/model.safetensors" "$T/sdi"
# int8, 8 steps (merges at 3 and 6): straight, stopped at 3 (W0 of that merge read from its file on
# resume) and at 4, and killed after the store committed step 6 and before W0's file
hd="$g6 --steps 8 --frozen_dtype int8 --device_budget 360000 --act offload"
disk_run "$T/sd8" "$T/sd8.st" $hd
same_disk "int8 streamed with state_paths, 8 steps, against 8 in memory" "$T/hr8" "$(ck "$T/hr8" 8)/model.safetensors" "$T/sd8"
for at in 3 4; do
    disk_run "$T/sds$at" "$T/sds$at.st" $hd --stop_at $at
    "$S" train --resume "$T/sds$at" --stop_at 0 --state_paths "$T/sds$at.st" >"$T/sds$at.2.out" 2>&1
    rc=$?
    check '[ $rc -eq 0 ] && grep -q "resumed from the state store .* at step $at" "$T/sds$at.2.out" &&
           grep -q "layer streaming: device budget" "$T/sds$at.2.out"' \
      "streamed with state_paths, stopped at $at, resumed streamed from the store (rc $rc): $(tail -2 "$T/sds$at.2.out")"
    same_disk "int8 streamed, state_paths, $at + $((8 - at))" "$T/sd8" "$T/sd8/model.safetensors" "$T/sds$at"
done
mkdir -p "$T/sdk.st"
{ STRATA_FAILPOINT=train_update_committed:6 "$S" train $hd --run_dir "$T/sdk" --state_paths "$T/sdk.st" \
    >"$T/sdk.out" 2>&1; } 2>/dev/null
rc=$?
check '[ $rc -eq 137 ]' "failpoint train_update_committed:6: the process was not killed (rc $rc): $(tail -2 "$T/sdk.out")"
"$S" train --resume "$T/sdk" --stop_at 0 --state_paths "$T/sdk.st" >"$T/sdk.2.out" 2>&1
rc=$?
check '[ $rc -eq 0 ] && grep -q "merge of that step is made again" "$T/sdk.2.out"' \
  "killed before the merge's W0 file, resumed streamed: the merge made again (rc $rc): $(tail -2 "$T/sdk.2.out")"
check '[ "$(jq -r .loss "$T/sdk/metrics.jsonl" | tail -2 | tr "\n" " ")" = "$(jq -r .loss "$T/sd8/metrics.jsonl" | tail -2 | tr "\n" " ")" ] &&
       cmp -s "$T/sd8/model.safetensors" "$T/sdk/model.safetensors"' \
  "killed at step 6 and resumed: the last losses and the final weights equal the straight run's"
# strata plan: the store's buffers are its layout of the trained vector (fp32 state: 12 bytes an
# element, one region a few KiB over it), not state_budget's 256 MiB; the disk section counts the
# trained elements
"$S" plan $g6 --device_budget $budget --act recompute --state_paths "$T/sd.st" --json >"$T/pj_sd.json" 2>"$T/pj_sd.err"
"$S" plan $g6 --device_budget $budget --act recompute --state_paths "$T/sd.st" >"$T/pt_sd.out" 2>&1
tw=$(jq -r .memory.classes.weights.bytes "$T/pj_sd.json"); sb=$(jq -r .memory.classes.state_buffers.bytes "$T/pj_sd.json")
check '[ -n "$tw" ] && [ "$sb" -ge $((3 * tw)) ] && [ "$sb" -le $((3 * tw + 16384)) ]' \
  "strata plan: the store's buffers ($sb bytes) are 12 bytes a trained element ($((tw / 4))) and a few KiB"
check 'grep -q "needs      0.000 GB\|needs      0.001 GB" "$T/pt_sd.out"' \
  "strata plan: the disk section counts the trained vector's state: $(grep -A1 "^disk state" "$T/pt_sd.out" | tail -1)"

# --- refusals naming the key, before a run directory exists
refused cuda "$g6 --steps 2 --device_budget $budget --device cuda" "key 'device'" "method poetx"
refused state_cuda "$g6 --steps 2 --device_budget $budget --device cuda --state_paths $T/st" "key 'device'" "method poetx"
refused place "$g6 --steps 2 --device_budget $budget --plan_state auto" "key 'plan_state'" "poetx"
method_end poetx_stream
