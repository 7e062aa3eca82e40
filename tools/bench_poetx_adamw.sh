#!/usr/bin/env bash
# bench_poetx_adamw.sh - POET-X against AdamW trained from scratch on the same tokens, each
# with its learning rate tuned over a grid (issue 29: POET-X's final validation loss within 2%
# of AdamW's on gpt2-mini and a Llama-family tiny model).
#
#   tools/bench_poetx_adamw.sh STRATA OUTDIR
#
# Env: MODELS ("gpt2-mini llama-tiny"), STEPS (400), ADAMW_LRS ("1e-3 3e-3 1e-2"),
# POETX_LRS ("1e-3 3e-3 1e-2 3e-2"), BLOCK_gpt2_mini (64), BLOCK_llama_tiny (16), THREADS (2),
# LOCK (a file to flock around each run, so a shared machine runs one at a time).
# Every run (llama-tiny with --max_seq 128 --vocab_size 256): the embedded corpus and its held-out tail (strata train's default data), batch 16
# x seq 128, warmup 20, the cosine schedule to the end, a validation every 100 steps and at the
# last; seed 1. Prints a line per run (final validation loss, wall seconds) and per model the
# best of each method and POET-X's best over AdamW's; OUTDIR/summary.json holds the same.
set -u
S=${1:?usage: bench_poetx_adamw.sh STRATA OUTDIR}
O=${2:?usage: bench_poetx_adamw.sh STRATA OUTDIR}
MODELS=${MODELS:-"gpt2-mini llama-tiny"}
STEPS=${STEPS:-400}
ADAMW_LRS=${ADAMW_LRS:-"1e-3 3e-3 1e-2"}
POETX_LRS=${POETX_LRS:-"1e-3 3e-3 1e-2 3e-2"}
THREADS=${THREADS:-2}
mkdir -p "$O"
run() { # NAME ARGS...
  local name=$1; shift
  local cmd=("$S" train "$@" --run_dir "$O/$name")
  rm -rf "$O/$name"
  local t0=$(date +%s.%N)
  if [ -n "${LOCK:-}" ]; then flock "$LOCK" "${cmd[@]}" >"$O/$name.out" 2>&1; else "${cmd[@]}" >"$O/$name.out" 2>&1; fi
  local rc=$? t1=$(date +%s.%N)
  local val=$(python3 -c "import json,sys; v=[json.loads(l)['val_loss'] for l in open(sys.argv[1]) if 'val_loss' in l]; print(v[-1] if v else 'nan')" "$O/$name/metrics.jsonl" 2>/dev/null || echo nan)
  printf '%s rc %d val %s wall %.1f s load %s\n' "$name" $rc "$val" "$(echo "$t1 - $t0" | bc)" "$(cut -d' ' -f1 /proc/loadavg)" | tee -a "$O/runs.txt"
}
: >"$O/runs.txt"
for m in $MODELS; do
  bvar="BLOCK_${m//-/_}"; block=${!bvar:-$([ "$m" = llama-tiny ] && echo 16 || echo 64)}
  extra=""; [ "$m" = llama-tiny ] && extra="--max_seq 128 --vocab_size 256" # its preset: max_seq 16, vocab 64
  common="--model $m $extra --batch 16 --seq 128 --steps $STEPS --warmup_steps 20 --eval_every 100 --sample_every 0 --quiet 1 --seed 1 --threads $THREADS"
  for lr in $ADAMW_LRS; do run "$m-adamw-$lr" $common --lr "$lr"; done
  for lr in $POETX_LRS; do run "$m-poetx-$lr" $common --method poetx --poetx_block "$block" --lr "$lr"; done
done
python3 - "$O/runs.txt" "$O/summary.json" <<'EOF'
import json, math, sys
runs = {}
for line in open(sys.argv[1]):
    f = line.split()
    name, val = f[0], float(f[4])
    method = "poetx" if "-poetx-" in name else "adamw"
    m, lr = name.split("-" + method + "-")
    if not math.isnan(val):
        runs.setdefault(m, {}).setdefault(method, []).append((val, lr))
out = {}
for m, d in runs.items():
    a, p = min(d.get("adamw", [(math.nan, "")])), min(d.get("poetx", [(math.nan, "")]))
    out[m] = {"adamw_best": {"val_loss": a[0], "lr": a[1]}, "poetx_best": {"val_loss": p[0], "lr": p[1]},
              "poetx_over_adamw": p[0] / a[0]}
    print("%s: AdamW best %.4f (lr %s), POET-X best %.4f (lr %s): POET-X / AdamW %.4f" % (m, a[0], a[1], p[0], p[1], p[0] / a[0]))
json.dump(out, open(sys.argv[2], "w"), indent=1)
EOF
