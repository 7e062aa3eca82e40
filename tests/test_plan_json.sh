#!/usr/bin/env bash
# test_plan_json.sh - strata plan --json prints the memory account ("memory"): each class's
# bytes and tier, each tier's need, budget and fit. Checked against the text table strata
# plan prints for the same configuration (the same bytes, class by class), against its own
# arithmetic (in memory, the classes held in host memory add up to the host tier's need),
# for a method over frozen weights (bytes per base parameter, as the text says), for a
# host budget too small (exit 3, "fits": false, the tier named), beside the device plan
# with --device_budget (one document, which -o writes and strata train --plan reads), whose
# device tier is then the plan's device bytes (a plan may fit under the smallest plan's tables).
set -u
S=${STRATA_BIN:?STRATA_BIN not set}
command -v jq >/dev/null || { echo "jq not installed: skipped"; exit 77; }
T=$(mktemp -d /tmp/strata-test-plan-json-XXXXXX)
fail=0
check() { if ! eval "$1"; then echo "FAIL: $2"; fail=1; fi; }

A="--model gpt2-mini --batch 2 --seq 32"
"$S" plan $A --json >"$T/p.json" 2>"$T/p.err"; rc=$?
check '[ $rc -eq 0 ] && jq -e .memory "$T/p.json" >/dev/null' "plan --json: rc $rc $(head -c 300 "$T/p.json") $(cat "$T/p.err")"
"$S" plan $A >"$T/p.txt" 2>&1
# the text table's bytes, class by class (the number after the label)
txt() { grep -F "  $1 " "$T/p.txt" | head -1 | sed "s/^ *$1 *\([0-9]*\) .*/\1/"; }
for pair in "weights (fp32)|weights" "gradients (fp32)|grads" "moments, fp32 (m, v)|moments_f32" \
            "moments, 8-bit blockwise (m, v)|moments_8bit" "activations, all stored|activations" \
            "runtime (code, BLAS, data)|runtime"; do
  label=${pair%%|*} key=${pair#*|}
  t=$(txt "$label")
  j=$(jq -r ".memory.classes.$key.bytes | floor" "$T/p.json")
  check '[ -n "$t" ] && [ "$t" = "$j" ]' "class $key: text $t, JSON $j"
done
host_need=$(jq -r '.memory.tiers.host.need | floor' "$T/p.json")
host_txt=$(grep -E '^  host ' "$T/p.txt" | awk '{print $2}')
check '[ "$host_need" = "$host_txt" ]' "host need: JSON $host_need, text $host_txt"
sum=$(jq -r '[.memory.classes[] | select(.tier == "host") | .bytes] | add | floor' "$T/p.json")
check '[ "$sum" = "$host_need" ]' "the host classes add up to $sum, the host tier needs $host_need"
check '[ "$(jq -r .memory.classes.moments_8bit.tier "$T/p.json")" = "-" ] && [ "$(jq -r .memory.optim_state "$T/p.json")" = f32 ]' \
  "the unused 8-bit moments are marked '-'"
check '[ "$(jq -r .memory.fits "$T/p.json")" = true ] && [ "$(jq -r .memory.tiers.host.fits "$T/p.json")" = true ]' "fits"
"$S" plan $A --optim_state 8bit --json >"$T/q.json" 2>/dev/null
check '[ "$(jq -r .memory.classes.moments_8bit.tier "$T/q.json")" = host ] && [ "$(jq -r .memory.classes.moments_f32.tier "$T/q.json")" = "-" ]' \
  "optim_state 8bit: the 8-bit moments in host memory"

# a host budget too small: exit 3, the host tier does not fit
"$S" plan $A --host_budget 20MiB --json >"$T/s.json" 2>/dev/null; rc=$?
check '[ $rc -eq 3 ] && [ "$(jq -r .memory.fits "$T/s.json")" = false ] && [ "$(jq -r .memory.tiers.host.fits "$T/s.json")" = false ] && [ "$(jq -r ".memory.tiers.host.budget | floor" "$T/s.json")" = 20971520 ]' \
  "host_budget 20MiB: rc $rc $(jq -c .memory.tiers "$T/s.json" 2>&1 | head -c 300)"

# a method over frozen weights: bytes per base parameter, as the text prints it
"$S" plan $A --method lora --json >"$T/l.json" 2>/dev/null
"$S" plan $A --method lora >"$T/l.txt" 2>&1
bpp=$(jq -r '.memory.bytes_per_base_param * 1000 | round' "$T/l.json")
tb=$(sed -n 's/.*frozen: \([0-9.]*\) bytes of training state per base parameter.*/\1/p' "$T/l.txt")
check '[ -n "$tb" ] && [ "$bpp" = "$(awk -v x="$tb" "BEGIN { printf \"%d\", x * 1000 + 0.5 }")" ] && [ "$(jq -r .memory.classes.frozen_weights.tier "$T/l.json")" = host ]' \
  "lora: bytes per base parameter JSON $bpp/1000, text $tb"

# with a device budget: one document, the device plan and the account; -o writes it and train reads it
if "$S" plan $A --device_budget 6e6 --json -o "$T/plan.json" >"$T/d.json" 2>"$T/d.err"; then
  check 'jq -e ".blocks and .memory.tiers.device" "$T/d.json" >/dev/null && cmp -s "$T/d.json" "$T/plan.json"' \
    "device plan + memory in one document, written by -o: $(head -c 300 "$T/d.json")"
  check '[ "$(jq -r .memory.classes.activations.tier "$T/d.json")" = device ]' "streamed: activations on the device tier"
  "$S" train $A --steps 2 --eval_every 0 --sample_every 0 --quiet 1 --plan "$T/plan.json" --run_dir "$T/run" >"$T/t.out" 2>&1
  rc=$?
  check '[ $rc -eq 0 ]' "train --plan with the account in the file: rc $rc $(tail -2 "$T/t.out")"
  # a device budget under the smallest plan's tables (every block recomputed, the head resident:
  # 69 MB at vocabulary 50257) that a plan chunking the vocabulary fits: the device tier is the
  # plan's, it fits, exit 0 (the tables' figure once judged it and strata plan said "does not fit")
  V="$A --vocab_size 50257 --device_budget 2e7"
  "$S" plan $V --json >"$T/v.json" 2>"$T/v.err"; rc=$?
  check '[ $rc -eq 0 ] && jq -e ".fits and .vocab_chunk > 0 and .memory.fits and .memory.tiers.device.fits and .memory.tiers.device.of_plan and
         .memory.tiers.device.need == .device_bytes and .memory.classes.activations.bytes > 2e7" "$T/v.json" >/dev/null' \
    "a plan under the tables' bytes: rc $rc $(jq -c "[.fits, .device_bytes, .vocab_chunk, .memory.tiers.device, .memory.classes.activations.bytes]" "$T/v.json")"
  "$S" plan $V >"$T/v.txt" 2>&1; rc=$?
  check '[ $rc -eq 0 ] && grep -qE "^  device .*: fits \(the device plan below\)$" "$T/v.txt" && ! grep -q "does not fit" "$T/v.txt"' \
    "the text: rc $rc $(grep -E "^  device|fit" "$T/v.txt")"
  # a frozen base: the same profile, the block's forward the same; LoRA's backward less the
  # matmul weights' gradients (at most half of it), POET-X's as measured (its rotations cost
  # about what the gradients would), as strata train predicts them
  "$S" plan $A --device_budget 6e6 --save_profile "$T/prof.json" --json >"$T/f.json" 2>/dev/null
  "$S" plan $A --device_budget 6e6 --profile "$T/prof.json" --method lora --json >"$T/fl.json" 2>/dev/null
  "$S" plan $A --device_budget 6e6 --profile "$T/prof.json" --method poetx --json >"$T/fp.json" 2>/dev/null
  fb=$(jq -r .predicted.block_backward_s "$T/f.json"); ff=$(jq -r .predicted.block_forward_s "$T/f.json")
  check 'jq -e --argjson b "$fb" --argjson f "$ff" ".predicted.block_forward_s == \$f and .predicted.block_backward_s < \$b and
         .predicted.block_backward_s >= 0.5 * \$b" "$T/fl.json" >/dev/null' \
    "lora: the block backward is full's ($fb s) less its weight gradients: $(jq -c .predicted "$T/fl.json")"
  # LoRA updates only its adapters: no optimizer over the blocks or the ends exposed
  check 'jq -e ".predicted.optim_exposed_s == 0" "$T/fl.json" >/dev/null && jq -e ".predicted.optim_exposed_s > 0" "$T/f.json" >/dev/null' \
    "lora: no optimizer exposed (full's $(jq .predicted.optim_exposed_s "$T/f.json")): $(jq -c .predicted "$T/fl.json")"
  check 'jq -e --argjson b "$fb" --argjson f "$ff" ".predicted.block_forward_s == \$f and .predicted.block_backward_s == \$b" \
         "$T/fp.json" >/dev/null' "poetx: the block backward is full's ($fb s): $(jq -c .predicted "$T/fp.json")"
elif grep -q GLPK "$T/d.json" "$T/d.err"; then
  echo "built without GLPK: the device plan part skipped"
else
  check 'false' "plan --device_budget --json failed: $(cat "$T/d.err")"
fi

[ $fail -eq 0 ] && rm -rf "$T" && echo "plan_json: ok" && exit 0
echo "plan_json: FAILED (kept $T)"; exit 1
