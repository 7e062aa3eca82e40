#!/usr/bin/env bash
# test_gpu_script.sh - tests/gpu/run.sh's logic without a GPU: STRATA_GPU_DRYRUN=1 runs its
# five stages with this build's strata on --device cpu and tiny models, and a bundle made
# here of stand-in CUDA tests (one passes, one skips). Its gpu_run.json must say every stage
# and check passed or was skipped, with the figures each check reports (identical losses and
# both tolerances, a state 8 x the device budget, tokens/s and both TFLOPS), each stage must
# print one status line and leave its log, the summary table last; then, with the device
# side given another seed and a stand-in test that fails, the comparison and the CUDA tests
# must fail and the script exit 1; a stage that hangs past its limit is killed, recorded as
# timed out, and the later stages still run and pass; without the dry run, no GPU here must
# exit 77.
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
want = {"gpu": "skipped", "bundle": "passed", "cuda_tests": "passed", "sanitizer": "skipped", "probe": "skipped",
        "attention_cudnn": "skipped", "loss_gpt2": "passed", "loss_qwen": "passed", "loss_bf16": "skipped", "stream_8x": "passed",
        "large_model": "passed"}
stages = [(s["name"], s["status"]) for s in d.get("stages", [])]
if stages != [("env", "passed"), ("cuda_tests", "passed"), ("probe", "skipped"), ("losses", "passed"),
              ("large", "passed")]:
    bad.append("stages: %r" % stages)
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
    if "largest difference 0 relative" not in c[k]["message"] or f.get("rel_tol_step1") != 1e-5 or f.get("rel_tol") != 1e-4:
        bad.append("%s: the largest difference and both tolerances are not said: %s %r" % (k, c[k]["message"], f))
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
# one status line per stage, each stage's log under OUT, the summary table last
check '[ "$(grep -c "^stage [1-5] " "$T/ok/gpu_run.log")" = 5 ] && ls "$T/ok"/stage_[1-5]_*.log >/dev/null 2>&1 &&
  [ "$(ls "$T/ok"/stage_*.log | wc -l)" = 5 ] && tail -3 "$T/ok/gpu_run.log" | grep -q "^summary: 5 stages"' \
  "five status lines, five stage logs and the summary last: $(grep -E "^(stage|summary)" "$T/ok/gpu_run.log" | tr '\n' '|')"

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

# a stage that fails (the CUDA tests' stage hangs: a stand-in test that sleeps, under a 3 s
# stage limit) is killed at its limit and recorded as timed out, and the later stages
# still run and pass; the script exits 1
mkdir -p "$T/hang"
cp "$T/bundle/VERSION" "$T/bundle/test_cuda_pass" "$T/hang/"
printf '#!/bin/sh\ntrap "" TERM\nsleep 60\n' >"$T/hang/test_cuda_hang" # deaf to the test's own timeout's TERM
chmod +x "$T/hang/test_cuda_hang"
t0=$(date +%s)
STRATA_GPU_BUNDLE="$T/hang" STRATA_GPU_OUT="$T/hang_out" STRATA_GPU_STAGE_LIMITS=cuda_tests=3 \
  STRATA_GPU_CHECKS=bundle,cuda_tests,loss_gpt2,large_model bash "$SRC/tests/gpu/run.sh" >"$T/hang.log" 2>&1; rc=$?
t=$(($(date +%s) - t0))
check '[ $rc -eq 1 ] && [ $t -lt 50 ]' "a stage past its limit exits 1, killed (exit $rc in $t s): $(tail -4 "$T/hang.log")"
python3 - "$T/hang_out/gpu_run.json" >"$T/hang.py.out" 2>&1 <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
st = {s["name"]: s["status"] for s in d["stages"]}
c = d["checks"]
ok = (st == {"env": "passed", "cuda_tests": "timed out", "probe": "skipped", "losses": "passed", "large": "passed"}
      and c["cuda_tests"]["status"] == "failed" and "timed out" in c["cuda_tests"]["message"]
      and c["loss_gpt2"]["status"] == "passed" and c["large_model"]["status"] == "passed"
      and d["failed_stages"] == ["cuda_tests"] and not d["passed"])
print("ok" if ok else json.dumps({"stages": d["stages"], "checks": c}, indent=1))
sys.exit(0 if ok else 1)
PY
rc=$?
check '[ $rc -eq 0 ]' "after a timed-out stage the later stages run: $(head -c 1500 "$T/hang.py.out")"
check 'grep -qE "^stage 2 cuda_tests +timed out" "$T/hang.log" && [ -s "$T/hang_out/stage_2_cuda_tests.log" ]' \
  "the timed-out stage's status line and log: $(grep "^stage" "$T/hang.log" | tr '\n' '|')"

# not a dry run, and no GPU here: 77, saying so
if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
  STRATA_GPU_DRYRUN=0 STRATA_GPU_OUT="$T/nogpu" bash "$SRC/tests/gpu/run.sh" >"$T/nogpu.log" 2>&1; rc=$?
  check '[ $rc -eq 77 ] && grep -q "no NVIDIA GPU" "$T/nogpu.log"' "without a GPU the script exits 77 (exit $rc): $(cat "$T/nogpu.log")"
fi

echo "test_gpu_script: $checks checks, $fail failed"
[ "$fail" -eq 0 ]
