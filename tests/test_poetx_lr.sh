#!/usr/bin/env bash
# test_poetx_lr.sh - method poetx's per-class learning rates, clip ramp and Adam restart through
# the strata binary (gpt2-tiny, b 8):
#  - the two rates apply: poetx_lr 0 with lr 1e-2 leaves every packed Q at exactly 0 while the
#    embeddings move; lr 0 with poetx_lr 1e-2 moves the Q's and leaves every other trained tensor
#    as it was (the checkpoints of steps 1 and 4 read with a safetensors reader written here);
#  - metrics.jsonl's poetx_lr is the schedule of lr scaled (poetx_lr / lr at every step of the
#    warmup and the decay), and poetx_lr -1 (the default) is lr itself;
#  - the clip ramp: the threshold of every step as metrics.jsonl logs it equals the formula
#    computed here (merges every 4, ramp 3 from 0.2 of grad_clip 0.5); the losses equal a run
#    without the ramp up to the first step after the first merge and not after;
#  - poetx_adam_restart 0 equals 1 up to the first merge's next update and differs after;
#  - resume is bit-exact across merges with the new keys (and 8-bit optimizer state): 8 steps
#    straight against 3 + 5, the same losses and byte-identical final checkpoints;
#  - a resume changing poetx_lr, poetx_clip_ramp or poetx_adam_restart is refused naming it;
#  - bad values refused before a run directory exists, naming the key.
set -u
. "$(dirname "$0")/lib_method_cli.sh"
method_begin poetx_lr
command -v python3 >/dev/null || { echo "no python3: skipped"; exit 77; }
poet="--method poetx --poetx_block 8 --poetx_terms 4 --warmup_steps 2"
ck() { echo "$1/checkpoints/step_0000000$2/model.safetensors"; }
# st.py A B MODE: tensors of two safetensors files compared; MODE q0 (every *poet_q* tensor of B all
# zero, every other trained tensor moved from A), frozen (every *poet_q* tensor of B nonzero, every
# tensor but Q's, W0's and the permutations equal in A and B)
cat >"$T/st.py" <<'PY'
import json, struct, sys
from array import array
def load(p):
    b = open(p, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + n])
    out = {}
    for k, v in h.items():
        if k == "__metadata__": continue
        s, e = v["data_offsets"]
        raw = b[8 + n + s:8 + n + e]
        out[k] = (v["dtype"], array("f", raw) if v["dtype"] == "F32" else raw)
    return out
a, b, mode = load(sys.argv[1]), load(sys.argv[2]), sys.argv[3]
q = [k for k in b if ".poet_q" in k]
other = [k for k in b if ".poet_q" not in k and b[k][0] == "F32" and k in a and not k.endswith("poet_w0") and "perm" not in k]
bad = []
if not q or not other: bad.append("no Q (%d) or no other tensors (%d)" % (len(q), len(other)))
for k in q:
    nz = sum(1 for x in b[k][1] if x != 0)
    if (mode == "q0") != (nz == 0): bad.append("%s: %d nonzero" % (k, nz))
moved = [k for k in other if a[k][1] != b[k][1]]
if mode == "q0" and "wte.weight" not in " ".join(moved): bad.append("the embeddings did not move: %s" % moved)
if mode == "frozen" and moved: bad.append("moved at lr 0: %s" % moved)
print("%s: %d Q tensors, %d others (%d moved)%s" % (mode, len(q), len(other), len(moved), "; " + "; ".join(bad[:4]) if bad else ""))
sys.exit(1 if bad else 0)
PY

# --- the two rates (no merge in 4 steps)
"$S" train --model gpt2-tiny $tiny $poet --steps 4 --ckpt_every 1 --keep_checkpoints 0 --poetx_merge_every 100 \
  --lr 1e-2 --poetx_lr 0 --run_dir "$T/q0" >"$T/q0.out" 2>&1
rc=$?
python3 "$T/st.py" "$(ck "$T/q0" 1)" "$(ck "$T/q0" 4)" q0 >"$T/q0.st" 2>&1
prc=$?
check '[ $rc -eq 0 ] && [ $prc -eq 0 ]' "poetx_lr 0: Q stays 0, the embeddings move: $(cat "$T/q0.st"; tail -1 "$T/q0.out")"
"$S" train --model gpt2-tiny $tiny $poet --steps 4 --ckpt_every 1 --keep_checkpoints 0 --poetx_merge_every 100 \
  --lr 0 --poetx_lr 1e-2 --run_dir "$T/fr" >"$T/fr.out" 2>&1
rc=$?
python3 "$T/st.py" "$(ck "$T/fr" 1)" "$(ck "$T/fr" 4)" frozen >"$T/fr.st" 2>&1
prc=$?
check '[ $rc -eq 0 ] && [ $prc -eq 0 ]' "lr 0: Q moves, nothing else: $(cat "$T/fr.st"; tail -1 "$T/fr.out")"

# --- the schedule on both rates: 12 steps, warmup 2, cosine; poetx_lr 3x lr; the default is lr
"$S" train --model gpt2-tiny $tiny $poet --steps 12 --poetx_merge_every 4 --lr 2e-3 --poetx_lr 6e-3 \
  --run_dir "$T/sch" >"$T/sch.out" 2>&1
check '[ $? -eq 0 ] && jq -e -s "length == 12 and all(.[]; (.poetx_lr / .lr - 3 | fabs) < 1e-5) and (.[0].lr < .[1].lr) and (.[11].lr < .[5].lr)" "$T/sch/metrics.jsonl" >/dev/null' \
  "poetx_lr on lr's schedule: $(jq -c "[.lr, .poetx_lr]" "$T/sch/metrics.jsonl" 2>/dev/null | tr '\n' ' ' | head -c 300)"
"$S" train --model gpt2-tiny $tiny $poet --steps 3 --lr 2e-3 --run_dir "$T/def" >"$T/def.out" 2>&1
check '[ $? -eq 0 ] && jq -e -s "all(.[]; .poetx_lr == .lr)" "$T/def/metrics.jsonl" >/dev/null && grep -q "\"poetx_lr\": *-1" "$T/def/config.json"' \
  "poetx_lr -1 (default) is lr, recorded in config.json: $(grep poetx_lr "$T/def/config.json")"

# --- the clip ramp: merges after 4, 8; steps 5-7 and 9-11 at 0.2, 0.4667, 0.7333 of 0.5
ramp="--poetx_merge_every 4 --grad_clip 0.5 --lr 1e-2 --steps 12"
"$S" train --model gpt2-tiny $tiny $poet $ramp --poetx_clip_ramp 3 --poetx_clip_start 0.2 --run_dir "$T/ramp" >"$T/ramp.out" 2>&1
rc=$?
cat >"$T/ramp.py" <<'PY'
import json, sys
every, n, f, g = 4, 3, 0.2, 0.5
bad = []
for l in open(sys.argv[1]):
    d = json.loads(l); s = d["step"]
    j = (s - 1) % every + 1
    want = g if s <= every or j > n else g * (f + (1 - f) * (j - 1) / n)
    if abs(d["grad_clip"] - want) > 1e-6 * want: bad.append("step %d: %g, want %g" % (s, d["grad_clip"], want))
print("; ".join(bad) or "ok"); sys.exit(1 if bad else 0)
PY
python3 "$T/ramp.py" "$T/ramp/metrics.jsonl" >"$T/ramp.chk" 2>&1
prc=$?
check '[ $rc -eq 0 ] && [ $prc -eq 0 ]' "the clip threshold per step: $(cat "$T/ramp.chk"; tail -1 "$T/ramp.out")"
"$S" train --model gpt2-tiny $tiny $poet $ramp --run_dir "$T/noramp" >"$T/noramp.out" 2>&1
r=$(losses "$T/ramp"); nr=$(losses "$T/noramp")
check '[ "$(echo $r | cut -d" " -f1-5)" = "$(echo $nr | cut -d" " -f1-5)" ] && [ "$(echo $r | cut -d" " -f6-)" != "$(echo $nr | cut -d" " -f6-)" ]' \
  "the ramp changes the losses from step 6 (the update of step 5 clipped) and not before: $r against $nr"

# --- poetx_adam_restart 0: the same up to the update after the merge at 4
"$S" train --model gpt2-tiny $tiny $poet $ramp --poetx_adam_restart 0 --run_dir "$T/keep" >"$T/keep.out" 2>&1
k=$(losses "$T/keep")
check '[ "$(echo $k | cut -d" " -f1-5)" = "$(echo $nr | cut -d" " -f1-5)" ] && [ "$(echo $k | cut -d" " -f6-)" != "$(echo $nr | cut -d" " -f6-)" ]' \
  "poetx_adam_restart 0 changes the losses from step 6 and not before: $k against $nr"

# --- resume across merges with the new keys, f32 and 8-bit state
for st in f32 8bit; do
  keys="$poet --poetx_merge_every 3 --lr 1e-2 --poetx_lr 3e-2 --poetx_clip_ramp 2 --poetx_clip_start 0.3 --optim_state $st"
  "$S" train --model gpt2-tiny $tiny $keys --steps 8 --ckpt_every 3 --run_dir "$T/a$st" >"$T/a$st.out" 2>&1
  "$S" train --model gpt2-tiny $tiny $keys --steps 8 --ckpt_every 3 --stop_at 3 --run_dir "$T/b$st" >"$T/b$st.out" 2>&1
  "$S" train --resume "$T/b$st" --stop_at 0 >"$T/b2$st.out" 2>&1
  rc=$?
  check '[ $rc -eq 0 ] && [ "$(losses "$T/b$st")" = "$(losses "$T/a$st")" ] && [ -f "$(ck "$T/a$st" 8)" ] && cmp -s "$(ck "$T/a$st" 8)" "$(ck "$T/b$st" 8)"' \
    "$st: 3 + 5 resumed over the merge at 6 equals 8 straight (rc $rc): $(losses "$T/b$st") against $(losses "$T/a$st"); $(tail -1 "$T/b2$st.out")"
done
resume_refused "$T/bf32" poetx_lr --poetx_lr 1e-2
resume_refused "$T/bf32" poetx_clip_ramp --poetx_clip_ramp 0
resume_refused "$T/bf32" poetx_clip_start --poetx_clip_start 0.5
resume_refused "$T/bf32" poetx_adam_restart --poetx_adam_restart 0

# --- bad values: refused before a run directory exists, naming the key
bad="--model gpt2-tiny $tiny --steps 2 $poet"
refused lr_neg "$bad --poetx_lr -0.5" "poetx_lr" "-1"
refused lr_big "$bad --poetx_lr 11" "poetx_lr" "10"
refused ramp_long "$bad --poetx_merge_every 3 --poetx_clip_ramp 4" "poetx_clip_ramp" "poetx_merge_every"
refused ramp_noclip "$bad --poetx_clip_ramp 2 --grad_clip 0" "poetx_clip_ramp" "grad_clip"
refused start0 "$bad --poetx_clip_start 0" "poetx_clip_start" "outside"
refused restart2 "$bad --poetx_adam_restart 2" "poetx_adam_restart" "outside"
# POET-X's keys with another method: refused naming the key, not recorded and ignored
refused full_lr "--model gpt2-tiny $tiny --steps 2 --poetx_lr 1e-2" "poetx_lr" "method poetx"
refused lora_ramp "--model gpt2-tiny $tiny --steps 2 --method lora --poetx_clip_ramp 2" "poetx_clip_ramp" "method poetx"

method_end poetx_lr
