#!/usr/bin/env bash
# test_lora_peft.sh - the adapter strata train --method lora --save_adapter writes loads in
# Hugging Face PEFT and gives strata's loss: PEFT's loss (the adapter over the base directory)
# on a seeded batch equals, within 1e-5 relative, the loss of the merged model strata wrote
# with --save_hf (whose loss equals strata's own LoRA forward: test_lora_fixture.c), and differs
# from the base's (tools/gen_lora_fixtures.py --check-adapter). GPT-2 (Conv1D, fan_in_fan_out)
# and the Llama family. The adapter PEFT writes again (save_pretrained: its own
# adapter_config.json) continues in strata (--init_adapter): a step at learning rate 0 saves
# adapters byte-identical to strata's first ones. Skips (77) without /usr/bin/python3 with torch, transformers and peft.
set -u
S=${STRATA_BIN:?}
SRC=${STRATA_SOURCE_DIR:?}
PY=/usr/bin/python3
if ! "$PY" -c "import torch, transformers, peft" >/dev/null 2>&1; then
  echo "skipped: $PY lacks torch, transformers or peft (apt-get install python3-torch; pip install transformers==4.46.3 accelerate==1.0.1 peft==0.13.2 --no-deps: a newer peft pulls a torch that transformers 4.46 does not run)"
  exit 77
fi
T=$(mktemp -d /tmp/strata-lora-peft-XXXXXX)
fail=0; checks=0
check() { checks=$((checks+1)); if ! eval "$1"; then echo "FAIL: $2"; fail=$((fail+1)); fi; }
tiny="--vocab_size 256 --batch 2 --seq 16 --sample_every 0 --eval_every 0 --quiet 1"

for fam in gpt2 llama; do
  if [ $fam = gpt2 ]; then targets=c_attn,c_proj,c_fc; else targets=q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj; fi
  "$S" train --model $fam-tiny $tiny --steps 3 --run_dir "$T/base_$fam" --save_hf "$T/base_hf_$fam" >"$T/base_$fam.out" 2>&1
  "$S" train --init_from "$T/base_hf_$fam" $tiny --method lora --lora_rank 4 --lora_alpha 8 --lora_targets $targets \
    --lr 2e-2 --steps 6 --run_dir "$T/lora_$fam" --save_adapter "$T/ad_$fam" --save_hf "$T/merged_$fam" \
    >"$T/lora_$fam.out" 2>&1
  check '[ -f "$T/ad_$fam/adapter_model.safetensors" ]' "$fam: strata wrote the adapter: $(tail -2 "$T/lora_$fam.out")"
  "$PY" "$SRC/tools/gen_lora_fixtures.py" --check-adapter "$T/ad_$fam" "$T/base_hf_$fam" "$T/merged_$fam" \
    "$T/peft_$fam" >"$T/check_$fam.out" 2>&1
  rc=$?
  check '[ $rc -eq 0 ]' "$fam: PEFT loads strata's adapter with strata's loss: $(grep -E "loss|Error" "$T/check_$fam.out" | tail -2)"
  grep "peft-loss" "$T/check_$fam.out"
  "$S" train --init_from "$T/base_hf_$fam" --init_adapter "$T/peft_$fam" $tiny --method lora --lora_rank 4 \
    --lora_alpha 8 --lora_targets $targets --lr 0 --steps 1 --run_dir "$T/cont_$fam" --save_adapter "$T/ad2_$fam" \
    >"$T/cont_$fam.out" 2>&1
  check 'cmp -s "$T/ad_$fam/adapter_model.safetensors" "$T/ad2_$fam/adapter_model.safetensors"' \
    "$fam: strata continues from PEFT's save_pretrained of its adapter, unchanged at lr 0: $(tail -1 "$T/cont_$fam.out")"
done

rm -rf "$T"
echo "lora_peft: $checks checks, $((checks-fail)) passed, $fail failed"
[ $fail -eq 0 ]
