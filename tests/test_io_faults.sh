#!/usr/bin/env bash
# test_io_faults.sh - an I/O fault at any write (or read) site ends the command with a
# clear error naming the file, and the previous consistent state stays intact and
# loadable: the last checkpoint (a resume then ends bit-identical to an uninterrupted
# run), the last committed step of the disk state store, the dataset being replaced.
# Faults come from STRATA_IOFAULT=OP:KIND[:N][@TEXT] (strata/core.h: st_iofault); the
# script first lists every OP the sources inject at and fails if one has no case here.
set -u
S=${STRATA_BIN:?STRATA_BIN not set}
SRC=${STRATA_SOURCE_DIR:?STRATA_SOURCE_DIR not set}
T=$(mktemp -d /tmp/strata-test-iofault-XXXXXX)
fail=0 cases=0
check() { if ! eval "$1"; then echo "FAIL: $2"; fail=1; fi; }
A="--model gpt2-mini --batch 2 --seq 32 --quiet 1 --eval_every 0 --sample_every 0"
loss_at() { sed -n "s/^{\"step\":$2,\"loss\":\([^,]*\),.*/\1/p" "$1/metrics.jsonl" | tail -n 1; }

# every injection site in the sources must have a case below
OPS_COVERED="file.open file.write file.fsync file.rename file.read io.write io.read io.sync"
for op in $(grep -rhoE 'st_iofault\("[a-z._]+"' "$SRC/src" | sed 's/.*("\(.*\)"/\1/' | sort -u); do
  case " $OPS_COVERED " in *" $op "*) ;; *) echo "FAIL: injection site '$op' in src/ has no case in this test"; fail=1 ;; esac
done

# the reference: 4 steps, checkpoint every 2
"$S" train $A --steps 4 --ckpt_every 2 --run_dir "$T/ref" >"$T/ref.out" 2>&1
check '[ $? -eq 0 ]' "reference run: $(tail -2 "$T/ref.out")"
ref4=$(loss_at "$T/ref" 4)
# a base to copy: stopped after step 2's checkpoint
"$S" train $A --steps 4 --ckpt_every 2 --stop_at 2 --run_dir "$T/base" >"$T/base.out" 2>&1
check '[ $? -eq 0 ] && [ -f "$T/base/checkpoints/step_00000002/model.safetensors" ]' "base run: $(tail -2 "$T/base.out")"

# checkpoint writes, metrics, TensorBoard events, trace: step 3..4 with a fault, then a clean resume
ckpt_case() { # FAULT TEXT-EXPECTED-IN-ERROR [extra args]
  local fault=$1 want=$2; shift 2
  local d="$T/c$cases"; cases=$((cases + 1))
  cp -r "$T/base" "$d"
  STRATA_IOFAULT=$fault "$S" train $A --steps 4 --ckpt_every 2 --run_dir "$d" --resume "$d" "$@" >"$d.1.out" 2>&1
  local rc=$?
  check '[ $rc -ne 0 ] && grep -q -- "$want" "$d.1.out"' "$fault: rc $rc, no error naming '$want': $(tail -2 "$d.1.out")"
  check 'grep -q "^step_0000000[24]$" "$d/checkpoints/latest"' "$fault: checkpoints/latest lost: $(cat "$d/checkpoints/latest")"
  "$S" train $A --steps 4 --ckpt_every 2 --run_dir "$d" --resume "$d" >"$d.2.out" 2>&1
  rc=$?
  check '[ $rc -eq 0 ] && [ "$(loss_at "$d" 4)" = "$ref4" ]' \
    "$fault: resume after the fault: rc $rc, step 4 loss '$(loss_at "$d" 4)' vs '$ref4': $(tail -2 "$d.2.out")"
}
ckpt_case "file.open:eio@model.safetensors" "model.safetensors"
ckpt_case "file.write:enospc@model.safetensors" "No space left"
ckpt_case "file.write:short@train_state.bin" "train_state.bin"
ckpt_case "file.fsync:eio@train_state.bin" "train_state.bin"
ckpt_case "file.rename:eio@/model.safetensors" "model.safetensors"
ckpt_case "file.rename:enospc@checkpoints/latest" "latest"
ckpt_case "file.write:enospc@metrics.jsonl" "metrics.jsonl"
ckpt_case "file.write:eio@events.out.tfevents" "events.out.tfevents"
ckpt_case "file.write:enospc@trace.json" "trace.json" --trace 1

# the per-step append to metrics.jsonl in a fresh run (no checkpoint yet: nothing to keep)
cases=$((cases + 1))
STRATA_IOFAULT="file.write:enospc:2@metrics.jsonl" "$S" train $A --steps 4 --run_dir "$T/m" >"$T/m.out" 2>&1
rc=$?
check '[ $rc -ne 0 ] && grep -q "metrics.jsonl: cannot write step 2.s metrics: No space left" "$T/m.out"' \
  "metrics append fault: rc $rc: $(tail -2 "$T/m.out")"
check '[ "$(wc -l <"$T/m/metrics.jsonl")" -eq 1 ]' "metrics append fault: step 1's line lost or step 2's half written"

# --save_hf: the error names the file; the run's last checkpoint is intact
d="$T/hf"; cp -r "$T/base" "$d"; cases=$((cases + 1))
STRATA_IOFAULT="file.write:enospc@hfout/model.safetensors" "$S" train $A --steps 4 --ckpt_every 2 --run_dir "$d" \
  --resume "$d" --save_hf "$T/hfout" >"$d.out" 2>&1
rc=$?
check '[ $rc -ne 0 ] && grep -q "hfout/model.safetensors" "$d.out"' "save_hf fault: rc $rc: $(tail -2 "$d.out")"
check '[ -f "$d/checkpoints/step_00000004/model.safetensors" ] && [ ! -e "$T/hfout/model.safetensors" ]' \
  "save_hf fault: checkpoint missing or a partial export left behind"

# the disk state store: a fault in a step's region writes, its fsync, the manifest's write or
# rename, the region reads, the manifest read at resume: the store stays at its last commit
SA="$A --state_budget 4000000"
"$S" train $SA --steps 8 --run_dir "$T/sref" >"$T/sref.out" 2>&1
check '[ $? -eq 0 ]' "store reference: $(tail -2 "$T/sref.out")"
sref8=$(loss_at "$T/sref" 8)
store_case() { # FAULT WANT
  local fault=$1 want=$2
  local d="$T/s$cases"; cases=$((cases + 1))
  mkdir -p "$d.st"
  "$S" train $SA --steps 8 --stop_at 3 --run_dir "$d" --state_paths "$d.st" >"$d.0.out" 2>&1
  STRATA_IOFAULT=$fault "$S" train $SA --steps 8 --run_dir "$d" --state_paths "$d.st" --resume "$d" >"$d.1.out" 2>&1
  local rc=$?
  check '[ $rc -ne 0 ] && grep -q -- "$want" "$d.1.out"' "$fault: rc $rc, no error naming '$want': $(tail -2 "$d.1.out")"
  "$S" train $SA --steps 8 --run_dir "$d" --state_paths "$d.st" --resume "$d" >"$d.2.out" 2>&1
  rc=$?
  check '[ $rc -eq 0 ] && [ "$(loss_at "$d" 8)" = "$sref8" ]' \
    "$fault: resume after the fault: rc $rc, step 8 loss '$(loss_at "$d" 8)' vs '$sref8': $(tail -2 "$d.2.out")"
}
store_case "io.write:eio:5@strata-state.bin" "strata-state.bin"
store_case "io.write:short:9@strata-state.bin" "short write"
store_case "io.sync:enospc:2@strata-state.bin" "strata-state.bin"
store_case "io.read:eio:4@strata-state.bin" "strata-state.bin"
store_case "io.read:short:2@strata-state.bin" "short read"
store_case "file.write:enospc:2@strata-state.manifest" "strata-state.manifest"
store_case "file.rename:eio@strata-state.manifest" "strata-state.manifest"
store_case "file.read:eio@strata-state.manifest" "strata-state.manifest"

# data pack replacing an existing dataset: every fault leaves the old pair byte for byte
printf 'first dataset\nsecond line\n' >"$T/a.txt"
printf 'a different text\n' >"$T/b.txt"
"$S" data pack -o "$T/pk" --split line "$T/a.txt" >"$T/pk.out" 2>&1
check '[ $? -eq 0 ]' "data pack: $(tail -2 "$T/pk.out")"
sums=$(md5sum <"$T/pk.bin")$(md5sum <"$T/pk.idx")
for fault in "file.write:enospc@pk.bin" "file.fsync:eio@pk.bin" "file.open:eio@pk.idx" "file.write:short@pk.idx" \
  "file.fsync:eio@pk.idx" "file.rename:eio@pk.bin" "file.rename:eio@pk.idx"; do
  cases=$((cases + 1))
  STRATA_IOFAULT=$fault "$S" data pack -o "$T/pk" --split line "$T/b.txt" >"$T/pk.f.out" 2>&1
  rc=$?
  check '[ $rc -ne 0 ] && grep -q "pk\.\(bin\|idx\)" "$T/pk.f.out"' "pack $fault: rc $rc: $(tail -2 "$T/pk.f.out")"
  check '[ "$(md5sum <"$T/pk.bin")$(md5sum <"$T/pk.idx")" = "$sums" ]' "pack $fault: the previous dataset changed"
  check '[ -z "$(ls "$T" | grep "^pk\..*\(tmp\|old\)")" ]' "pack $fault: temporaries left: $(ls "$T" | grep '^pk')"
done
"$S" data inspect "$T/pk" >"$T/pk.i.out" 2>&1
check '[ $? -eq 0 ]' "the dataset does not load after the faults: $(tail -2 "$T/pk.i.out")"

echo "$cases fault cases"
if [ $fail -eq 0 ]; then rm -rf "$T"; echo "io_faults: ok"; else echo "io_faults: FAILED (kept $T)"; fi
exit $fail
