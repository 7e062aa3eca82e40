#!/usr/bin/env bash
# test_poetx_stream_vocab.sh - strata train --method poetx under layer streaming (device_budget
# on the cpu device) with the vocabulary in chunks: the head's rows stream chunk by chunk, each
# chunk's gradient is handed to POET-X's vector (grad_at at the head's rows), the embedding's
# backward runs on the host into it (a tied head's gradient first, the scatter added), and the
# step's optimizer updates them as with the head resident.
#  - gpt2-tiny (6 blocks, a tied head) and llama-tiny (4 blocks, an untied head), vocabulary 256
#    in chunks of 100 rows (100, 100, 56: not dividing it), 6 steps with merges at 3 and 6, and
#    gpt2-tiny with grad_accum 2: each equals the same run with the head resident to float
#    rounding (the online softmax's loss and the head's dxn summed chunk by chunk, not in one
#    pass): every step's loss and gradient norm within 1e-5 relative, and the last checkpoint's
#    every fp32 tensor (the trained vector, W0 after the merges) within 1e-4 of its largest
#    value, the permutations equal. GPT-2's attention key bias is left out of the weights' bound:
#    its gradient is zero but for rounding (softmax ignores a shift of every key), so AdamW moves
#    it by the sign of noise, the same size either way (its difference printed);
#  - the planner chunks the vocabulary for POET-X where the resident head's smallest plan does
#    not fit (gpt2-tiny, vocabulary 2048, 900000 bytes): strata plan's plan chunks it and fits,
#    strata train logs "vocabulary chunked" and trains, and a plan with the head resident (every
#    block recomputed, prefetch depth 1: the smallest) is refused there as too large.
set -u
. "$(dirname "$0")/lib_method_cli.sh"
method_begin poetx_stream_vocab
px="--method poetx --poetx_block 8 --poetx_merge_every 3 --lr 1e-2 --warmup_steps 2"
ck() { echo "$1/checkpoints/step_$(printf %08d "$2")/model.safetensors"; }
run() { # DIR ARGS...: its status
    local d=$1
    shift
    "$S" train "$@" --run_dir "$d" >"$d.out" 2>&1
}
have_np=0
if command -v python3 >/dev/null && python3 -c "import numpy" 2>/dev/null; then
    have_np=1
    cat >"$T/close.py" <<'EOF'
# close.py A B TOL [SKIP_NAME_SUFFIX SKIP_LO SKIP_HI]: every fp32 tensor of safetensors B within
# TOL of A's largest magnitude (elements [SKIP_LO, SKIP_HI) of tensors named ...SUFFIX left out),
# every other tensor equal; prints the worst and the left-out elements' largest difference.
import json, struct, sys
import numpy as np
def read(p):
    b = open(p, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + n])
    dt = {"F32": np.float32, "I32": np.int32, "I64": np.int64}
    return {k: (v["dtype"], np.frombuffer(b[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]], dt[v["dtype"]]))
            for k, v in h.items() if k != "__metadata__"}
a, b = read(sys.argv[1]), read(sys.argv[2])
tol = float(sys.argv[3])
skip = sys.argv[4] if len(sys.argv) > 4 else None
lo, hi = (int(sys.argv[5]), int(sys.argv[6])) if skip else (0, 0)
if a.keys() != b.keys():
    sys.exit("tensors differ: %s" % sorted(a.keys() ^ b.keys()))
worst, wk, left, ok = 0.0, "", 0.0, True
for k in sorted(a):
    (da, xa), (db, xb) = a[k], b[k]
    if da != "F32" or db != "F32":
        if da != db or not np.array_equal(xa, xb):
            print("%s (%s) differs" % (k, da))
            ok = False
        continue
    d = np.abs(xa.astype(np.float64) - xb)
    if skip and k.endswith(skip):
        left = max(left, float(d[lo:hi].max()))
        d[lo:hi] = 0
    r = float(d.max()) / max(float(np.abs(xa).max()), 1e-30)
    if r > worst:
        worst, wk = r, k
print("worst %.3g (%s); left out: %.3g" % (worst, wk, left))
sys.exit(0 if ok and worst < tol else 1)
EOF
else
    echo "no python3 with numpy: the checkpoints' weights are not compared (losses and gradient norms are)"
fi
near() { # A B: the runs' losses and gradient norms, step by step, within 1e-5 relative
    paste <(jq -r '"\(.loss) \(.grad_norm)"' "$1/metrics.jsonl") <(jq -r '"\(.loss) \(.grad_norm)"' "$2/metrics.jsonl") |
      awk 'function far(x, y) { d = x - y; if (d < 0) d = -d; return d > 1e-5 * (x < 0 ? -x : x) }
           { if (far($1, $3) || far($2, $4)) bad = 1; n++ } END { exit bad || n != 6 }'
}
pair() { # NAME MODEL_ARGS BUDGET [SKIP...]: resident against chunks of 100 rows, 6 steps
    local name=$1 m=$2 b=$3 rc w
    shift 3
    run "$T/${name}_res" $m --steps 6 --device_budget $b --act recompute
    rc=$?
    check '[ $rc -eq 0 ] && grep -q "vocabulary resident" "$T/${name}_res.out"' \
      "$name: streamed with the head resident runs (rc $rc): $(tail -2 "$T/${name}_res.out")"
    "$S" plan $m --device_budget $b --act recompute -o "$T/${name}_plan.json" >"$T/${name}_plan.out" 2>&1
    jq '.vocab_chunk = 100' "$T/${name}_plan.json" >"$T/${name}_vc.json"
    run "$T/${name}_vc" $m --steps 6 --device_budget $b --plan "$T/${name}_vc.json"
    rc=$?
    check '[ $rc -eq 0 ] && grep -q "vocabulary chunked (100 rows a chunk)" "$T/${name}_vc.out"' \
      "$name: streamed with the vocabulary in chunks of 100 rows runs (rc $rc): $(tail -2 "$T/${name}_vc.out")"
    check 'near "$T/${name}_res" "$T/${name}_vc"' \
      "$name: losses and gradient norms ($(jq -r '"\(.loss)/\(.grad_norm)"' "$T/${name}_vc/metrics.jsonl" | tr '\n' ' ')) within 1e-5 relative of the resident head's ($(jq -r '"\(.loss)/\(.grad_norm)"' "$T/${name}_res/metrics.jsonl" | tr '\n' ' '))"
    if [ $have_np = 1 ]; then
        w=$(python3 "$T/close.py" "$(ck "$T/${name}_res" 6)" "$(ck "$T/${name}_vc" 6)" 1e-4 "$@" 2>&1)
        rc=$?
        echo "$name: the step-6 checkpoints' weights, chunked against resident: $w"
        check '[ $rc -eq 0 ]' "$name: every weight of the step-6 checkpoint within 1e-4 of the resident head's: $w"
    fi
}

# --- gpt2-tiny (tied: the head's gradient is the embedding's too); c_attn.bias's key third left out
g6="--model gpt2-tiny --n_layer 6 $tiny $px"
pair gpt2 "$g6" 400000 attn.c_attn.bias 32 64
pair gpt2_accum "$g6 --grad_accum 2" 400000 attn.c_attn.bias 32 64
# --- llama-tiny (an untied head: its gradient is a tensor of its own after the final norm)
pair llama "--model llama-tiny --n_layer 4 $tiny $px" 380000

# --- the planner: vocabulary 2048, where the resident head's smallest plan does not fit
pv="--model gpt2-tiny --n_layer 6 --vocab_size 2048 --batch 2 --seq 16 --sample_every 0 --eval_every 0 --quiet 1 $px"
pb=900000
"$S" plan $pv --device_budget $pb --json >"$T/pv.json" 2>"$T/pv.err"
rc=$?
check '[ $rc -eq 0 ] && jq -e ".vocab_chunk > 0 and .vocab_chunk < 2048 and .device_bytes <= '$pb' and .memory.tiers.device.fits" "$T/pv.json" >/dev/null' \
  "strata plan chunks POET-X's vocabulary at $pb bytes (rc $rc): $(jq -c '[.vocab_chunk, .device_bytes]' "$T/pv.json" 2>&1) $(tail -1 "$T/pv.err")"
run "$T/pv" $pv --steps 2 --device_budget $pb
rc=$?
check '[ $rc -eq 0 ] && grep -q "vocabulary chunked" "$T/pv.out" && [ "$(jq -r .step "$T/pv/metrics.jsonl" | wc -l)" = 2 ]' \
  "strata train chunks POET-X's vocabulary at $pb bytes and trains (rc $rc): $(grep -h "layer streaming" "$T/pv.out") $(tail -1 "$T/pv.out")"
"$S" plan $pv --device_budget 4000000 --act recompute -o "$T/pv_plan.json" >"$T/pv_plan.out" 2>&1
jq '.vocab_chunk = 0 | .prefetch_depth = 1 | .device_budget = '$pb "$T/pv_plan.json" >"$T/pv_res.json"
run "$T/pv_res" $pv --steps 2 --device_budget $pb --plan "$T/pv_res.json"
rc=$?
check '[ $rc -ne 0 ] && grep -q "bytes missing" "$T/pv_res.out" && [ ! -e "$T/pv_res/metrics.jsonl" ]' \
  "the head resident, every block recomputed at prefetch depth 1, does not fit $pb bytes (rc $rc): $(tail -1 "$T/pv_res.out")"

method_end poetx_stream_vocab
