#!/usr/bin/env bash
# bench_step_bf16.sh - strata bench step in matmul fp32 and bf16, alternated, for issue 31's
# figures: ROUNDS pairs (fp32 then bf16), each its own process, each taking the machine's
# lock when LOCK names one; the load (uptime) before each; one JSON line per run, then the
# medians of tokens/s, achieved GFLOP/s, the ratio (achieved over the in-run ceiling: sgemm
# for fp32, oneDNN's bf16 matmul at the step's shapes for bf16) and bf16's speed-up.
# MODES="bf16" runs only that mode (default "fp32 bf16"). The load is read under the lock.
# TORCH=PYTHON (a python with torch, e.g. /usr/bin/python3 with Debian's python3-torch) adds
# to each round PyTorch's GPT-2 step under bf16 autocast (tools/bench_torch_step.py, same
# batch, seq and threads; GPT-2 small only) and the ratio of strata bf16's tokens/s to it.
#   usage: tools/bench_step_bf16.sh [STRATA_BIN] [ROUNDS] [-- bench step options]
#   e.g.   LOCK=/tmp/strata-cpu.lock tools/bench_step_bf16.sh build/strata 3 -- --model gpt2-124m --batch 4 --seq 256
set -eu
S=${1:-build/strata}
ROUNDS=${2:-3}
shift $(( $# >= 2 ? 2 : $# ))
[ "${1:-}" = "--" ] && shift
OUT=$(mktemp /tmp/strata-bench-step-bf16-XXXXXX)
LOADF=$OUT.load
# the command under the lock, the load average read once the lock is held (into $LOADF)
run() {
    if [ -n "${LOCK:-}" ]; then flock "$LOCK" sh -c 'cut -d" " -f1-3 /proc/loadavg >"$0"; exec "$@"' "$LOADF" "$@"
    else cut -d" " -f1-3 /proc/loadavg >"$LOADF"; "$@"; fi
}
for r in $(seq 1 "$ROUNDS"); do
    for m in ${MODES:-fp32 bf16}; do
        line=$(run "$S" bench step "$@" --matmul "$m" --json)
        load=$(cat "$LOADF")
        echo "{\"round\":$r,\"load\":\"$load\",\"run\":$line}" | tee -a "$OUT"
    done
    if [ -n "${TORCH:-}" ]; then
        B=4 T=256 prev=""
        for a in "$@"; do case "$prev" in --batch) B=$a;; --seq) T=$a;; esac; prev=$a; done
        line=$(run "$TORCH" "$(dirname "$0")/bench_torch_step.py" --batch "$B" --seq "$T" --bf16 \
               --threads "${OMP_NUM_THREADS:-0}")
        load=$(cat "$LOADF")
        echo "{\"round\":$r,\"load\":\"$load\",\"torch\":$line}" | tee -a "$OUT"
    fi
done
python3 - "$OUT" <<'PY'
import json, statistics, sys
allrows = [json.loads(l) for l in open(sys.argv[1])]
rows = [r for r in allrows if "run" in r]
torch = [r["torch"]["tokens_per_s"] for r in allrows if "torch" in r]
med = lambda m, k: statistics.median(r["run"][k] for r in rows if r["run"]["matmul"] == m)
modes = {r["run"]["matmul"] for r in rows}
for m, ceil in (("fp32", "sgemm_gflops"), ("bf16", "onednn_bf16_gflops")):
    if m not in modes:
        continue
    print(f"{m}: tokens/s {med(m, 'tokens_per_s'):.1f}, achieved {med(m, 'achieved_gflops'):.1f} GFLOP/s, "
          f"{ceil} {med(m, ceil):.1f}, ratio {med(m, 'ratio'):.3f}, step {med(m, 'step_s'):.3f} s")
if modes >= {"fp32", "bf16"}:
    print(f"bf16 over fp32, tokens/s (medians): {med('bf16', 'tokens_per_s') / med('fp32', 'tokens_per_s'):.2f}x")
if "bf16" in modes:
    print("bf16 step: weights to bf16 %.3f s, activations to bf16 %.3f s, oneDNN %.3f s (medians)" % tuple(
    med("bf16", k) for k in ("step_convert_weights_s", "step_convert_acts_s", "step_onednn_s")))
if torch:
    print(f"PyTorch bf16 autocast: tokens/s {statistics.median(torch):.1f} (runs: {torch}); strata bf16 over it "
          f"{med('bf16', 'tokens_per_s') / statistics.median(torch):.2f}x")
print("loads:", ", ".join(r["load"] for r in allrows))
PY
rm -f "$OUT" "$LOADF"
