#!/usr/bin/env bash
# test_lora_init_adapter.sh - strata train --method lora continuing from a saved PEFT adapter:
#  - --init_from ADAPTER_DIR (what --save_adapter wrote) takes the adapter's base
#    (base_model_name_or_path) as the base and the adapter's A and B as the start: a run of one
#    step at learning rate 0 saves byte-identical adapters and logs the saved run's final
#    validation loss exactly; config.json records the base as init_from and the adapter as
#    init_adapter, and such a run resumes bit for bit (2 + 2 against 4 straight);
#  - --init_from BASE --init_adapter ADAPTER does the same; a run with a learning rate trains
#    on from the adapter (its first loss is the adapted model's, below the base's);
#  - refused before a run directory exists, naming the key: another lora_rank, lora_alpha or
#    lora_targets than the adapter's, an adapter over a model of another width (naming the
#    tensor), init_adapter without method lora, an adapter whose base is a preset.
set -u
S=${STRATA_BIN:?}
command -v jq >/dev/null || { echo "no jq: skipped"; exit 77; }
T=$(mktemp -d /tmp/strata-lora-init-XXXXXX)
fail=0; checks=0
check() { checks=$((checks+1)); if ! eval "$1"; then echo "FAIL: $2"; fail=$((fail+1)); fi; }
tiny="--vocab_size 256 --batch 2 --seq 16 --sample_every 0 --eval_every 3 --eval_tokens 256 --quiet 1"
lora="--method lora --lora_rank 4 --lora_alpha 8 --lora_targets c_attn,c_proj,c_fc"
losses() { jq -r .loss "$1/metrics.jsonl" | tr '\n' ' '; }
val() { jq -r 'select(.val_loss != null) | .val_loss' "$1/metrics.jsonl" | tail -1; }
cd "$T" || exit 1 # the adapters name their base by the path given: relative here

"$S" train --model gpt2-tiny $tiny --steps 3 --run_dir base --save_hf base_hf >base.out 2>&1
check '[ -f base_hf/model.safetensors ]' "the base model directory: $(tail -2 base.out)"

# --- three LoRA steps, the adapter saved
"$S" train --init_from base_hf $tiny $lora --lr 1e-2 --warmup_steps 1 --steps 3 --run_dir a --save_adapter ad_a \
  >a.out 2>&1
check '[ -f ad_a/adapter_model.safetensors ] && [ "$(jq -r .base_model_name_or_path ad_a/adapter_config.json)" = base_hf ]' \
  "the adapter directory names its base: $(tail -2 a.out)"
val_a=$(val a)

# --- init_from the adapter, learning rate 0: the adapters unchanged, the same validation loss
"$S" train --init_from ad_a $tiny $lora --lr 0 --steps 1 --eval_every 1 --run_dir b --save_adapter ad_b >b.out 2>&1
rc=$?
check '[ $rc -eq 0 ] && cmp -s ad_a/adapter_model.safetensors ad_b/adapter_model.safetensors' \
  "init_from ADAPTER, lr 0: the saved adapters are byte-identical to the loaded ones (rc $rc): $(tail -2 b.out)"
check '[ -n "$val_a" ] && [ "$(val b)" = "$val_a" ]' "the loaded adapter's validation loss ($(val b)) is the saved run's ($val_a)"
check 'jq -e ".init_from == \"base_hf\" and .init_adapter == \"ad_a\"" b/config.json >/dev/null' \
  "config.json records the base as init_from and the adapter as init_adapter"

# --- init_from BASE --init_adapter ADAPTER, trained on: starts from the adapted model
"$S" train --init_from base_hf --init_adapter ad_a $tiny $lora --lr 0 --steps 1 --eval_every 1 --run_dir c \
  --save_adapter ad_c >c.out 2>&1
check 'cmp -s ad_a/adapter_model.safetensors ad_c/adapter_model.safetensors && [ "$(val c)" = "$val_a" ]' \
  "init_adapter ADAPTER, lr 0: the same adapters and validation loss: $(tail -2 c.out)"
"$S" train --init_from base_hf $tiny $lora --lr 0 --steps 1 --eval_every 1 --run_dir z >z.out 2>&1
check 'awk "BEGIN{exit !($(val c) < $(val z))}"' \
  "the adapter's validation loss ($(val c)) is below the fresh adapters' (the base's, $(val z))"

# --- continuing trains, and resumes bit for bit
cont="--init_from ad_a $tiny $lora --lr 1e-2 --warmup_steps 1 --steps 4 --ckpt_every 2"
"$S" train $cont --run_dir d --save_adapter ad_d >d.out 2>&1
"$S" train $cont --stop_at 2 --run_dir e >e1.out 2>&1
"$S" train --resume e --stop_at 0 --save_adapter ad_e >e2.out 2>&1
rc=$?
check '[ $rc -eq 0 ] && [ "$(losses d)" = "$(losses e)" ] && cmp -s ad_d/adapter_model.safetensors ad_e/adapter_model.safetensors' \
  "a run from the adapter resumed at 2 ($(losses e)) equals 4 straight ($(losses d)), adapters byte-identical: $(tail -1 e2.out)"
check '! cmp -s ad_a/adapter_model.safetensors ad_d/adapter_model.safetensors' "continuing changes the adapters"

# --- refusals, before a run directory exists
"$S" train --model gpt2-tiny --n_embd 64 $tiny --steps 1 --run_dir wide --save_hf wide_hf >wide.out 2>&1
refused() { # $1 name, $2 args, $3 $4 strings the message must hold
  local name=$1 w1=$3 w2=$4 rc
  "$S" train $2 --run_dir "bad_$name" >"bad_$name.out" 2>&1
  rc=$?
  check '[ $rc -ne 0 ] && grep -q -- "$w1" "bad_$name.out" && grep -q -- "$w2" "bad_$name.out" && [ ! -e "bad_$name" ]' \
    "$name: refused naming '$w1' and '$w2', no run directory (rc $rc): $(tail -1 "bad_$name.out")"
}
refused rank "--init_from ad_a $tiny --method lora --lora_rank 2 --lora_alpha 8 --lora_targets c_attn,c_proj,c_fc" \
  "key 'lora_rank'" "--lora_rank 4"
refused alpha "--init_from ad_a $tiny --method lora --lora_rank 4 --lora_alpha 4 --lora_targets c_attn,c_proj,c_fc" \
  "key 'lora_alpha'" "--lora_alpha 8"
refused targets "--init_from ad_a $tiny --method lora --lora_rank 4 --lora_alpha 8 --lora_targets c_attn" \
  "key 'lora_targets'" "c_attn,c_proj,c_fc"
refused width "--init_from wide_hf --init_adapter ad_a $tiny $lora" "adapter_model.safetensors" \
  "transformer.h.0.attn.c_attn.lora_A.weight"
refused nolora "--init_from base_hf --init_adapter ad_a $tiny" "key 'init_adapter'" "method lora"
"$S" train --model gpt2-tiny $tiny $lora --steps 1 --run_dir p --save_adapter ad_p >p.out 2>&1
refused preset "--init_from ad_p $tiny $lora" "preset gpt2-tiny" "--init_adapter"

echo "$checks checks, $fail failed"
[ $fail -eq 0 ] && rm -rf "$T"
[ $fail -eq 0 ]
