#!/usr/bin/env bash
# test_weights_integrity.sh - damaged weights are never trained on silently:
# - a flipped byte in a checkpoint's model.safetensors data is refused at resume, naming
#   the file and the checksum (strata records a CRC-32C of the data in the header);
# - a NaN weight (in a file without strata's checksum, as from elsewhere) is refused,
#   naming the tensor, LoRA's and POET-X's int8 base from a Hugging Face directory too (checked as
#   read);
# - weights that make every gradient non-finite (a huge but finite value) stop the run
#   after max_skipped_steps consecutive skipped steps with an error, not exit 0;
# - metrics.jsonl stays JSON (a non-finite loss or norm is null, never a bare nan).
set -u
S=${STRATA_BIN:?STRATA_BIN not set}
T=$(mktemp -d /tmp/strata-test-weights-XXXXXX)
fail=0
check() { if ! eval "$1"; then echo "FAIL: $2"; fail=1; fi; }
A="--model gpt2-mini --batch 2 --seq 32 --quiet 1 --eval_every 0 --sample_every 0"
"$S" train $A --steps 2 --run_dir "$T/base" >"$T/base.out" 2>&1
rc=$?
check '[ $rc -eq 0 ]' "base run: $(tail -2 "$T/base.out")"
CK=checkpoints/step_00000002/model.safetensors

# edit PATH's tensor NAME element 0 to VALUE ("flip": xor one byte of the data instead);
# "strip" drops the __metadata__ checksum, as a file written elsewhere would have none
edit() {
  /usr/bin/python3 - "$@" <<'PY'
import json, struct, sys
path, name, value, strip = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4] == "strip"
b = bytearray(open(path, "rb").read())
n = struct.unpack("<Q", b[:8])[0]
h = json.loads(b[8:8 + n])
data = b[8 + n:]
if value == "flip":
    data[len(data) // 2] ^= 0x10
else:
    off = h[name]["data_offsets"][0]
    data[off:off + 4] = struct.pack("<f", float(value))
if strip:
    h.pop("__metadata__", None)
hj = json.dumps(h, separators=(",", ":")).encode()
hj += b" " * ((8 - len(hj) % 8) % 8)
open(path, "wb").write(struct.pack("<Q", len(hj)) + hj + bytes(data))
PY
}

cp -r "$T/base" "$T/flip"
edit "$T/flip/$CK" x flip keep
"$S" train $A --steps 4 --run_dir "$T/flip" --resume "$T/flip" >"$T/flip.out" 2>&1
rc=$?
check '[ $rc -ne 0 ] && grep -q "model.safetensors: the data section .* CRC-32C" "$T/flip.out"' \
  "a flipped byte in the weights was not refused (rc $rc): $(tail -2 "$T/flip.out")"

cp -r "$T/base" "$T/nan"
edit "$T/nan/$CK" transformer.h.0.attn.c_attn.weight nan strip
"$S" train $A --steps 4 --run_dir "$T/nan" --resume "$T/nan" >"$T/nan.out" 2>&1
rc=$?
check '[ $rc -ne 0 ] && grep -q "tensor .*h.0.attn.c_attn.weight.* element 0 is NaN" "$T/nan.out"' \
  "a NaN weight was not refused naming its tensor (rc $rc): $(tail -2 "$T/nan.out")"

# LoRA over an int8 base from a Hugging Face directory: each tensor is checked as it is read,
# before a block weight is rounded into the store (a NaN would round to codes silently)
"$S" train $A --steps 1 --run_dir "$T/mkhf" --save_hf "$T/hf" >"$T/mkhf.out" 2>&1
edit "$T/hf/model.safetensors" transformer.h.1.mlp.c_fc.weight nan strip
"$S" train $A --steps 1 --method lora --frozen_dtype int8 --init_from "$T/hf" --model "" --run_dir "$T/lnan" \
  >"$T/lnan.out" 2>&1
rc=$?
check '[ $rc -ne 0 ] && grep -q "tensor .*h.1.mlp.c_fc.weight.* element 0 is NaN" "$T/lnan.out"' \
  "LoRA int8 over a NaN weight was not refused naming its tensor (rc $rc): $(tail -2 "$T/lnan.out")"
# POET-X's W0 from the same directory, checked as it is read too, before it goes into the store
"$S" train $A --steps 1 --method poetx --frozen_dtype int8 --init_from "$T/hf" --model "" --run_dir "$T/pnan" \
  >"$T/pnan.out" 2>&1
rc=$?
check '[ $rc -ne 0 ] && grep -q "tensor .*h.1.mlp.c_fc.weight.* element 0 is NaN" "$T/pnan.out"' \
  "POET-X int8 over a NaN weight was not refused naming its tensor (rc $rc): $(tail -2 "$T/pnan.out")"

cp -r "$T/base" "$T/huge"
edit "$T/huge/$CK" transformer.wte.weight 3e38 strip
"$S" train $A --steps 40 --max_skipped_steps 5 --run_dir "$T/huge" --resume "$T/huge" >"$T/huge.out" 2>&1
rc=$?
check '[ $rc -ne 0 ] && grep -q "steps 3 to 7 all had a non-finite gradient norm" "$T/huge.out"' \
  "non-finite steps without end: rc $rc: $(tail -2 "$T/huge.out")"
/usr/bin/python3 - "$T/huge/metrics.jsonl" >"$T/json.out" 2>&1 <<'PY'
import json, sys
lines = open(sys.argv[1]).read().splitlines()
rows = [json.loads(l) for l in lines]  # raises on a bare nan
assert [r["step"] for r in rows] == [1, 2, 3, 4, 5, 6, 7], [r["step"] for r in rows]
assert all(r["skipped"] for r in rows[2:]) and all(r["grad_norm"] is None for r in rows[2:]), rows[2:]
PY
check '[ $? -eq 0 ]' "metrics.jsonl is not valid JSON with null for non-finite values: $(tail -3 "$T/json.out")"

if [ $fail -eq 0 ]; then rm -rf "$T"; echo "weights_integrity: ok"; else echo "weights_integrity: FAILED (kept $T)"; fi
exit $fail
