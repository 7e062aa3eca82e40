#!/usr/bin/env bash
# test_poetx_w0_layout.sh - POET-X holds W0 pre-permuted (W0'[r][c] = W0[perm_out[r]][perm_in[c]],
# metadata poetx_w0_layout "permuted"); files written before that hold W0 in the base's layout
# without the key, and must still resume (strata permutes them at load):
#  - gpt2-tiny (Conv1D, stored (in, out)) fp32 and bf16, llama-tiny (stored (out, in)) fp32: a
#    run stopped right after the merge at 3, its checkpoint's W0 rewritten into the base's layout
#    with the key dropped (by the script below, from the file's own permutations: an independent
#    reference of the layout), resumed: the same losses as the straight run and a byte-identical
#    final checkpoint (the permutation is exact in fp32 and bf16);
#  - the same with the trained vector on disk (state_paths): the W0 file of the merge at 3
#    rewritten so, resumed at 5 over the merge at 6;
#  - the rewritten file really differs, and a file with an unknown poetx_w0_layout is refused
#    naming the key;
#  - strata sample --from a POET-X run draws what its save_hf model draws (one seed), stopped
#    between merges and right after one.
set -u
. "$(dirname "$0")/lib_method_cli.sh"
method_begin poetx-w0-layout
command -v python3 >/dev/null || { echo "no python3: skipped"; exit 77; }
poet="$tiny --method poetx --poetx_terms 4 --poetx_merge_every 3 --lr 1e-2 --warmup_steps 2 --steps 8 --ckpt_every 3"
ck() { echo "$1/checkpoints/step_$(printf %08d "$2")/model.safetensors"; }

# old_layout FILE [LAYOUT]: W0' of every weight back in the base's layout, poetx_w0_layout dropped
# (or set to LAYOUT), the data's checksum written anew, in place
old_layout() {
  python3 - "$1" "${2:-}" <<'EOF'
import array, json, struct, sys
path, lay = sys.argv[1], sys.argv[2]
with open(path, "rb") as f:
    n = struct.unpack("<Q", f.read(8))[0]
    h = json.loads(f.read(n))
    data = bytearray(f.read())
meta = h.get("__metadata__", {})
if meta.get("poetx_w0_layout") != "permuted":
    sys.exit("%s: no poetx_w0_layout permuted" % path)
if lay: meta["poetx_w0_layout"] = lay
else: del meta["poetx_w0_layout"]
def arr(name, code):
    a, b = h[name]["data_offsets"]
    x = array.array(code)
    x.frombytes(bytes(data[a:b]))
    return x
done = 0
for k in list(h):
    if not k.endswith(".perm_in"): continue
    w = k[:-len(".perm_in")]
    pin, pout = arr(k, "i"), arr(w + ".perm_out", "i")
    e = h[w + ".weight"]
    code = {"F32": "I", "BF16": "H"}[e["dtype"]]
    W = arr(w + ".weight", code)
    out = array.array(code, bytes(len(W) * W.itemsize))
    ni, no = len(pin), len(pout)
    conv1d = e["shape"] == [ni, no] and not w.startswith("model.")  # GPT-2 stores (in, out)
    for r in range(no):
        for c in range(ni):
            if conv1d: out[pin[c] * no + pout[r]] = W[c * no + r]
            else: out[pout[r] * ni + pin[c]] = W[r * ni + c]
    a, b = e["data_offsets"]
    data[a:b] = out.tobytes()
    done += 1
if not done: sys.exit("%s: no W0" % path)
if "strata_data_crc32c" in meta:  # the data section's CRC-32C (Castagnoli), as strata records it
    t = []
    for i in range(256):
        c = i
        for _ in range(8): c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        t.append(c)
    c = 0xFFFFFFFF
    for x in data: c = t[(c ^ x) & 0xFF] ^ (c >> 8)
    meta["strata_data_crc32c"] = "%08x" % (c ^ 0xFFFFFFFF)
hb = json.dumps(h).encode()
hb += b" " * (-len(hb) % 8)
with open(path, "wb") as f:
    f.write(struct.pack("<Q", len(hb)) + hb + bytes(data))
EOF
}

for v in gpt2-f32 gpt2-bf16 llama-f32; do
  case $v in
    gpt2-f32) m="--model gpt2-tiny --poetx_block 8" ;;
    gpt2-bf16) m="--model gpt2-tiny --poetx_block 8 --frozen_dtype bf16" ;;
    llama-f32) m="--model llama-tiny --poetx_block 8" ;;
  esac
  "$S" train $poet $m --run_dir "$T/$v" >"$T/$v.out" 2>&1
  "$S" train $poet $m --stop_at 3 --run_dir "$T/$v-old" >"$T/$v-old.1" 2>&1
  f=$(ck "$T/$v-old" 3)
  cp "$f" "$T/$v.new.safetensors"
  old_layout "$f"
  check '[ $? -eq 0 ] && ! cmp -s "$f" "$T/$v.new.safetensors"' "$v: the checkpoint at 3 rewritten in the old layout"
  "$S" train --resume "$T/$v-old" --stop_at 0 >"$T/$v-old.2" 2>&1
  rc=$?
  check '[ $rc -eq 0 ] && [ "$(losses "$T/$v-old")" = "$(losses "$T/$v")" ] && cmp -s "$(ck "$T/$v" 8)" "$(ck "$T/$v-old" 8)"' \
    "$v: resumed from an old-layout checkpoint (rc $rc): losses $(losses "$T/$v-old") against $(losses "$T/$v"), final checkpoints $(cmp -s "$(ck "$T/$v" 8)" "$(ck "$T/$v-old" 8)" && echo equal || echo differ)"
done

# an unknown layout refused, naming the key
"$S" train $poet --model gpt2-tiny --poetx_block 8 --stop_at 3 --run_dir "$T/bad" >"$T/bad.1" 2>&1
old_layout "$(ck "$T/bad" 3)" transposed
"$S" train --resume "$T/bad" --stop_at 0 >"$T/bad.2" 2>&1
rc=$?
check '[ $rc -ne 0 ] && grep -q "poetx_w0_layout" "$T/bad.2"' "an unknown poetx_w0_layout refused naming it (rc $rc): $(tail -1 "$T/bad.2")"

# the disk state: the W0 file of the merge at 3 in the old layout, resumed at 5 over the merge at 6
m="--model gpt2-tiny --poetx_block 8"
mkdir -p "$T/sp" "$T/spo"
"$S" train $poet $m --state_paths "$T/sp" --run_dir "$T/disk" >"$T/disk.out" 2>&1
"$S" train $poet $m --state_paths "$T/spo" --stop_at 5 --run_dir "$T/disk-old" >"$T/disk-old.1" 2>&1
w=$(ls "$T"/spo/strata-state.poetx-w0-000000003.safetensors "$T"/spo/*/strata-state.poetx-w0-000000003.safetensors 2>/dev/null | head -1)
check '[ -n "$w" ]' "the disk state's W0 file of the merge at 3 ($(ls -R "$T/spo" | tr '\n' ' '))"
[ -n "$w" ] && old_layout "$w"
"$S" train --resume "$T/disk-old" --stop_at 0 >"$T/disk-old.2" 2>&1
rc=$?
check '[ $rc -eq 0 ] && [ "$(losses "$T/disk-old")" = "$(losses "$T/disk")" ] && cmp -s "$T/disk/model.safetensors" "$T/disk-old/model.safetensors"' \
  "disk state resumed from an old-layout W0 file (rc $rc): losses $(losses "$T/disk-old") against $(losses "$T/disk"); $(tail -1 "$T/disk-old.2")"
# strata sample from a POET-X run reads the merged model (R W0 P folded, W0 out of its frame): the
# tokens of its save_hf directory's at temperature 1 and one seed; and a run stopped right after a merge (Q = 0) too;
# llama-tiny, and W0 held in bf16 (the base's given-back pages filled again with the merged W)
for st in 4 3 4l 4b; do
  m="--model gpt2-tiny --poetx_block 8"
  case $st in 4l) m="--model llama-tiny --poetx_block 8" ;; 4b) m="$m --frozen_dtype bf16" ;; esac
  "$S" train $poet $m --stop_at ${st%[lb]} --save_hf "$T/s$st.hf" --run_dir "$T/s$st" >"$T/s$st.out" 2>&1
  a=$("$S" sample --from "$T/s$st" --max_new 15 --seed 5 2>"$T/s$st.a")
  b=$("$S" sample --from "$T/s$st.hf" --max_new 15 --seed 5 2>"$T/s$st.b")
  check '[ -n "$a" ] && [ "$a" = "$b" ]' "sample from the run stopped at $st ('$a'; $(tail -n 1 "$T/s$st.a")) against its save_hf ('$b')"
done
method_end poetx-w0-layout
