#!/usr/bin/env bash
# bench_poetx_adamw.sh - POET-X against AdamW trained from scratch on the same tokens, each
# with its learning rates tuned over a grid (issue 29: POET-X's final validation loss within 2%
# of AdamW's on gpt2-mini and a Llama-family tiny model).
#
#   tools/bench_poetx_adamw.sh STRATA OUTDIR
#
# Env: MODELS ("gpt2-mini llama-tiny"), STEPS (400), SEEDS ("1"), ADAMW_LRS ("1e-3 3e-3 1e-2"),
# POETX_LRS ("1e-3 3e-3 1e-2 3e-2": one learning rate for Q and the rest), or POETX_RUNS, a
# list of LR,POETX_LR,CLIP_RAMP,MERGE_EVERY[,ADAM_RESTART] items (POETX_RUNS_gpt2_mini,
# POETX_RUNS_llama_tiny per model; ADAMW_LRS_gpt2_mini, ... likewise, a blank one runs no
# AdamW): lr for the embeddings, norms and biases, poetx_lr for the packed Q's (-1: lr),
# poetx_clip_ramp (0: off; its start poetx_clip_start, env CLIP_START, 0.1), poetx_merge_every,
# poetx_adam_restart (1 when left out); BLOCK_gpt2_mini (64), BLOCK_llama_tiny (16), THREADS
# (2), LOCK (a file to flock around each run, so a shared machine runs one at a time).
# Every run (llama-tiny with --max_seq 128 --vocab_size 256): the embedded corpus and its
# held-out tail (strata train's default data), batch 16 x seq 128, warmup 20, the cosine
# schedule to the end, a validation every 100 steps and at the last. Prints a line per run
# (final validation loss, wall seconds, load) and per model each setting's mean over its seeds,
# the best of each method (among the settings run on the most seeds) and POET-X's best over
# AdamW's; OUTDIR/summary.json holds the same. OUTDIR/runs.txt is appended to: calls with
# other grids or seeds into one OUTDIR are summarised together.
set -u
S=${1:?usage: bench_poetx_adamw.sh STRATA OUTDIR}
O=${2:?usage: bench_poetx_adamw.sh STRATA OUTDIR}
MODELS=${MODELS:-"gpt2-mini llama-tiny"}
STEPS=${STEPS:-400}
SEEDS=${SEEDS:-1}
THREADS=${THREADS:-2}
CLIP_START=${CLIP_START:-0.1}
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
touch "$O/runs.txt"
for m in $MODELS; do
  mk=${m//-/_}
  bvar="BLOCK_$mk"; block=${!bvar:-$([ "$m" = llama-tiny ] && echo 16 || echo 64)}
  avar="ADAMW_LRS_$mk"; adamw_lrs=${!avar:-${ADAMW_LRS:-"1e-3 3e-3 1e-2"}}
  pvar="POETX_RUNS_$mk"; poetx_runs=${!pvar:-${POETX_RUNS:-}}
  if [ -z "$poetx_runs" ]; then
    for lr in ${POETX_LRS:-"1e-3 3e-3 1e-2 3e-2"}; do poetx_runs="$poetx_runs $lr,-1,0,200"; done
  fi
  extra=""; [ "$m" = llama-tiny ] && extra="--max_seq 128 --vocab_size 256" # its preset: max_seq 16, vocab 64
  for seed in $SEEDS; do
    common="--model $m $extra --batch 16 --seq 128 --steps $STEPS --warmup_steps 20 --eval_every 100 --sample_every 0 --quiet 1 --seed $seed --threads $THREADS"
    for lr in $adamw_lrs; do run "$m-adamw-$lr-s$seed" $common --lr "$lr"; done
    for item in $poetx_runs; do
      IFS=, read -r lr plr ramp every restart <<<"$item"
      run "$m-poetx-$item-s$seed" $common --method poetx --poetx_block "$block" --lr "$lr" --poetx_lr "$plr" \
        --poetx_clip_ramp "$ramp" --poetx_clip_start "$CLIP_START" --poetx_merge_every "$every" \
        --poetx_adam_restart "${restart:-1}"
    done
  done
done
python3 - "$O/runs.txt" "$O/summary.json" <<'PY'
import json, math, sys
runs = {}
for line in open(sys.argv[1]):
    f = line.split()
    name, val = f[0], float(f[4])
    method = "poetx" if "-poetx-" in name else "adamw"
    m, rest = name.split("-" + method + "-")
    setting, seed = rest.rsplit("-s", 1)
    runs.setdefault(m, {}).setdefault(method, {}).setdefault(setting, {})[seed] = val
out = {}
for m, d in runs.items():
    out[m] = {}
    for method in ("adamw", "poetx"):
        settings = d.get(method, {})
        for st, seeds in sorted(settings.items()):
            v = list(seeds.values())
            print("%s %s %s: %s mean %.4f" % (m, method, st, " ".join("s%s %.4f" % kv for kv in sorted(seeds.items())), sum(v) / len(v)))
        nmax = max((len(s) for s in settings.values()), default=0)
        cand = [(sum(s.values()) / len(s), st, len(s)) for st, s in settings.items() if len(s) == nmax and
                all(not math.isnan(x) for x in s.values())]
        best = min(cand) if cand else (math.nan, "", 0)
        out[m][method + "_best"] = {"val_loss_mean": best[0], "setting": best[1], "seeds": best[2],
                                    "per_seed": settings.get(best[1], {})}
    a, p = out[m]["adamw_best"]["val_loss_mean"], out[m]["poetx_best"]["val_loss_mean"]
    out[m]["poetx_over_adamw"] = p / a if a == a and a > 0 else math.nan
    print("%s: AdamW best %.4f (lr %s, %d seeds), POET-X best %.4f (lr,poetx_lr,ramp,merge %s, %d seeds): POET-X / AdamW %.4f"
          % (m, a, out[m]["adamw_best"]["setting"], out[m]["adamw_best"]["seeds"], p, out[m]["poetx_best"]["setting"],
             out[m]["poetx_best"]["seeds"], out[m]["poetx_over_adamw"]))
json.dump(out, open(sys.argv[2], "w"), indent=1)
PY
