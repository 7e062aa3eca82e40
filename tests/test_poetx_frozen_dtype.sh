#!/usr/bin/env bash
# test_poetx_frozen_dtype.sh - method poetx with W0 held in bf16 and int8 (key frozen_dtype),
# end to end through the strata binary (gpt2-mini at C 128, b 16, a merge every 3 steps):
#  - each trains, the loss falls; its first loss is the fp32 run's within the rounding of W0
#    (bf16: 2e-3, int8: 2e-2), and not the same bits (W0 is really rounded);
#  - resume is bit-exact across merges: 8 steps straight and 3 + 5 (the checkpoint right after
#    the merge at 3, then --resume over the merge at 6) give the same losses and byte-identical
#    final checkpoints, whose W0 is BF16, or U8 codes with F32 .w0_scale and .w0_zero;
#  - the Llama family trains too (llama-tiny, int8);
#  - save_hf writes the merged dense weights in fp32;
#  - bad input refused, naming the key: a resume with another frozen_dtype (config.json
#    untouched), an unknown value, frozen_dtype with method full (before a run directory exists),
#    and by strata plan (method lora holds its base in frozen_dtype too: test_lora_frozen_dtype.sh);
#  - strata plan counts W0 at its precision: the frozen class falls by 2 (bf16) and by 3 - 8/256
#    (int8) bytes a matmul-weight parameter, less the panel buffer.
set -u
. "$(dirname "$0")/lib_method_cli.sh"
method_begin poetx_frozen_dtype
poet="--method poetx --poetx_block 16 --poetx_terms 4 --poetx_merge_every 3 --lr 1e-2 --warmup_steps 2"
model="--model gpt2-mini --vocab_size 256 --batch 2 --seq 16 --sample_every 0 --eval_every 0 --quiet 1"
ck() { echo "$1/checkpoints/step_0000000$2/model.safetensors"; }
# the dtype of tensor $2 in safetensors file $1 (its JSON header)
st_dtype() { python3 -c 'import json,struct,sys; f=open(sys.argv[1],"rb"); n=struct.unpack("<Q",f.read(8))[0]; h=json.loads(f.read(n)); print(h.get(sys.argv[2],{}).get("dtype","none"))' "$1" "$2"; }
command -v python3 >/dev/null || { echo "no python3: skipped"; exit 77; }

"$S" train $model $poet --steps 8 --ckpt_every 3 --run_dir "$T/fp32" >"$T/fp32.out" 2>&1
f_first=$(losses "$T/fp32" | cut -d" " -f1)
for d in bf16 int8; do
  tol=$([ $d = bf16 ] && echo 2e-3 || echo 2e-2)
  "$S" train $model $poet --steps 8 --ckpt_every 3 --frozen_dtype $d --run_dir "$T/$d" >"$T/$d.out" 2>&1
  rc=$?
  check '[ $rc -eq 0 ]' "$d run: $(tail -2 "$T/$d.out")"
  a=$(losses "$T/$d")
  first=$(echo $a | cut -d" " -f1); last=$(echo $a | awk "{print \$NF}")
  check '[ "$(echo $a | wc -w)" = 8 ] && awk "BEGIN{exit !($last < $first)}"' "$d: the loss falls over 8 steps ($a)"
  check 'awk "BEGIN{d = $first - $f_first; if (d < 0) d = -d; exit !(d < $tol && d > 0)}"' \
    "$d: the first loss $first within $tol of fp32's $f_first, and not equal (W0 rounded)"
  # resume: 3 + 5 over the merges at 3 and 6
  "$S" train $model $poet --steps 8 --ckpt_every 3 --stop_at 3 --frozen_dtype $d --run_dir "$T/r$d" >"$T/r$d.1" 2>&1
  "$S" train --resume "$T/r$d" --stop_at 0 >"$T/r$d.2" 2>&1
  rc=$?
  check '[ $rc -eq 0 ] && [ "$(losses "$T/r$d")" = "$a" ]' "$d resume (rc $rc): losses $(losses "$T/r$d") against $a"
  check 'cmp -s "$(ck "$T/$d" 8)" "$(ck "$T/r$d" 8)"' "$d: the resumed run's final checkpoint is byte-identical"
  want=$([ $d = bf16 ] && echo BF16 || echo U8)
  w=transformer.h.1.mlp.c_fc.weight
  check '[ "$(st_dtype "$(ck "$T/$d" 8)" $w)" = $want ]' "$d: the checkpoint's W0 $w is $(st_dtype "$(ck "$T/$d" 8)" $w), want $want"
  resume_refused "$T/r$d" frozen_dtype --frozen_dtype fp32
done
check '[ "$(st_dtype "$(ck "$T/int8" 8)" transformer.h.1.mlp.c_fc.w0_scale)" = F32 ]' "int8: the groups' scales are F32"

# the Llama family, int8; save_hf: the merged dense weights in fp32
"$S" train --model llama-tiny --vocab_size 256 --batch 2 --seq 16 --sample_every 0 --eval_every 0 --quiet 1 $poet \
  --poetx_block 8 --steps 4 --frozen_dtype int8 --save_hf "$T/hf" --run_dir "$T/l" >"$T/l.out" 2>&1
rc=$?
hf=$(ls "$T"/hf/*.safetensors 2>/dev/null | head -1)
check '[ $rc -eq 0 ] && [ -n "$hf" ] && [ "$(st_dtype "$hf" model.layers.0.mlp.down_proj.weight)" = F32 ]' \
  "llama-tiny int8 with save_hf (rc $rc): $(tail -1 "$T/l.out"); down_proj $( [ -n "$hf" ] && st_dtype "$hf" model.layers.0.mlp.down_proj.weight)"

# bad input: refused before a run directory exists, naming the key
refused unknown "$model $poet --steps 2 --frozen_dtype int4" "frozen_dtype" "int4"
refused full "$model --steps 2 --frozen_dtype bf16" "frozen_dtype" "method full"

# strata plan: the frozen class at W0's precision (gpt2-mini: 4 layers of 12 C^2 = 786,432 matmul
# weights, the largest 65,536 values: a 256 KiB panel)
plan() { "$S" plan $model $poet --frozen_dtype $1 --json 2>/dev/null | jq -r '.memory.classes.frozen_weights.bytes'; }
p32=$(plan fp32); p16=$(plan bf16); p8=$(plan int8)
check '[ "$(awk "BEGIN{print $p32 - $p16}")" = "$(awk "BEGIN{print 2 * 786432 - 262144}")" ]' \
  "plan: frozen fp32 $p32 - bf16 $p16 = 2 x 786432 - the panel 262144"
check '[ "$(awk "BEGIN{print $p32 - $p8}")" = "$(awk "BEGIN{print 3 * 786432 - 8 * 786432 / 256 - 262144}")" ]' \
  "plan: frozen fp32 $p32 - int8 $p8 = (3 - 8/256) x 786432 - the panel 262144"

"$S" plan $model --frozen_dtype int8 >"$T/plan_full.out" 2>&1
rc=$?
check '[ $rc -ne 0 ] && grep -q "key .frozen_dtype." "$T/plan_full.out"' "strata plan refuses frozen_dtype int8 with method full (rc $rc): $(tail -1 "$T/plan_full.out")"

method_end poetx_frozen_dtype
