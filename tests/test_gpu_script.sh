#!/usr/bin/env bash
# test_gpu_script.sh - tests/gpu/run.sh's logic without a GPU: STRATA_GPU_DRYRUN=1 runs its
# whole pipeline with this build's strata on --device cpu and tiny models, and a bundle made
# here of stand-in CUDA tests (one passes, one skips). Its gpu_run.json must say every check
# passed or was skipped, with the figures each check reports (identical losses, a state 8 x
# the device budget, tokens/s and both TFLOPS); then, with the device side given another seed
# and a stand-in test that fails, the comparison and the CUDA tests must fail and the script
# exit 1; without the dry run, no GPU here must exit 77.
set -u
S=${STRATA_BIN:?}
SRC=${STRATA_SOURCE_DIR:?}
command -v python3 >/dev/null || { echo "SKIP: python3 is needed (tests/gpu/run.sh parses metrics with it)"; exit 77; }
T=$(mktemp -d /tmp/strata-gpu-script-XXXXXX)
trap 'rm -rf "$T"' EXIT
fail=0; checks=0
check() { checks=$((checks+1)); if ! eval "$1"; then echo "FAIL: $2"; fail=$((fail+1)); fi; }

mkdir -p "$T/bundle"
printf 'strata GPU bundle\ncommit test\n' >"$T/bundle/VERSION"
printf '#!/bin/sh\necho ok\nexit 0\n' >"$T/bundle/test_cuda_pass"
printf '#!/bin/sh\necho "no CUDA device"\nexit 77\n' >"$T/bundle/test_cuda_skip"
chmod +x "$T/bundle"/test_cuda_*
export STRATA_GPU_BUNDLE="$T/bundle" STRATA_GPU_DRYRUN=1
unset OUT

t0=$(date +%s)
STRATA_GPU_OUT="$T/ok" bash "$SRC/tests/gpu/run.sh" >"$T/ok.log" 2>&1; rc=$?
echo "dry run: exit $rc in $(($(date +%s) - t0)) s"
check '[ $rc -eq 0 ]' "the dry run exits 0 (exit $rc): $(tail -5 "$T/ok.log")"
check '[ -s "$T/ok/gpu_run.log" ] && tar tzf "$T/ok/gpu_logs.tar.gz" | grep -q "runs/loss_gpt2_ref/metrics.jsonl"' \
  "gpu_run.log and gpu_logs.tar.gz (with the runs' metrics) are written"
python3 - "$T/ok/gpu_run.json" >"$T/ok.py.out" 2>&1 <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
c = d["checks"]
want = {"gpu": "skipped", "cuda_tests": "passed", "loss_gpt2": "passed", "loss_qwen": "passed",
        "loss_bf16": "skipped", "stream_8x": "passed", "large_model": "passed"}
bad = []
for k, v in want.items():
    if c.get(k, {}).get("status") != v:
        bad.append("%s is %s, not %s: %s" % (k, c.get(k, {}).get("status"), v, c.get(k, {}).get("message")))
if not (d["passed"] and d["dry_run"] and d["device"] == "cpu" and d["bundle"][:1] == ["strata GPU bundle"]):
    bad.append("header: passed %r dry_run %r device %r bundle %r" % (d["passed"], d["dry_run"], d["device"], d["bundle"]))
if "test_cuda_skip" not in c["cuda_tests"]["message"]:
    bad.append("cuda_tests does not name the skipped test: " + c["cuda_tests"]["message"])
for k in ("loss_gpt2", "loss_qwen"):  # --device cpu on both sides: the same bits
    f = c[k]["figures"]
    if f.get("max_rel_diff") != 0 or len(f.get("dev_losses", [])) != f.get("steps") or None in f["dev_losses"]:
        bad.append("%s figures: %r" % (k, f))
f = c["stream_8x"]["figures"]
if not (f.get("state_over_budget", 0) >= 8 and 0 < f.get("plan_device_bytes", 0) <= f["device_budget"]):
    bad.append("stream_8x figures: %r" % f)
f = c["large_model"]["figures"]
if not all(f.get(k, 0) > 0 for k in ("tokens_per_s", "tflops_strata", "tflops_6nd", "step_s", "params")):
    bad.append("large_model figures: %r" % f)
print("\n".join(bad) or "ok")
sys.exit(1 if bad else 0)
PY
rc=$?
check '[ $rc -eq 0 ]' "gpu_run.json of the dry run: $(cat "$T/ok.py.out")"

# broken on purpose: the device side trains from another seed; a CUDA test fails
printf '#!/bin/sh\necho "mismatch"\nexit 1\n' >"$T/bundle/test_cuda_fail"
chmod +x "$T/bundle/test_cuda_fail"
STRATA_GPU_OUT="$T/bad" STRATA_GPU_CHECKS=cuda_tests,loss_qwen STRATA_GPU_DEVICE_EXTRA="--seed 99" \
  bash "$SRC/tests/gpu/run.sh" >"$T/bad.log" 2>&1; rc=$?
check '[ $rc -eq 1 ]' "a broken comparison and a failing CUDA test exit 1 (exit $rc): $(tail -3 "$T/bad.log")"
python3 - "$T/bad/gpu_run.json" >"$T/bad.py.out" 2>&1 <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
c = d["checks"]
ok = (not d["passed"] and sorted(d["failed"]) == ["cuda_tests", "loss_qwen"]
      and "test_cuda_fail" in c["cuda_tests"]["message"] and "differ" in c["loss_qwen"]["message"]
      and c["loss_qwen"]["figures"]["max_rel_diff"] > 1e-5)
print("ok" if ok else json.dumps(d, indent=1))
sys.exit(0 if ok else 1)
PY
rc=$?
check '[ $rc -eq 0 ]' "gpu_run.json names the failed checks: $(head -c 1500 "$T/bad.py.out")"

# not a dry run, and no GPU here: 77, saying so
if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
  STRATA_GPU_DRYRUN=0 STRATA_GPU_OUT="$T/nogpu" bash "$SRC/tests/gpu/run.sh" >"$T/nogpu.log" 2>&1; rc=$?
  check '[ $rc -eq 77 ] && grep -q "no NVIDIA GPU" "$T/nogpu.log"' "without a GPU the script exits 77 (exit $rc): $(cat "$T/nogpu.log")"
fi

echo "test_gpu_script: $checks checks, $fail failed"
[ "$fail" -eq 0 ]
