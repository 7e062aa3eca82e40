#!/usr/bin/env bash
# bench_lora_finetune.sh - how much of a full fine-tune's validation-loss drop LoRA recovers
# (issue 29: "LoRA fine-tuning of a pretrained strata model on a second text recovers at least
# 80% of the full fine-tune's validation-loss drop at rank 16").
#
# usage: [LOCK=/path/to/lockfile] [STEPS=300] [FULL_LRS="3e-4 1e-3 3e-3"]
#        [LORA_LRS="1e-3 3e-3 1e-2"] tools/bench_lora_finetune.sh [strata binary] [work dir]
#
#  1. pretrains gpt2-mini (vocabulary 257: the byte-level tokens and the end-of-document id
#     256 of `strata data pack`) on the embedded corpus, 400 steps, the defaults of
#     `strata train`, saved with --save_hf: the pretrained model;
#  2. gathers a second text, real text this machine has (licences, copyright files, manual
#     pages, Python sources: tools/gen_noisy_corpus.py's gather, seed 29, 1500 paragraph
#     documents), holds out its last 10% of documents for validation and packs both parts
#     byte-level with `strata data pack`;
#  3. fine-tunes the pretrained model on it twice, on the same tokens (same seed, data order,
#     batch 16 x 128, STEPS steps, cosine schedule, 20 warmup steps): full (AdamW over every
#     weight) and LoRA rank 16 (alpha 32, every projection: c_attn, c_proj, c_fc), each at
#     each learning rate of its list; the validation loss (the held-out documents, 64
#     batches) is measured at the end of each run, and before fine-tuning by a run of one
#     step at learning rate 0;
#  4. prints every run's final validation loss, the best learning rate of each method, and
#     the recovered fraction (before - lora) / (before - full) at the best of each.
# Each strata command runs under `flock $LOCK` when LOCK is set (a shared machine's CPU lock).
set -euo pipefail
S=$(realpath "${1:-build/strata}")
W=${2:-$(mktemp -d /tmp/strata-lora-ft-XXXXXX)}
mkdir -p "$W"
SRC=$(cd "$(dirname "$0")/.." && pwd)
STEPS=${STEPS:-300}
read -r -a full_lrs <<<"${FULL_LRS:-3e-4 1e-3 3e-3}"
read -r -a lora_lrs <<<"${LORA_LRS:-1e-3 3e-3 1e-2}"
run() { if [ -n "${LOCK:-}" ]; then flock "$LOCK" "$@"; else "$@"; fi; }
echo "strata: $S; work: $W; load before: $(uptime)"

# 1. the pretrained model
if [ ! -f "$W/base_hf/model.safetensors" ]; then
    run "$S" train --model gpt2-mini --vocab_size 257 --steps 400 --seed 1337 --quiet 1 --sample_every 0 \
        --run_dir "$W/pre" --save_hf "$W/base_hf" >"$W/pre.out" 2>&1 || { tail -5 "$W/pre.out"; exit 1; }
fi
echo "pretrained: gpt2-mini, 400 steps on the embedded corpus, final val_loss (embedded held-out tail)" \
    "$(jq -r 'select(.val_loss != null) | .val_loss' "$W/pre/metrics.jsonl" | tail -1)"

# 2. the second text, its last 10% of documents held out
if [ ! -f "$W/val.idx" ]; then
    run python3 - "$S" "$W" "$SRC/tools" <<'PY'
import random, sys
sys.path.insert(0, sys.argv[3])
from gen_noisy_corpus import gather, pack
strata, out = sys.argv[1], sys.argv[2]
docs = gather(random.Random(29), 1500)
if len(docs) < 1000:
    sys.exit("bench_lora_finetune: only %d paragraphs of text on this machine (want 1500)" % len(docs))
n_val = len(docs) // 10  # the last documents: gather takes at most 3 paragraphs a file, in file order
pack(strata, out + "/train", docs[:-n_val], out)
pack(strata, out + "/val", docs[-n_val:], out)
print("second text: %d training documents (%d bytes), %d held out (%d bytes)"
      % (len(docs) - n_val, sum(map(len, docs[:-n_val])), n_val, sum(map(len, docs[-n_val:]))))
PY
fi

common=(--init_from "$W/base_hf" --data "$W/train" --val_data "$W/val" --eval_tokens 131072 --batch 16 --seq 128
        --seed 29 --warmup_steps 20 --quiet 1 --sample_every 0 --log_every 50)
final_val() { jq -r 'select(.val_loss != null) | .val_loss' "$1/metrics.jsonl" | tail -1; }
ft() { # $1 name, the rest: keys
    local name=$1
    shift
    if [ ! -f "$W/$name/metrics.jsonl" ] || [ -z "$(final_val "$W/$name")" ]; then
        rm -rf "$W/$name"
        local t0=$SECONDS
        run "$S" train "${common[@]}" "$@" --run_dir "$W/$name" >"$W/$name.out" 2>&1 || { tail -5 "$W/$name.out"; exit 1; }
        echo "$((SECONDS - t0))" >"$W/$name.secs"
    fi
    printf '%-14s val_loss %s  (%s s)\n' "$name" "$(final_val "$W/$name")" "$(cat "$W/$name.secs" 2>/dev/null || echo ?)"
}

# 3. before, full, LoRA
ft before --steps 1 --lr 0 --eval_every 1
for lr in "${full_lrs[@]}"; do ft "full_$lr" --steps "$STEPS" --eval_every "$STEPS" --lr "$lr"; done
for lr in "${lora_lrs[@]}"; do
    ft "lora_$lr" --steps "$STEPS" --eval_every "$STEPS" --lr "$lr" --method lora --lora_rank 16 --lora_alpha 32 \
        --lora_targets c_attn,c_proj,c_fc
done
echo "load after: $(uptime)"

# 4. the figure
python3 - "$W" "${full_lrs[*]}" "${lora_lrs[*]}" <<'PY'
import json, sys
w = sys.argv[1]
def val(name):
    v = [json.loads(l)["val_loss"] for l in open("%s/%s/metrics.jsonl" % (w, name)) if "val_loss" in l]
    return v[-1]
before = val("before")
full = {lr: val("full_" + lr) for lr in sys.argv[2].split()}
lora = {lr: val("lora_" + lr) for lr in sys.argv[3].split()}
fl, f = min(full.items(), key=lambda t: t[1])
ll, l = min(lora.items(), key=lambda t: t[1])
print("val_loss before fine-tuning %.4f" % before)
print("full fine-tune (best lr %s) %.4f: drop %.4f" % (fl, f, before - f))
print("LoRA r 16 (best lr %s) %.4f: drop %.4f" % (ll, l, before - l))
print("recovered fraction (before - lora) / (before - full) = %.3f" % ((before - l) / (before - f)))
PY
