#!/usr/bin/env bash
# test_tb_events.sh - the TensorBoard event file of a real short run: TensorBoard's own
# reader (the `tensorboard` package from PyPI, installed once into a venv under /tmp) gives
# every scalar of metrics.jsonl back, step by step, within float32 rounding; an independent
# CRC-32C check accepts every record and rejects a copy with one byte changed (which
# TensorBoard's reader then reads short); and an event file that cannot be created fails
# the run with a message naming it.
set -u
S=${STRATA_BIN:?}
SRC=${STRATA_SOURCE_DIR:?}
T=$(mktemp -d /tmp/strata-tb-XXXXXX)
trap 'rm -rf "$T"' EXIT
fail=0; checks=0
check() { checks=$((checks+1)); if ! eval "$1"; then echo "FAIL: $2"; fail=$((fail+1)); fi; }
command -v python3 >/dev/null || { echo "no python3: skipped"; exit 77; }

# TensorBoard's reader: a venv kept between runs (the first install takes about half a minute)
V=${STRATA_TB_VENV:-/tmp/strata-tb-venv}
PY="$V/bin/python"
# Each way this can fail is said as what it is: the venv (Debian's python3 makes one only
# with python3-venv installed) or the install from PyPI (the network, a proxy, the index).
if ! "$PY" -c "import tensorboard" 2>/dev/null; then
  rm -rf "$V"
  if ! python3 -m venv "$V" >"$T/venv.txt" 2>&1; then
    tail -n 5 "$T/venv.txt"
    echo "SKIP: python3 -m venv failed ($(command -v python3), the lines above): install python3-venv" \
         "(tools/setup.sh does), then run the test again"
    rm -rf "$V"
    exit 77
  fi
  if ! "$PY" -m pip install --quiet --disable-pip-version-check tensorboard >"$T/pip.txt" 2>&1; then
    tail -n 5 "$T/pip.txt"
    echo "SKIP: pip could not install the tensorboard package from PyPI into the venv $V" \
         "(the lines above say why: no route to pypi.org, a proxy, the index): TensorBoard's reader is needed"
    rm -rf "$V"
    exit 77
  fi
fi
CHECK="$SRC/tests/tb_events_check.py"

"$S" train --model gpt2-mini --n_layer 2 --n_embd 64 --n_head 2 --batch 2 --seq 32 --steps 5 --warmup_steps 2 \
  --quiet 1 --run_dir "$T/run" >"$T/train.txt" 2>&1
rc=$?
check '[ $rc -eq 0 ]' "training run ($(tail -n 3 "$T/train.txt"))"
ev=$(ls "$T/run"/events.out.tfevents.* 2>/dev/null | head -n 1)
check '[ -n "$ev" ] && [ -s "$ev" ]' "the run directory has an event file"
host=$(python3 -c 'import socket; print(socket.gethostname())')
check '[[ "$(basename "$ev")" =~ ^events\.out\.tfevents\.[0-9]{10}\.(.+)$ ]] && [ "${BASH_REMATCH[1]}" = "$host" ]' \
  "file name events.out.tfevents.<unix seconds>.$host ($(basename "$ev"))"
check '[ "$(wc -l < "$T/run/metrics.jsonl")" -eq 5 ]' "metrics.jsonl has 5 steps"

"$PY" "$CHECK" "$T/run" >"$T/cmp.txt" 2>&1
rc=$?
check '[ $rc -eq 0 ]' "every scalar equals metrics.jsonl ($(grep -v Warning "$T/cmp.txt" | tail -n 2))"
grep -v -i "tensorflow" "$T/cmp.txt"
"$PY" "$CHECK" --crc "$ev" >"$T/crc.txt" 2>&1
rc=$?
check '[ $rc -eq 0 ]' "every record's CRCs ($(tail -n 1 "$T/crc.txt"))"
cat "$T/crc.txt"

# one byte of the last record's data changed: the CRC check must see it, and TensorBoard's
# reader (which checks CRCs too) must stop before that step's scalars
mkdir -p "$T/bad"
cp "$T/run/metrics.jsonl" "$T/bad/"
cp "$ev" "$T/bad/"
bad="$T/bad/$(basename "$ev")"
size=$(stat -c %s "$bad")
python3 - "$bad" $((size - 10)) <<'PY'
import sys
p, off = sys.argv[1], int(sys.argv[2])
b = bytearray(open(p, "rb").read())
b[off] ^= 0x01
open(p, "wb").write(b)
PY
"$PY" "$CHECK" --crc "$bad" >"$T/crc_bad.txt" 2>&1
rc=$?
check '[ $rc -eq 1 ] && grep -q "data CRC mismatch" "$T/crc_bad.txt"' \
  "a changed byte fails the CRC check ($(tail -n 1 "$T/crc_bad.txt"))"
"$PY" "$CHECK" "$T/bad" >"$T/cmp_bad.txt" 2>&1
rc=$?
check '[ $rc -eq 1 ] && grep -q "differ from metrics.jsonl" "$T/cmp_bad.txt"' \
  "TensorBoard's reader drops the corrupted record ($(grep FAIL "$T/cmp_bad.txt" | head -c 200))"

# the event file cannot be created (a directory holds each name it could take in the next
# minute): the run fails and says which file
mkdir -p "$T/blocked"
now=$(date +%s)
for i in $(seq 0 60); do mkdir -p "$T/blocked/events.out.tfevents.$((now + i)).$host"; done
"$S" train --model gpt2-mini --n_layer 2 --n_embd 64 --n_head 2 --batch 2 --seq 32 --steps 2 --quiet 1 \
  --run_dir "$T/blocked" >"$T/blocked.txt" 2>&1
rc=$?
check '[ $rc -ne 0 ] && grep -q "events.out.tfevents.*cannot open the TensorBoard event file" "$T/blocked.txt"' \
  "an event file that cannot be opened fails the run, naming it (exit $rc: $(tail -n 1 "$T/blocked.txt"))"

echo "$checks checks, $fail failed"
[ $fail -eq 0 ]
