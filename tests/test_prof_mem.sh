#!/usr/bin/env bash
# test_prof_mem.sh - the memory estimate against the measured peak: `strata plan` predicts
# the host bytes of a run before anything is allocated; `strata train` then measures its
# own VmHWM each step (metrics.jsonl host_peak_bytes). They must agree within 10% for an
# activation-heavy run, a weight-heavy run, the same with 8-bit optimizer state, and LoRA over
# an int8 base, whose start (the base built, no gradient vector) is its peak, drawn from the seed
# and loaded from a Hugging Face directory (init_from), each block weight held as it is drawn or
# read, and POET-X over an int8 base drawn from the seed. With
# checkpoints every step, the last step's peak includes the checkpoint's staging buffer,
# which the estimate counts. Then the refusal: a run whose plan does not fit its host
# budget is refused before anything is written, naming the tier and the bytes missing.
set -u
S=${STRATA_BIN:?}
T=$(mktemp -d /tmp/strata-mem-XXXXXX)
fail=0; checks=0
check() { checks=$((checks+1)); if ! eval "$1"; then echo "FAIL: $2"; fail=$((fail+1)); fi; }
command -v jq >/dev/null || { echo "no jq: skipped"; exit 77; }

run_case() { # name, then train keys
  local name=$1; shift
  local est measured
  est=$("$S" plan "$@" | awk '$1=="host" && $2 ~ /^[0-9]+$/ {print $2}')
  "$S" train "$@" --steps 3 --ckpt_every 1 --quiet 1 --run_dir "$T/$name" >"$T/$name.txt" 2>&1
  check '[ $? -eq 0 ]' "$name: run succeeds"
  measured=$(tail -n 1 "$T/$name/metrics.jsonl" | jq .host_peak_bytes)
  local ratio
  ratio=$(awk -v e="$est" -v m="$measured" 'BEGIN { printf "%.4f", e / m }')
  echo "  $name: estimate $est bytes, measured peak $measured bytes, ratio $ratio"
  check 'awk -v r="$ratio" "BEGIN { exit !(r >= 0.9 && r <= 1.1) }"' "$name: estimate within 10% of the measured peak (ratio $ratio)"
}

run_case acts  --model gpt2-mini --batch 32 --seq 256
run_case weights --model gpt2-mini --n_embd 512 --n_head 8 --batch 2 --seq 64
run_case weights8 --model gpt2-mini --n_embd 512 --n_head 8 --batch 2 --seq 64 --optim_state 8bit
# a method over frozen weights whose start is its peak: LoRA over an int8 base, the base built
# without a gradient vector, the adapters and the int8 store made first, then the base drawn a
# tensor at a time into its vector (pages taken as written), each block matmul weight rounded into
# the store and its fp32 pages given back before the next is drawn: the base is never whole in
# fp32. Drawing the base whole first (4 bytes a base parameter) measured 221 MB against this
# estimate's 126 MB and failed the ratio (0.57).
run_case lora_int8 --model gpt2-mini --n_embd 1024 --n_head 16 --batch 2 --seq 64 --method lora --frozen_dtype int8
# the same for POET-X over an int8 base from the seed (batch 1 x seq 16: its start is its peak), each
# W0 drawn and made orthogonal a batch (a QR for each of the 2 threads) at a time, then rounded
# into the store and its fp32 pages given back; drawn whole first it measured 301 MB against this
# estimate's 200 MB and failed the ratio (0.66)
run_case poetx_int8 --model gpt2-mini --n_embd 1024 --n_head 16 --batch 1 --seq 16 --threads 2 --method poetx --frozen_dtype int8
# the same base from a Hugging Face directory (init_from): the adapters and the int8 store made
# first, then the loader reads each tensor straight into the base's vector (its pages taken as
# written), gives its file's pages back, and rounds each block matmul weight into the store and
# gives its fp32 pages back before the next is read: the base is never whole in fp32 (the fp32
# of the rest, the store, one tensor and its file's pages). Rounding after the whole load (the
# base whole in fp32 first) measured 233 MB against this estimate's 126 MB and failed the ratio.
"$S" train --model gpt2-mini --n_embd 1024 --n_head 16 --batch 2 --seq 64 --steps 1 --quiet 1 --run_dir "$T/mk_hf" \
  --save_hf "$T/hf" >"$T/mk_hf.txt" 2>&1
check '[ $? -eq 0 ]' "a Hugging Face directory of the base is written"
run_case lora_int8_init_from --init_from "$T/hf" --batch 2 --seq 64 --method lora --frozen_dtype int8

# the plan's table has every class
"$S" plan --model gpt2-124m --batch 8 --seq 1024 >"$T/plan.txt"
check '[ $? -eq 0 ]' "plan of gpt2-124m exits 0 (fits in this machine's memory)"
for cls in "weights (fp32)" "gradients (fp32)" "master copy" "moments, fp32" "moments, 8-bit" "activations, all stored" "activations, checkpointed"; do
  check 'grep -qF "$cls" "$T/plan.txt"' "plan lists '$cls'"
done
check 'grep -q "^parameters: 124439808$" "$T/plan.txt"' "gpt2-124m has 124,439,808 parameters (Hugging Face's count, with wpe)"

# refusal: 64 MB of host budget for a run that needs about 350 MB
"$S" plan --model gpt2-mini --batch 32 --seq 256 --host_budget 64MB >"$T/plan_small.txt"; rc=$?
check '[ $rc -eq 3 ] && grep -q "DOES NOT FIT" "$T/plan_small.txt"' "plan says it does not fit (exit 3)"
"$S" train --model gpt2-mini --batch 32 --seq 256 --steps 2 --host_budget 64000000 --run_dir "$T/refused" >"$T/refused.txt" 2>&1; rc=$?
check '[ $rc -ne 0 ]' "train refuses the run"
check 'grep -q "host needs [0-9]* bytes" "$T/refused.txt" && grep -q "missing" "$T/refused.txt"' "the refusal names the tier and the bytes missing"
need=$(awk '$1=="host" && $2 ~ /^[0-9]+$/ {print $2}' "$T/plan_small.txt")
check 'grep -q "$((need - 64000000)) bytes" "$T/refused.txt"' "missing = plan's need $need - 64000000"
check '[ ! -e "$T/refused/metrics.jsonl" ]' "nothing was trained"

echo "prof_mem: $checks checks, $((checks-fail)) passed, $fail failed"
[ $fail -eq 0 ] && rm -rf "$T"
[ $fail -eq 0 ]
