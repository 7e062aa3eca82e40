#!/usr/bin/env bash
# test_lora_frozen_dtype.sh - method lora with the base's block matmul weights held in bf16 and
# int8 (key frozen_dtype; QLoRA-style), end to end through the strata binary (gpt2-mini over a
# saved fp32 base X):
#  - what is held is X rounded by the documented scheme: the run's --save_hf at lr 0 (adapters
#    B = 0, so the merged model is the held base dequantised) equals this file's own rounding of
#    X's matmul weights (bf16 round to nearest even; int8 per group of 256: zero the least, scale
#    (most - least) / 255, the nearest code), and every other tensor is X's;
#  - the property: LoRA over X with frozen_dtype D gives the losses of LoRA in fp32 over that
#    rounded base (to 1e-5: metrics.jsonl's 6 decimals), 8 steps, and they fall;
#  - resume is bit-exact: 8 steps straight and 4 + 4 give the same losses and byte-identical
#    adapters (the checkpoint holds the adapters only; the base is rounded again from X);
#  - the Llama family (llama-tiny, int8, every projection) trains and save_hf writes F32 weights;
#  - refused naming the key frozen_dtype: a resume with another frozen_dtype (config.json
#    untouched), bf16 with device cuda, and method full (before a run directory exists);
#  - strata plan counts the held base: the frozen class falls by 2 (bf16) and by 3 - 8/256 (int8)
#    bytes a matmul-weight value, less the panel buffer.
# The same property against a C reference, packed and multi-panel weights included:
# test_lora_frozen_ref.c.
set -u
. "$(dirname "$0")/lib_method_cli.sh"
method_begin lora_frozen_dtype
command -v python3 >/dev/null || { echo "no python3: skipped"; exit 77; }
lora="--method lora --lora_rank 4 --lora_alpha 8 --lora_targets c_attn,c_fc --warmup_steps 2"
model="--vocab_size 256 --batch 2 --seq 16 --sample_every 0 --eval_every 0 --quiet 1"

# (a step of full training: its biases are not zero, so the bias path counts)
"$S" train --model gpt2-mini $model --steps 1 --lr 1e-3 --warmup_steps 0 --run_dir "$T/x" --save_hf "$T/X" >"$T/x.out" 2>&1
check '[ -f "$T/X/model.safetensors" ]' "the base X: $(tail -1 "$T/x.out")"

# compare.py X R D: every block matmul weight of R is X's rounded in D, every other tensor X's
cat >"$T/compare.py" <<'EOF'
import json, math, struct, sys
def load(d):
    f = open(d + "/model.safetensors", "rb"); n = struct.unpack("<Q", f.read(8))[0]
    h = json.loads(f.read(n)); b = f.read(); h.pop("__metadata__", None)
    return {k: struct.unpack("<%df" % ((v["data_offsets"][1] - v["data_offsets"][0]) // 4),
                             b[v["data_offsets"][0]:v["data_offsets"][1]]) for k, v in h.items() if v["dtype"] == "F32"}
f32 = lambda x: struct.unpack("<f", struct.pack("<f", x))[0]
def bf16(x):
    u = struct.unpack("<I", struct.pack("<f", x))[0]
    u = (u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000
    return struct.unpack("<f", struct.pack("<I", u))[0]
def int8(xs):
    out = []
    for g in range(0, len(xs), 256):
        grp = xs[g:g + 256]; lo, hi = min(grp), max(grp); s = f32(f32(hi - lo) / 255.0)
        for x in grp:
            q = min(255, max(0, math.floor((x - lo) / s + 0.5))) if s > 0 else 0
            out.append(f32(lo + f32(s * q)))
    return out
X, R, d = load(sys.argv[1]), load(sys.argv[2]), sys.argv[3]
mm = (".attn.c_attn.weight", ".attn.c_proj.weight", ".mlp.c_fc.weight", ".mlp.c_proj.weight")
bad = n_mm = 0
for k, x in X.items():
    want = ([bf16(v) for v in x] if d == "bf16" else int8(list(x))) if k.endswith(mm) else list(x)
    n_mm += k.endswith(mm)
    if list(R[k]) != want: bad += 1; print("differs:", k)
print("tensors %d, matmul weights %d, differing %d" % (len(X), n_mm, bad))
sys.exit(1 if bad or n_mm == 0 else 0)
EOF

for d in bf16 int8; do
  # what is held: the merged model at lr 0 (B = 0)
  "$S" train --init_from "$T/X" $model $lora --frozen_dtype $d --lr 0 --steps 1 --run_dir "$T/h$d" \
    --save_hf "$T/R$d" >"$T/h$d.out" 2>&1
  out=$(python3 "$T/compare.py" "$T/X" "$T/R$d" $d 2>&1)
  rc=$?
  check '[ $rc -eq 0 ]' "$d: the held base is X's matmul weights rounded by the documented scheme: $out"
  # the property: LoRA over X held in d = LoRA fp32 over the rounded base
  "$S" train --init_from "$T/X" $model $lora --lr 1e-2 --frozen_dtype $d --steps 8 --ckpt_every 4 --run_dir "$T/$d" \
    --save_adapter "$T/ad_$d" >"$T/$d.out" 2>&1
  rc=$?
  "$S" train --init_from "$T/R$d" $model $lora --lr 1e-2 --steps 8 --run_dir "$T/ref$d" >"$T/ref$d.out" 2>&1
  a=$(losses "$T/$d"); r=$(losses "$T/ref$d")
  check '[ $rc -eq 0 ] && [ "$(echo $a | wc -w)" = 8 ] && [ "$(echo $r | wc -w)" = 8 ]' "$d runs: $(tail -1 "$T/$d.out")"
  check 'paste <(echo $a | tr " " "\n") <(echo $r | tr " " "\n") | awk "{d = \$1 - \$2; if (d < 0) d = -d; if (d > 1e-5) exit 1}"' \
    "$d: losses over X held in $d ($a) equal fp32's over the rounded base ($r)"
  first=$(echo $a | cut -d" " -f1); last=$(echo $a | awk "{print \$NF}")
  check 'awk "BEGIN{exit !($last < $first)}"' "$d: the loss falls over 8 steps ($a)"
  # resume: 4 + 4
  "$S" train --init_from "$T/X" $model $lora --lr 1e-2 --frozen_dtype $d --steps 8 --ckpt_every 4 --stop_at 4 \
    --run_dir "$T/r$d" >"$T/r$d.1" 2>&1
  "$S" train --resume "$T/r$d" --stop_at 0 --save_adapter "$T/adr_$d" >"$T/r$d.2" 2>&1
  rc=$?
  check '[ $rc -eq 0 ] && [ "$(losses "$T/r$d")" = "$a" ]' "$d resume (rc $rc): losses $(losses "$T/r$d") against $a"
  check 'cmp -s "$T/ad_$d/adapter_model.safetensors" "$T/adr_$d/adapter_model.safetensors"' \
    "$d: the resumed run's adapters are byte-identical to the straight run's"
  other=$([ $d = bf16 ] && echo int8 || echo fp32)
  resume_refused "$T/r$d" frozen_dtype --frozen_dtype $other
done

# the Llama family, int8, every projection; save_hf: the merged weights dense in F32
st_dtype() { python3 -c 'import json,struct,sys; f=open(sys.argv[1],"rb"); n=struct.unpack("<Q",f.read(8))[0]; h=json.loads(f.read(n)); print(h.get(sys.argv[2],{}).get("dtype","none"))' "$1" "$2"; }
"$S" train --model llama-tiny $model --method lora --lora_rank 2 --lora_targets q,k,v,o,gate,up,down --lr 1e-2 \
  --steps 4 --frozen_dtype int8 --save_hf "$T/lhf" --run_dir "$T/l" >"$T/l.out" 2>&1
rc=$?
hf=$(ls "$T"/lhf/*.safetensors 2>/dev/null | head -1)
check '[ $rc -eq 0 ] && [ -n "$hf" ] && [ "$(st_dtype "$hf" model.layers.0.mlp.down_proj.weight)" = F32 ]' \
  "llama-tiny int8 with save_hf (rc $rc): $(tail -1 "$T/l.out")"

# bad input: refused before a run directory exists, naming the key
refused cuda "--model gpt2-tiny $model $lora --steps 2 --frozen_dtype bf16 --device cuda --device_budget 1e9" \
  "key 'frozen_dtype'" "device cuda"
refused full "--model gpt2-tiny $model --steps 2 --frozen_dtype bf16" "key 'frozen_dtype'" "method full"

# strata plan: the frozen class at the held precision (gpt2-mini: 4 layers of 12 C^2 = 786,432
# matmul weights, the largest 65,536 values: a 256 KiB panel)
plan() { "$S" plan --model gpt2-mini $model $lora --frozen_dtype $1 --json 2>/dev/null | jq -r '.memory.classes.frozen_weights.bytes'; }
p32=$(plan fp32); p16=$(plan bf16); p8=$(plan int8)
check '[ "$(awk "BEGIN{print $p32 - $p16}")" = "$(awk "BEGIN{print 2 * 786432 - 262144}")" ]' \
  "plan: frozen fp32 $p32 - bf16 $p16 = 2 x 786432 - the panel 262144"
check '[ "$(awk "BEGIN{print $p32 - $p8}")" = "$(awk "BEGIN{print 3 * 786432 - 8 * 786432 / 256 - 262144}")" ]' \
  "plan: frozen fp32 $p32 - int8 $p8 = (3 - 8/256) x 786432 - the panel 262144"

method_end lora_frozen_dtype
