#!/usr/bin/env bash
# test_train_bf16.sh - matmul bf16 trains as well as fp32 on the CPU: the default run
# (gpt2-mini on the embedded corpus, batch 16 x seq 128), cut to 100 steps, once with
# matmul fp32 and once with bf16 (oneDNN); the bf16 run's final training loss and its
# validation loss at step 100 are within 2% of the fp32 run's, and not equal to them (the
# bf16 path did run); config.json records bf16. Skips (77) where matmul auto would choose
# fp32: a CPU without bf16 matrix units (AMX-BF16, AVX512-BF16) or a build without oneDNN.
# About 15 s on 2 cores.
set -u
S=${STRATA_BIN:?STRATA_BIN not set}
T=$(mktemp -d /tmp/strata-test-train-bf16-XXXXXX)
fail=0
check() { if ! eval "$1"; then echo "FAIL: $2"; fail=1; fi; }
R="--steps 100 --eval_every 100 --sample_every 0 --quiet 1"

# what auto chooses here, on a one-step toy run
"$S" train --model gpt2-tiny --n_embd 64 --n_layer 1 --vocab_size 256 --max_seq 16 --batch 1 --seq 16 --steps 1 \
    --eval_every 0 --sample_every 0 --quiet 1 --matmul auto --run_dir "$T/probe" >"$T/probe.out" 2>&1
if ! grep -q "matmul auto: bf16" "$T/probe.out"; then
    echo "train_bf16: skipped: $(grep "matmul auto" "$T/probe.out" || tail -1 "$T/probe.out")"
    rm -rf "$T"
    exit 77
fi

for m in fp32 bf16; do
    "$S" train $R --matmul $m --run_dir "$T/$m" >"$T/$m.out" 2>&1
    check '[ $? -eq 0 ]' "the $m run failed: $(tail -3 "$T/$m.out")"
done
check 'grep -q "\"matmul\": *\"bf16\"" "$T/bf16/config.json"' "config.json of the bf16 run records matmul bf16"

# the last step's loss and val_loss of each run (metrics.jsonl)
last() { grep '"step":100,' "$T/$1/metrics.jsonl" | sed -n "s/.*\"$2\":\([0-9.e+-]*\).*/\1/p"; }
for k in loss val_loss; do
    a=$(last fp32 $k) b=$(last bf16 $k)
    check '[ -n "$a" ] && [ -n "$b" ]' "$k at step 100 in both runs' metrics.jsonl (fp32 '$a', bf16 '$b')"
    if [ -n "$a" ] && [ -n "$b" ]; then
        rel=$(awk -v a="$a" -v b="$b" 'BEGIN { d = (b - a) / a; printf "%.5f", d < 0 ? -d : d }')
        echo "train_bf16: $k fp32 $a, bf16 $b, relative difference $rel"
        check 'awk -v r="$rel" "BEGIN { exit !(r <= 0.02) }"' "$k: bf16 $b is not within 2% of fp32's $a ($rel)"
        check '[ "$a" != "$b" ]' "$k: bf16 equals fp32 ($a): the bf16 matmuls did not run"
    fi
done

[ $fail -eq 0 ] && rm -rf "$T" && echo "train_bf16: all checks passed"
exit $fail
