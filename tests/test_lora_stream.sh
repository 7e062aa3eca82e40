#!/usr/bin/env bash
# test_lora_stream.sh - strata train --method lora under layer streaming (device_budget on the
# cpu device): the frozen base's blocks stream through the budget, the adapters' hook runs on
# them, the in-memory step's optimizer updates the adapters.
#  - gpt2-tiny (6 blocks, fewer weight slots than blocks: they stream)
#    with every block recomputed, offloaded or kept, and grad_accum 2, gives the in-memory
#    run's losses exactly and a byte-identical adapter file (the same ops in the same order);
#    the merged model (--save_hf) is byte-identical too;
#  - validation between the steps (eval_every 2) gives the in-memory run's losses and val_loss;
#  - llama-tiny (4 blocks, 2 weight slots) with all seven projections, recomputed: the same;
#  - a chunked vocabulary (a plan file with vocab_chunk 64): the losses within 1e-5 relative of
#    the in-memory run's, the adapters within 1e-4 relative (the online softmax sums in another
#    order: float rounding, as for method full);
#  - a streamed run resumed (4 + 4 steps) equals the straight streamed run bit for bit;
#  - strata plan counts no gradient slots or embedding gradient for it;
#  - frozen_dtype bf16 and int8: each block's matmul weights stream as held (codes, int8's scales
#    and zeros) beside its norms and biases; recomputed, offloaded and kept, grad_accum 2 with
#    validation between the steps, each equals the same held run in memory bit for bit (losses,
#    val_loss, adapter file, merged model), llama-tiny int8 too, and an int8 streamed run resumed
#    (4 + 4) equals 8 steps in memory; strata plan's device bytes count a held slot (the 1-D tensors and the held bytes)
#    in place of the fp32 slab, and a budget under fp32's smallest plan fits bf16's;
#  - with the disk state (state_paths: the store holds the adapters' vector, the step updates it
#    after the executor's backward): fp32 and int8 equal the streamed runs with the state in RAM
#    bit for bit (losses, adapter file, merged model); an int8 run stopped at 4 and resumed with its
#    store equals the straight streamed run with the store and 8 steps in memory bit for bit;
#    strata plan's account counts the store's buffers as its layout of the adapters takes them;
#  - refused before a run directory exists, naming the key: device cuda with device_budget (with
#    state_paths too).
set -u
. "$(dirname "$0")/lib_method_cli.sh"
method_begin lora_stream
lora="--method lora --lora_rank 4 --lora_alpha 8 --lr 1e-2 --warmup_steps 2"
g6="--model gpt2-tiny --n_layer 6 $tiny $lora --lora_targets c_attn,c_proj,c_fc"
budget=400000 # every block recomputed: prefetch depth 2, the head resident

# the prefetch depth a streamed run's log says its plan has (depth + 1 weight slots)
depth_of() { sed -n 's/.*prefetch depth \([0-9]*\).*/\1/p' "$1" | head -1; }
same_run() { # NAME DIR_A DIR_B: equal losses and byte-identical adapters
    local name=$1 a=$2 b=$3
    check '[ "$(losses "$a")" = "$(losses "$b")" ] && [ -n "$(losses "$a")" ]' \
      "$name: losses ($(losses "$b")) equal the in-memory run's ($(losses "$a"))"
    check 'cmp -s "$a.ad/adapter_model.safetensors" "$b.ad/adapter_model.safetensors"' \
      "$name: the adapter file is byte-identical to the in-memory run's"
}
run() { # DIR ARGS...: a run saving its adapter in DIR.ad; its status
    local d=$1
    shift
    "$S" train "$@" --run_dir "$d" --save_adapter "$d.ad" >"$d.out" 2>&1
}

# --- gpt2-tiny in memory, then streamed three ways (the blocks stream: a prefetch depth under 5)
run "$T/mem" $g6 --steps 4 --save_hf "$T/mem.hf"
rc=$?
check '[ $rc -eq 0 ]' "in-memory run: $(tail -2 "$T/mem.out")"
for ab in recompute:400000 offload:400000 keep:650000; do
    act=${ab%:*}
    run "$T/s_$act" $g6 --steps 4 --device_budget ${ab#*:} --act $act --save_hf "$T/s_$act.hf"
    rc=$?
    check '[ $rc -eq 0 ] && grep -q "layer streaming: device budget" "$T/s_$act.out"' \
      "streamed $act runs (rc $rc): $(tail -2 "$T/s_$act.out")"
    d=$(depth_of "$T/s_$act.out")
    check '[ -n "$d" ] && [ $((d + 1)) -lt 6 ] && grep -q "vocab_chunk 0" "$T/s_$act.out"' \
      "streamed $act: fewer weight slots than blocks, the head resident (prefetch depth '$d' of 6 blocks)"
    same_run "gpt2-tiny $act" "$T/mem" "$T/s_$act"
    check 'cmp -s "$T/mem.hf/model.safetensors" "$T/s_$act.hf/model.safetensors"' \
      "gpt2-tiny $act: the merged model (--save_hf) is byte-identical to the in-memory run's"
done

# --- validation every 2 steps between the steps (its forward takes the weight slots): the
# same losses and validation losses
vl() { jq -r '[.loss, .val_loss] | @text' "$1/metrics.jsonl" | tr '\n' ' '; }
"$S" train $g6 --steps 6 --eval_every 2 --run_dir "$T/ev_mem" >"$T/ev_mem.out" 2>&1
"$S" train $g6 --steps 6 --eval_every 2 --device_budget $budget --act recompute --run_dir "$T/ev_s" >"$T/ev_s.out" 2>&1
check '[ "$(vl "$T/ev_s")" = "$(vl "$T/ev_mem")" ] && [ "$(jq -r .val_loss "$T/ev_s/metrics.jsonl" | grep -vc null)" = 3 ]' \
  "eval_every 2: losses and validation losses ($(vl "$T/ev_s")) equal the in-memory run's ($(vl "$T/ev_mem"))"

# --- grad_accum 2: each micro-batch's adapter gradient summed as in memory
run "$T/mem_acc" $g6 --steps 4 --grad_accum 2
run "$T/s_acc" $g6 --steps 4 --grad_accum 2 --device_budget $budget --act recompute
rc=$?
check '[ $rc -eq 0 ]' "streamed grad_accum 2 runs: $(tail -2 "$T/s_acc.out")"
same_run "grad_accum 2" "$T/mem_acc" "$T/s_acc"

# --- llama-tiny at 4 blocks, every projection
l4="--model llama-tiny --n_layer 4 $tiny $lora --lora_targets q,k,v,o,gate,up,down"
run "$T/lmem" $l4 --steps 4
run "$T/ls" $l4 --steps 4 --device_budget 300000 --act recompute
rc=$?
check '[ $rc -eq 0 ] && [ "$(depth_of "$T/ls.out")" = 1 ]' "llama-tiny streamed runs, prefetch depth 1: $(tail -2 "$T/ls.out")"
same_run "llama-tiny recompute" "$T/lmem" "$T/ls"

# --- a chunked vocabulary: a plan file with vocab_chunk 64 (four chunks of the 256 rows)
"$S" plan $g6 --device_budget $budget --act recompute -o "$T/plan0.json" >"$T/plan0.out" 2>&1
jq '.vocab_chunk = 64' "$T/plan0.json" >"$T/plan_vc.json"
run "$T/s_vc" $g6 --steps 4 --device_budget $budget --plan "$T/plan_vc.json"
rc=$?
check '[ $rc -eq 0 ] && grep -q "vocab_chunk 64" "$T/s_vc.out"' "chunked vocabulary runs (rc $rc): $(tail -2 "$T/s_vc.out")"
check 'paste <(jq -r .loss "$T/mem/metrics.jsonl") <(jq -r .loss "$T/s_vc/metrics.jsonl") |
       awk "{d = \$1 - \$2; if (d < 0) d = -d; if (d > 1e-5 * \$1) bad = 1; n++} END {exit bad || n != 4}"' \
  "chunked vocabulary: losses ($(losses "$T/s_vc")) within 1e-5 relative of the in-memory run's ($(losses "$T/mem"))"
if command -v python3 >/dev/null && python3 -c "import numpy" 2>/dev/null; then
    cat >"$T/close.py" <<'EOF'
import json, struct, sys
import numpy as np
def read(p):
    b = open(p, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + n])
    return {k: np.frombuffer(b[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]], np.float32)
            for k, v in h.items() if k != "__metadata__"}
a, b = read(sys.argv[1]), read(sys.argv[2])
assert a.keys() == b.keys()
worst = max(float(np.max(np.abs(a[k] - b[k])) / max(float(np.max(np.abs(a[k]))), 1e-30)) for k in a)
print(worst)
sys.exit(0 if worst < float(sys.argv[3]) else 1)
EOF
    w=$(python3 "$T/close.py" "$T/mem.ad/adapter_model.safetensors" "$T/s_vc.ad/adapter_model.safetensors" 1e-4 2>&1)
    rc=$?
    echo "chunked vocabulary: the adapters' worst relative difference from the in-memory run's: $w"
    check '[ $rc -eq 0 ]' "chunked vocabulary: the adapters within 1e-4 relative of the in-memory run's (worst tensor: $w)"
fi

# --- resume of a streamed run: 4 + 4 equals 8 straight
run "$T/r8" $g6 --steps 8 --ckpt_every 4 --device_budget $budget --act offload
"$S" train $g6 --steps 8 --ckpt_every 4 --stop_at 4 --device_budget $budget --act offload --run_dir "$T/r44" \
  >"$T/r44a.out" 2>&1
"$S" train --resume "$T/r44" --stop_at 0 --save_adapter "$T/r44.ad" >"$T/r44b.out" 2>&1
rc=$?
check '[ $rc -eq 0 ] && grep -q "layer streaming: device budget" "$T/r44b.out"' "streamed resume runs streamed (rc $rc): $(tail -2 "$T/r44b.out")"
check '[ "$(losses "$T/r44")" = "$(losses "$T/r8")" ] && [ "$(jq -r .step "$T/r44/metrics.jsonl" | wc -l)" = 8 ]' \
  "streamed resume: losses ($(losses "$T/r44")) equal the straight streamed run's ($(losses "$T/r8"))"
check 'cmp -s "$T/r8.ad/adapter_model.safetensors" "$T/r44.ad/adapter_model.safetensors"' \
  "streamed resume: the adapter file is byte-identical to the straight run's"

# --- strata plan: a LoRA run's device account holds no gradient slots and no embedding gradient
# (its smallest plan, every block recomputed): full's less 2 block slabs of 12 C^2 + 13 C
# floats and the (V + max_seq) x C embedding, at C 32, V 256, max_seq 16: 136448 bytes
for m in full lora; do
    "$S" plan --model gpt2-tiny --n_layer 6 $tiny --method $m --device_budget $budget --act recompute --json \
      >"$T/pj_$m.json" 2>"$T/pj_$m.err"
done
af=$(jq -r .memory.classes.activations.bytes "$T/pj_full.json"); al=$(jq -r .memory.classes.activations.bytes "$T/pj_lora.json")
check '[ "$((af - al))" = $((2 * 4 * (12 * 32 * 32 + 13 * 32) + 4 * (256 + 16) * 32)) ]' \
  "strata plan: lora's device bytes ($al) are full's ($af) less the gradient slots and the embedding's gradient"
check 'jq -e ".memory.tiers.device.fits and .device_bytes <= $budget and .vocab_chunk == 0" "$T/pj_lora.json" >/dev/null' \
  "strata plan: lora's plan fits $budget with the head resident: $(jq -c "[.device_bytes, .vocab_chunk]" "$T/pj_lora.json")"

# --- frozen_dtype bf16 and int8: the held weights stream (the slots are held slabs: more of them
# fit a budget; these budgets still leave fewer slots than blocks)
for fd in bf16 int8; do
    run "$T/hm_$fd" $g6 --steps 4 --frozen_dtype $fd --save_hf "$T/hm_$fd.hf"
    rc=$?
    check '[ $rc -eq 0 ]' "$fd in memory runs: $(tail -2 "$T/hm_$fd.out")"
    ob=$([ $fd = bf16 ] && echo 360000 || echo 320000) # the head resident, fewer slots than blocks
    for ab in recompute:300000 offload:$ob keep:600000; do
        act=${ab%:*} h="$T/hs_${fd}_${ab%:*}"
        run "$h" $g6 --steps 4 --frozen_dtype $fd --device_budget ${ab#*:} --act $act --save_hf "$h.hf"
        rc=$?
        d=$(depth_of "$h.out")
        check '[ $rc -eq 0 ] && grep -q "layer streaming: device budget" "$h.out" && [ -n "$d" ] && [ $((d + 1)) -lt 6 ] &&
               grep -q "vocab_chunk 0" "$h.out"' \
          "$fd streamed $act runs with fewer weight slots than blocks, the head resident (rc $rc, prefetch depth '$d'): $(tail -2 "$h.out")"
        same_run "$fd $act" "$T/hm_$fd" "$h"
        check 'cmp -s "$T/hm_$fd.hf/model.safetensors" "$h.hf/model.safetensors"' \
          "$fd $act: the merged model (--save_hf) is byte-identical to the in-memory run's"
    done
    run "$T/hma_$fd" $g6 --steps 4 --frozen_dtype $fd --grad_accum 2 --eval_every 2
    run "$T/hsa_$fd" $g6 --steps 4 --frozen_dtype $fd --grad_accum 2 --eval_every 2 --device_budget 300000 --act recompute
    check '[ "$(vl "$T/hsa_$fd")" = "$(vl "$T/hma_$fd")" ] && [ "$(jq -r .val_loss "$T/hsa_$fd/metrics.jsonl" | grep -vc null)" = 2 ]' \
      "$fd grad_accum 2, eval_every 2: losses and validation losses ($(vl "$T/hsa_$fd")) equal the in-memory run's ($(vl "$T/hma_$fd"))"
    same_run "$fd grad_accum 2, eval_every 2" "$T/hma_$fd" "$T/hsa_$fd"
done
# llama-tiny int8, every projection (the held slab packs the norms; q|k|v and gate|up held apart)
run "$T/hlm" $l4 --steps 4 --frozen_dtype int8
run "$T/hls" $l4 --steps 4 --frozen_dtype int8 --device_budget 240000 --act recompute
rc=$?
d=$(depth_of "$T/hls.out")
check '[ $rc -eq 0 ] && [ -n "$d" ] && [ $((d + 1)) -lt 4 ] && grep -q "vocab_chunk 0" "$T/hls.out"' \
  "llama-tiny int8 streamed runs, prefetch depth '$d', the head resident: $(tail -2 "$T/hls.out")"
same_run "llama-tiny int8 recompute" "$T/hlm" "$T/hls"
# a streamed int8 run stopped at 4 and resumed streamed equals 8 steps in memory
run "$T/hr8" $g6 --steps 8 --frozen_dtype int8
"$S" train $g6 --steps 8 --ckpt_every 4 --stop_at 4 --frozen_dtype int8 --device_budget 320000 --act offload \
  --run_dir "$T/hr44" >"$T/hr44a.out" 2>&1
"$S" train --resume "$T/hr44" --stop_at 0 --save_adapter "$T/hr44.ad" >"$T/hr44b.out" 2>&1
rc=$?
check '[ $rc -eq 0 ] && grep -q "layer streaming: device budget" "$T/hr44b.out"' "int8 streamed resume runs streamed (rc $rc): $(tail -2 "$T/hr44b.out")"
same_run "int8 streamed 4 + 4 against 8 in memory" "$T/hr8" "$T/hr44"
# strata plan: at its default plan (prefetch depth 1: 2 weight slots) the account's device bytes are
# fp32's less 2 x (the fp32 slab of 12 C^2 + 13 C floats less a held slot: the 13 C floats of the
# norms and biases rounded to 64 bytes, 1664, and the held weights: bf16 2 x 12 C^2 bytes; int8
# 12 C^2 codes and per weight (4 of them) a 64-byte run of scales and one of zeros), at C 32
for fd in bf16 int8; do
    "$S" plan --model gpt2-tiny --n_layer 6 $tiny $lora --lora_targets c_attn,c_proj,c_fc --frozen_dtype $fd \
      --device_budget 300000 --act recompute --json >"$T/pj_$fd.json" 2>"$T/pj_$fd.err"
done
slab=$((4 * (12 * 32 * 32 + 13 * 32)))
ah=$(jq -r .memory.classes.activations.bytes "$T/pj_bf16.json"); ai=$(jq -r .memory.classes.activations.bytes "$T/pj_int8.json")
check '[ "$((al - ah))" = $((2 * (slab - 1664 - 2 * 12 * 32 * 32))) ] && [ "$((al - ai))" = $((2 * (slab - 1664 - 12 * 32 * 32 - 4 * 2 * 64))) ]' \
  "strata plan: the device bytes of bf16 ($ah) and int8 ($ai) are fp32's ($al) less 2 x a slab's fp32 matmul weights, plus their held bytes"
check '[ "$al" -gt 300000 ] && jq -e ".memory.tiers.device.fits and .device_bytes <= 300000" "$T/pj_bf16.json" >/dev/null' \
  "strata plan: bf16's plan fits 300000 bytes, under fp32's smallest ($al): $(jq -c "[.prefetch_depth, .device_bytes]" "$T/pj_bf16.json")"

# --- the disk state under streaming: the store holds the adapters' vector
disk_run() { # DIR STATE ARGS...: a streamed run with its store in STATE (made), its adapter in DIR.ad
    local d=$1 st=$2
    shift 2
    mkdir -p "$st"
    "$S" train "$@" --run_dir "$d" --state_paths "$st" --save_adapter "$d.ad" >"$d.out" 2>&1
}
disk_run "$T/sd" "$T/sd.st" $g6 --steps 4 --device_budget 400000 --act recompute --save_hf "$T/sd.hf"
rc=$?
check '[ $rc -eq 0 ] && grep -q "layer streaming: device budget" "$T/sd.out" && grep -q "state store:" "$T/sd.out" &&
       [ ! -e "$T/sd/checkpoints" ]' "streamed with state_paths runs (rc $rc): $(tail -2 "$T/sd.out")"
same_run "streamed, state_paths against the state in RAM" "$T/s_recompute" "$T/sd"
check 'cmp -s "$T/s_recompute.hf/model.safetensors" "$T/sd.hf/model.safetensors"' \
  "streamed, state_paths: the merged model (--save_hf) is byte-identical to the state in RAM's"
disk_run "$T/sdi" "$T/sdi.st" $g6 --steps 4 --frozen_dtype int8 --device_budget 300000 --act recompute
same_run "int8 streamed, state_paths against the state in RAM" "$T/hs_int8_recompute" "$T/sdi"
# int8, 8 steps: straight and stopped at 4, resumed from the store, against 8 in memory
hd="$g6 --steps 8 --frozen_dtype int8 --device_budget 320000 --act offload"
disk_run "$T/sd8" "$T/sd8.st" $hd
same_run "int8 streamed with state_paths, 8 steps, against 8 in memory" "$T/hr8" "$T/sd8"
disk_run "$T/sds" "$T/sds.st" $hd --stop_at 4
"$S" train --resume "$T/sds" --stop_at 0 --state_paths "$T/sds.st" --save_adapter "$T/sds.ad" >"$T/sds.2.out" 2>&1
rc=$?
check '[ $rc -eq 0 ] && grep -q "resumed from the state store .* at step 4" "$T/sds.2.out" &&
       grep -q "layer streaming: device budget" "$T/sds.2.out"' \
  "streamed with state_paths, stopped at 4, resumed streamed from the store (rc $rc): $(tail -2 "$T/sds.2.out")"
same_run "int8 streamed, state_paths, 4 + 4" "$T/sd8" "$T/sds"
check 'cmp -s "$T/sd8/model.safetensors" "$T/sds/model.safetensors"' \
  "int8 streamed, state_paths, 4 + 4: the final weights are byte-identical to the straight run's"
# strata plan: the store's buffers are its layout of the adapters (fp32 state: 12 bytes an element,
# one region a few KiB over it), not state_budget's 256 MiB
"$S" plan $g6 --frozen_dtype int8 --device_budget 300000 --act recompute --state_paths "$T/sd.st" --json \
  >"$T/pj_sd.json" 2>"$T/pj_sd.err"
tw=$(jq -r .memory.classes.weights.bytes "$T/pj_sd.json"); sb=$(jq -r .memory.classes.state_buffers.bytes "$T/pj_sd.json")
check '[ -n "$tw" ] && [ "$sb" -ge $((3 * tw)) ] && [ "$sb" -le $((3 * tw + 16384)) ]' \
  "strata plan: the store's buffers ($sb bytes) are 12 bytes an adapter element ($((tw / 4))) and a few KiB"

# --- refusals naming the key, before a run directory exists
refused cuda "$g6 --steps 2 --device_budget $budget --device cuda" "key 'device'" "method lora"
refused state_cuda "$g6 --steps 2 --device_budget $budget --device cuda --state_paths $T/st" "key 'device'" "method lora"

method_end lora_stream
