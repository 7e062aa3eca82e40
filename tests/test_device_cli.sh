#!/usr/bin/env bash
# test_device_cli.sh - the device a run computes on (strata train's key 'device', strata
# bench stream --device; st_backend_device_create): a name that is not cpu, cuda or cuda:N
# is refused at parse time (exit 2) naming the key and the accepted forms, from the command
# line and from a --config file; cuda without device_budget is refused naming device_budget;
# and in a strata built without the CUDA backend, cuda is refused (exit 1) saying so and how
# to build it (-DSTRATA_CUDA=ON), before the run directory is made (no config.json). In a
# build with the CUDA backend (CMakeCache STRATA_CUDA ON) the cuda run is either refused for
# want of a device or runs: no GPU is needed here. bench stream --json reports the device's
# peak (st_backend_memory) within its budget. Nothing trains long: a few seconds.
set -u
S=${STRATA_BIN:?STRATA_BIN not set}
T=$(mktemp -d /tmp/strata-test-device-cli-XXXXXX)
fail=0
check() { if ! eval "$1"; then echo "FAIL: $2"; fail=1; fi; }
A="--model gpt2-tiny --n_embd 128 --n_layer 4 --vocab_size 256 --max_seq 32 --batch 2 --seq 32"
R="--steps 1 --eval_every 0 --sample_every 0 --quiet 1"
FORMS="give cpu, cuda or cuda:N"

# a bad name: refused before anything runs, naming the key, the value and the forms
"$S" train $A $R --device banana --run_dir "$T/banana" >"$T/banana.out" 2>&1; rc=$?
check '[ $rc -eq 2 ] && grep -q "key '"'"'device'"'"'" "$T/banana.out" && grep -q "banana" "$T/banana.out" &&
       grep -q "$FORMS" "$T/banana.out" && [ ! -e "$T/banana" ]' "device banana is refused naming the key (rc $rc): $(cat "$T/banana.out")"
for bad in cuda: cuda:-1 cuda:1x cuda:99999 CUDA gpu; do
    "$S" train $A $R --device "$bad" --run_dir "$T/bad" >"$T/bad.out" 2>&1; rc=$?
    check '[ $rc -eq 2 ] && grep -q "key '"'"'device'"'"'" "$T/bad.out" && grep -q "$FORMS" "$T/bad.out"' \
      "device '$bad' is refused naming the key (rc $rc): $(cat "$T/bad.out")"
done
printf '{"device": "banana", "steps": 1, "run_dir": "%s"}\n' "$T/json" >"$T/bad.json"
"$S" train --config "$T/bad.json" >"$T/json.out" 2>&1; rc=$?
check '[ $rc -eq 2 ] && grep -q "$T/bad.json" "$T/json.out" && grep -q "key '"'"'device'"'"'" "$T/json.out" &&
       grep -q "$FORMS" "$T/json.out"' "a config file's device banana is refused naming the file and key (rc $rc): $(cat "$T/json.out")"
"$S" bench stream --device banana --steps 1 >"$T/bench.out" 2>&1; rc=$?
check '[ $rc -eq 2 ] && grep -q -- "--device" "$T/bench.out" && grep -q "$FORMS" "$T/bench.out"' \
  "bench stream --device banana is refused (rc $rc): $(cat "$T/bench.out")"

# bench stream's device peak: the device's own figure (st_backend_memory), on the cpu device
# the arena's high-water mark, above 0 and within the budget
"$S" bench stream --model gpt2-tiny --seq 16 --steps 1 --device-budget 4e6 --json >"$T/peak.json" 2>"$T/peak.err"; rc=$?
peak=$(sed -n 's/.*"device_peak_bytes":\([0-9]*\).*/\1/p' "$T/peak.json")
bud=$(sed -n 's/.*"device_budget_bytes":\([0-9]*\).*/\1/p' "$T/peak.json")
check '[ $rc -eq 0 ] && [ "${peak:-0}" -gt 0 ] && [ "${bud:-0}" -eq 4000000 ] && [ "$peak" -le "$bud" ]' \
  "bench stream reports the device's peak within its budget (rc $rc, peak '$peak', budget '$bud'): $(cat "$T/peak.err")"

# key 'matmul': fp32, tf32, bf16 or auto; tf32 is device cuda's tensor cores, refused on the
# CPU (with or without a budget) before the run directory is made; bf16 runs on the CPU
# through oneDNN, or, in a build without it, is refused naming the key and the package
"$S" train $A $R --matmul banana --run_dir "$T/mm" >"$T/mm.out" 2>&1; rc=$?
check '[ $rc -ne 0 ] && grep -q "key .matmul.: .banana. is not fp32, tf32, bf16 or auto" "$T/mm.out" && [ ! -e "$T/mm" ]' \
  "matmul banana is refused naming the key (rc $rc): $(cat "$T/mm.out")"
"$S" train $A $R --matmul tf32 --device_budget 6e6 --run_dir "$T/mm" >"$T/mm.out" 2>&1; rc=$?
check '[ $rc -ne 0 ] && grep -q "key .matmul.: tf32 is the tensor cores of device cuda; device cpu computes fp32 or bf16" "$T/mm.out" &&
       [ ! -e "$T/mm" ]' "matmul tf32 on the CPU is refused naming the key (rc $rc): $(cat "$T/mm.out")"
for budget in 0 6e6; do
    "$S" train $A $R --matmul bf16 --device_budget $budget --run_dir "$T/mmbf$budget" >"$T/mm.out" 2>&1; rc=$?
    check '{ [ $rc -eq 0 ] && grep -q "\"matmul\": *\"bf16\"" "$T/mmbf$budget/config.json"; } ||
           { [ $rc -ne 0 ] && grep -q "key .matmul.: bf16 on the CPU needs oneDNN.*libdnnl-dev" "$T/mm.out" && [ ! -e "$T/mmbf$budget" ]; }' \
      "matmul bf16 on the CPU (device_budget $budget) runs, or is refused naming oneDNN (rc $rc): $(tail -3 "$T/mm.out")"
done
# auto: the choice logged, and config.json records it (never auto), so a resume runs it
"$S" train $A $R --matmul auto --run_dir "$T/mmauto" >"$T/mmauto.out" 2>&1; rc=$?
check '[ $rc -eq 0 ] && grep -q "matmul auto: \(bf16\|fp32\) (" "$T/mmauto.out" &&
       grep -q "\"matmul\": *\"\(bf16\|fp32\)\"" "$T/mmauto/config.json"' \
  "matmul auto runs, logs and records its choice (rc $rc): $(head -3 "$T/mmauto.out")"
"$S" train $A $R --matmul fp32 --device_budget 6e6 --run_dir "$T/mm32" >"$T/mm32.out" 2>&1; rc=$?
check '[ $rc -eq 0 ] && grep -q "\"matmul\": *\"fp32\"" "$T/mm32/config.json"' \
  "matmul fp32 on the CPU runs and config.json records it (rc $rc): $(tail -2 "$T/mm32.out")"

# a GPU runs only the layer-streaming executor: device_budget is required
"$S" train $A $R --device cuda --run_dir "$T/nobudget" >"$T/nobudget.out" 2>&1; rc=$?
check '[ $rc -ne 0 ] && grep -q "key '"'"'device_budget'"'"'" "$T/nobudget.out" && grep -q "give device_budget" "$T/nobudget.out"' \
  "device cuda without device_budget is refused naming device_budget (rc $rc): $(cat "$T/nobudget.out")"

# cuda where this build has no CUDA backend: refused saying so and how to build it
cuda_build=0
grep -qs '^STRATA_CUDA:BOOL=ON' "$(dirname "$S")/CMakeCache.txt" && cuda_build=1
"$S" train $A $R --device cuda:0 --device_budget 6e6 --run_dir "$T/cuda" >"$T/cuda.out" 2>&1; rc=$?
if [ $cuda_build -eq 0 ]; then
    check '[ $rc -eq 1 ] && grep -q "key '"'"'device'"'"'" "$T/cuda.out" &&
           grep -q "built without the CUDA backend" "$T/cuda.out" && grep -q -- "-DSTRATA_CUDA=ON" "$T/cuda.out"' \
      "device cuda:0 in a build without CUDA is refused saying how to build it (rc $rc): $(cat "$T/cuda.out")"
    check '[ ! -e "$T/cuda" ]' "the refusal comes before the run directory is made: $(ls -A "$T/cuda" 2>&1)"
    "$S" bench stream --device cuda --model gpt2-tiny --seq 16 --steps 1 >"$T/bcuda.out" 2>&1; rc=$?
    check '[ $rc -ne 0 ] && grep -q "built without the CUDA backend" "$T/bcuda.out"' \
      "bench stream --device cuda without CUDA is refused (rc $rc): $(cat "$T/bcuda.out")"
else
    check '[ $rc -eq 0 ] || { [ $rc -eq 1 ] && grep -Eq "built without the CUDA backend|no CUDA device" "$T/cuda.out"; }' \
      "device cuda:0 in a CUDA build runs or is refused for want of a device (rc $rc): $(cat "$T/cuda.out")"
fi

rm -rf "$T"
[ $fail -eq 0 ] && echo "device cli: all checks passed"
exit $fail
