#!/usr/bin/env bash
# bench_step_bf16.sh - strata bench step in matmul fp32 and bf16, alternated, for issue 31's
# figures: ROUNDS pairs (fp32 then bf16), each its own process, each taking the machine's
# lock when LOCK names one; the load (uptime) before each; one JSON line per run, then the
# medians of tokens/s, achieved GFLOP/s, the ratio (achieved over the in-run ceiling: sgemm
# for fp32, oneDNN's bf16 matmul at the step's shapes for bf16) and bf16's speed-up.
#   usage: tools/bench_step_bf16.sh [STRATA_BIN] [ROUNDS] [-- bench step options]
#   e.g.   LOCK=/tmp/strata-cpu.lock tools/bench_step_bf16.sh build/strata 3 -- --model gpt2-124m --batch 4 --seq 256
set -eu
S=${1:-build/strata}
ROUNDS=${2:-3}
shift $(( $# >= 2 ? 2 : $# ))
[ "${1:-}" = "--" ] && shift
OUT=$(mktemp /tmp/strata-bench-step-bf16-XXXXXX)
run() { if [ -n "${LOCK:-}" ]; then flock "$LOCK" "$@"; else "$@"; fi; }
for r in $(seq 1 "$ROUNDS"); do
    for m in fp32 bf16; do
        load=$(cut -d' ' -f1-3 /proc/loadavg)
        line=$(run "$S" bench step "$@" --matmul "$m" --json)
        echo "{\"round\":$r,\"load\":\"$load\",\"run\":$line}" | tee -a "$OUT"
    done
done
python3 - "$OUT" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
med = lambda m, k: statistics.median(r["run"][k] for r in rows if r["run"]["matmul"] == m)
for m, ceil in (("fp32", "sgemm_gflops"), ("bf16", "onednn_bf16_gflops")):
    print(f"{m}: tokens/s {med(m, 'tokens_per_s'):.1f}, achieved {med(m, 'achieved_gflops'):.1f} GFLOP/s, "
          f"{ceil} {med(m, ceil):.1f}, ratio {med(m, 'ratio'):.3f}, step {med(m, 'step_s'):.3f} s")
print(f"bf16 over fp32, tokens/s (medians): {med('bf16', 'tokens_per_s') / med('fp32', 'tokens_per_s'):.2f}x")
print("bf16 step: weights to bf16 %.3f s, activations to bf16 %.3f s, oneDNN %.3f s (medians)" % tuple(
    med("bf16", k) for k in ("step_convert_weights_s", "step_convert_acts_s", "step_onednn_s")))
print("loads:", ", ".join(r["load"] for r in rows))
PY
rm -f "$OUT"
