#!/usr/bin/env bash
# test_lora_cli.sh - strata train --method lora end to end through the strata binary:
#  - a LoRA run over a saved base (--init_from) trains only the adapters, writes
#    --save_adapter's adapter_config.json and adapter_model.safetensors and --save_hf's merged
#    model, and the base directory is untouched;
#  - resume is bit-exact: 8 steps straight and 4 + 4 (--stop_at 4, then --resume) give the same
#    losses and byte-identical adapters;
#  - a resume with another method or lora_rank is refused, its config.json untouched;
#  - the Llama family trains too (llama-tiny with every projection);
#  - bad input refused before a run directory exists, naming the key (and the tensor): a rank
#    above a projection's smaller dimension, a target the model lacks, an unknown method,
#    layer streaming with lora and the disk state, save_adapter without lora (the disk state and ranks:
#    test_lora_dist.sh).
#  - strata bench lora --json prints the state bytes per parameter by class.
# The adapter loading in Hugging Face PEFT is test_lora_peft.sh.
set -u
. "$(dirname "$0")/lib_method_cli.sh"
method_begin lora
lora="--method lora --lora_rank 4 --lora_alpha 8 --lora_targets c_attn,c_proj,c_fc --lr 1e-2 --warmup_steps 2"

"$S" train --model gpt2-tiny $tiny --steps 3 --run_dir "$T/base" --save_hf "$T/base_hf" >"$T/base.out" 2>&1
check '[ -f "$T/base_hf/model.safetensors" ]' "the base model directory: $(tail -2 "$T/base.out")"
sum_base=$(md5sum <"$T/base_hf/model.safetensors")

# --- a LoRA run, straight
"$S" train --init_from "$T/base_hf" $tiny $lora --steps 8 --ckpt_every 4 --run_dir "$T/a" --save_adapter "$T/ad_a" \
  --save_hf "$T/merged_a" >"$T/a.out" 2>&1
rc=$?
check '[ $rc -eq 0 ] && [ -f "$T/ad_a/adapter_config.json" ] && [ -f "$T/ad_a/adapter_model.safetensors" ]' \
  "lora run writes the adapter directory: $(tail -2 "$T/a.out")"
check '[ -f "$T/merged_a/model.safetensors" ]' "lora run writes the merged model (--save_hf)"
check '[ "$(md5sum <"$T/base_hf/model.safetensors")" = "$sum_base" ]' "the base directory is untouched"
check 'jq -e ".r == 4 and .lora_alpha == 8 and .peft_type == \"LORA\" and .fan_in_fan_out == true and (.target_modules | sort) == [\"c_attn\",\"c_fc\",\"c_proj\"]" "$T/ad_a/adapter_config.json" >/dev/null' \
  "adapter_config.json: r, lora_alpha, targets, fan_in_fan_out"
n_steps=$(jq -r .step "$T/a/metrics.jsonl" | wc -l)
check '[ "$n_steps" = 8 ]' "8 steps logged (got $n_steps)"
a_losses=$(losses "$T/a")
first=$(echo $a_losses | cut -d" " -f1); last=$(echo $a_losses | awk "{print \$NF}")
check 'awk "BEGIN{exit !($last < $first)}"' "the loss falls over 8 lora steps ($a_losses)"

# --- resume: 4 + 4
"$S" train --init_from "$T/base_hf" $tiny $lora --steps 8 --ckpt_every 4 --stop_at 4 --run_dir "$T/b" >"$T/b1.out" 2>&1
"$S" train --resume "$T/b" --stop_at 0 --save_adapter "$T/ad_b" >"$T/b2.out" 2>&1
rc=$?
check '[ $rc -eq 0 ]' "lora resume runs: $(tail -2 "$T/b2.out")"
check '[ "$(losses "$T/b")" = "$a_losses" ]' "resumed losses ($(losses "$T/b")) equal the straight run's ($a_losses)"
check 'cmp -s "$T/ad_a/adapter_model.safetensors" "$T/ad_b/adapter_model.safetensors"' \
  "the resumed run's adapters are byte-identical to the straight run's"

# a resume with another method or rank is refused before anything is written
resume_refused "$T/b" method --method full
resume_refused "$T/b" lora_rank --lora_rank 2

# --- the Llama family
"$S" train --model llama-tiny $tiny --method lora --lora_rank 2 --lora_targets q,k,v,o,gate,up,down --steps 3 \
  --run_dir "$T/l" --save_adapter "$T/ad_l" >"$T/l.out" 2>&1
rc=$?
check '[ $rc -eq 0 ] && jq -e "(.target_modules | length) == 7 and .fan_in_fan_out == false" "$T/ad_l/adapter_config.json" >/dev/null' \
  "llama-tiny lora run with all seven projections: $(tail -2 "$T/l.out")"

# --- bad input: refused before a run directory exists
refused rank "--init_from $T/base_hf $tiny --method lora --lora_rank 33" "lora_rank" "transformer.h.0.attn.c_attn.weight"
refused target "--init_from $T/base_hf $tiny --method lora --lora_targets c_attn,q_proj" "lora_targets" "'q_proj'"
refused llama_target "--model llama-tiny $tiny --method lora --lora_targets c_fc" "lora_targets" "'c_fc'"
refused method "--model gpt2-tiny $tiny --method poet" "key 'method'" "'poet'"
refused stream "--model gpt2-tiny $tiny --method lora --device_budget 1e9 --device cuda" "key 'device'" "method lora"
refused adapter "--model gpt2-tiny $tiny --save_adapter $T/x" "key 'save_adapter'" "method lora"

# --- strata bench lora --json: one object, the state per parameter by class
"$S" bench lora --model gpt2-tiny --batch 2 --seq 16 --rank 4 --steps 2 --json >"$T/bench.json" 2>"$T/bench.err"
check 'jq -e ".full_bytes_per_param == 16 and .frozen_bytes_per_param == 4 and .adapter_bytes_per_param == 16 and .adapter_params == 4096 and .lora_bytes_per_base_param < 16 and .lora_step_s > 0 and .full_step_s > 0" "$T/bench.json" >/dev/null' \
  "bench lora --json: $(cat "$T/bench.json" "$T/bench.err" | head -c 400)"
# QLoRA-like: the base's block matmul weights held in int8. gpt2-tiny counted by hand: 28032
# parameters, 24576 of them the blocks' matmul weights (2 x 12 x 32^2); int8 holds each weight
# with an fp32 scale and zero per 256 values (25344 bytes), bf16 2 bytes a value, and either's
# dequantising panel is the largest weight's fp32 bytes (4 x 4096); the rest stays fp32
"$S" bench lora --model gpt2-tiny --batch 2 --seq 16 --rank 4 --steps 2 --frozen_dtype int8 --json >"$T/bench8.json" 2>"$T/bench8.err"
check 'jq -e ".frozen_dtype == \"int8\" and (.frozen_bytes_per_param - (3456 * 4 + 25344 + 16384) / 28032 | fabs) < 1e-5 and (.frozen_bytes_per_param_by_frozen_dtype.bf16 - (3456 * 4 + 49152 + 16384) / 28032 | fabs) < 1e-5 and .frozen_bytes_per_param_by_frozen_dtype.fp32 == 4 and .lora_step_s > 0" "$T/bench8.json" >/dev/null' \
  "bench lora --frozen_dtype int8 --json: $(cat "$T/bench8.json" "$T/bench8.err" | head -c 400)"
rc16=0
"$S" bench lora --model gpt2-tiny --frozen_dtype fp16 >"$T/bench16.out" 2>&1 || rc16=$?
check '[ "$rc16" -eq 2 ] && grep -q "frozen_dtype fp16 is not fp32, bf16 or int8" "$T/bench16.out"' \
  "bench lora --frozen_dtype fp16 refused: $(head -c 300 "$T/bench16.out")"

method_end lora_cli
