#!/usr/bin/env bash
# test_data_score_proxy.sh - proxy-loss scores (strata data score --proxy) on real text with
# injected noise (tools/gen_noisy_corpus.py: paragraphs of this machine's licences, man pages
# and Python sources, plus 25% noise documents of four kinds). A small GPT-2 (2 layers, width
# 64, byte vocabulary) trained by strata for 1000 steps on the clean documents scores every
# document of the noisy corpus; a view that drops the duplicates (strata data dedup) and keeps
# the band [0, 0.85) of the proxy losses must remove >= 99% of the random and >= 90% of the
# shuffled documents, >= 99% of the exact and >= 90% of the near duplicates, and keep >= 95%
# of the clean ones (read from the view's ids against the corpus's labels). Packing with
# document attention: three documents scored together in one row get the scores each gets
# alone (a dataset of that one document). A proxy whose vocabulary does not cover the
# dataset's tokens is refused naming the .bin, the token and the vocabulary, and leaves no
# score file. On every 10th document of the noisy corpus (scored several times): scoring
# again gives the same file; reducible loss (--reference), the proxy minus a 100-step
# reference, is document by document exactly the difference of the two score files, the
# proxy minus itself 0 everywhere; --reference without --proxy refused, no file.
set -u
. "$(dirname "$0")/lib_corpus.sh"
corpus_begin proxy
corpus_noisy

# the proxy: byte tokens are 0..255 and the packer's end-of-document 256, so vocabulary 320
proxy="--model gpt2-mini --n_layer 2 --n_embd 64 --n_head 2 --vocab_size 320 --batch 16 --seq 64"
"$S" train $proxy --steps 1000 --lr 3e-3 --warmup_steps 50 --eval_every 0 --quiet 1 --threads 2 --seed 1 \
  --data "$T/clean" --run_dir "$T/proxy" > "$T/train.out" 2>&1
rc=$?
check '[ $rc -eq 0 ]' "training the proxy (rc $rc): $(tail -3 "$T/train.out")"

"$S" data score "$T/noisy" --proxy "$T/proxy" -o "$T/noisy.proxy" --batch 16 --seq 64 --threads 2 \
  > "$T/score.out" 2> "$T/score.err"
rc=$?
check '[ $rc -eq 0 ] && grep -q "4000 proxy-loss scores" "$T/score.out" && grep -q "score: 4000/4000 documents" "$T/score.err"' \
  "score --proxy (rc $rc): $(cat "$T/score.out" "$T/score.err")"
echo "data_score_proxy: $(cat "$T/score.out")"
"$S" data inspect "$T/noisy.proxy" --json > "$T/insp.json" 2>&1
check 'grep -q "\"kind\": \"proxy\"" "$T/insp.json"' "inspect: $(cat "$T/insp.json")"

# every 10th document of the noisy corpus (400, all kinds): the checks below score it several
# times, which over the whole corpus would cost 5 passes of the proxy's forward
python3 - "$T" <<'EOF'
import struct, sys
from strata_megatron import write
t = sys.argv[1]
b = open(t + "/noisy.idx", "rb").read()
ver, code, n, _ = struct.unpack_from("<QBQQ", b, 9)
assert b[:9] == b"MMIDIDX\x00\x00" and code == 8, "noisy.idx: not a uint16 Megatron index"
o = 9 + struct.calcsize("<QBQQ")
sizes = struct.unpack_from("<%di" % n, b, o)
ptrs = struct.unpack_from("<%dq" % n, b, o + 4 * n)
tok = open(t + "/noisy.bin", "rb").read()
write(t + "/tenth", [list(struct.unpack_from("<%dH" % sizes[i], tok, ptrs[i])) for i in range(0, n, 10)])
EOF
check '[ -s "$T/tenth.idx" ]' "writing every 10th document of the noisy corpus"
# scoring again gives the same file
"$S" data score "$T/tenth" --proxy "$T/proxy" -o "$T/tenth.proxy" --batch 16 --seq 64 --threads 2 --quiet > /dev/null 2>&1
"$S" data score "$T/tenth" --proxy "$T/proxy" -o "$T/again.proxy" --batch 16 --seq 64 --threads 2 --quiet > /dev/null 2>&1
check '[ -s "$T/tenth.proxy" ] && cmp -s "$T/tenth.proxy" "$T/again.proxy"' "scoring twice gives two different score files"

# reducible loss (--reference): the proxy's loss minus a reference's, document by document,
# exactly the difference of the two proxy-score files; the proxy against itself is 0 everywhere
"$S" train $proxy --steps 100 --lr 3e-3 --warmup_steps 10 --eval_every 0 --quiet 1 --threads 2 --seed 2 \
  --data "$T/clean" --run_dir "$T/ref" > "$T/ref.out" 2>&1
rc=$?
check '[ $rc -eq 0 ]' "training the reference (rc $rc): $(tail -3 "$T/ref.out")"
"$S" data score "$T/tenth" --proxy "$T/ref" -o "$T/ref.proxy" --batch 16 --seq 64 --threads 2 --quiet > /dev/null 2>&1
"$S" data score "$T/tenth" --proxy "$T/proxy" --reference "$T/ref" -o "$T/tenth.red" --batch 16 --seq 64 --threads 2 \
  --quiet --json > "$T/red.json" 2>&1
rc=$?
check '[ $rc -eq 0 ] && grep -q "\"kind\": \"reducible\"" "$T/red.json"' "score --reference (rc $rc): $(cat "$T/red.json")"
"$S" data score "$T/tenth" --proxy "$T/proxy" --reference "$T/proxy" -o "$T/self.red" --batch 16 --seq 64 --threads 2 \
  --quiet > /dev/null 2>&1
python3 - "$T" > "$T/red.out" 2>&1 <<'EOF'
import struct, sys
t = sys.argv[1]
def scores(name):
    b = open("%s/%s" % (t, name), "rb").read()
    hb = struct.unpack_from("<I", b, 12)[0]
    n = struct.unpack_from("<Q", b, 16 + 48)[0]
    kind = b[16 + 56:16 + 56 + 32].split(b"\0")[0].decode()
    return kind, struct.unpack_from("<%dd" % n, b, hb)
kp, p = scores("tenth.proxy")
kr, r = scores("ref.proxy")
kd, d = scores("tenth.red")
ks, z = scores("self.red")
assert kp == kr == "proxy" and kd == ks == "reducible", (kp, kr, kd, ks)
assert len(p) == len(r) == len(d) == len(z) == 400, (len(p), len(r), len(d), len(z))
bad = [i for i in range(len(p)) if d[i] != p[i] - r[i]]
assert not bad, "document %d: reducible %r, proxy %r minus reference %r" % (bad[0], d[bad[0]], p[bad[0]], r[bad[0]])
assert all(x == 0.0 for x in z), "the proxy minus itself is not 0 everywhere"
assert min(d) < 0, "the 1000-step proxy predicts no document better than the 100-step reference"
print("reducible: 400 documents equal proxy minus reference; mean %.4f" % (sum(d) / len(d)))
EOF
rc=$?
check '[ $rc -eq 0 ]' "$(cat "$T/red.out")"
"$S" data score "$T/noisy" --reference "$T/ref" -o "$T/x.red" > "$T/noproxy.out" 2>&1
rc=$?
check '[ $rc -eq 2 ] && grep -q "needs --proxy" "$T/noproxy.out" && [ ! -e "$T/x.red" ]' \
  "--reference without --proxy (rc $rc): $(cat "$T/noproxy.out")"

"$S" data dedup "$T/noisy" -o "$T/noisy.dedup" --threads 2 > /dev/null 2>&1
"$S" data select "$T/noisy" -o "$T/sel.view" --scores "$T/noisy.proxy" --keep band 0 0.85 \
  --drop_duplicates "$T/noisy.dedup" > "$T/sel.out" 2>&1
rc=$?
check '[ $rc -eq 0 ]' "select (rc $rc): $(cat "$T/sel.out")"
python3 - "$T/noisy.labels" "$T/sel.view" > "$T/eval.out" 2>&1 <<'EOF'
import struct, sys
labels = {}
for line in open(sys.argv[1]):
    i, kind, _ = line.split()
    labels[int(i)] = kind
b = open(sys.argv[2], "rb").read()
assert b[:8] == b"STRATAVW", "not a view"
hdr = struct.unpack_from("<I", b, 12)[0]
n = struct.unpack_from("<Q", b, 16 + 48)[0]          # after the magic, version, size and identity
ids = set(struct.unpack_from("<%dQ" % n, b, hdr))
total, kept = {}, {}
for i, kind in labels.items():
    total[kind] = total.get(kind, 0) + 1
    kept[kind] = kept.get(kind, 0) + (i in ids)
removed = {k: 1 - kept[k] / total[k] for k in total}
print(" ".join("%s removed %d/%d" % (k, total[k] - kept[k], total[k]) for k in sorted(total)))
ok = (removed["random"] >= 0.99 and removed["shuffled"] >= 0.90 and removed["exact"] >= 0.99 and
      removed["near"] >= 0.90 and 1 - removed["clean"] >= 0.95)
sys.exit(0 if ok else 1)
EOF
rc=$?
check '[ $rc -eq 0 ]' "selection: $(cat "$T/eval.out") (need random >= 99%, shuffled >= 90%, exact >= 99%, near >= 90% removed, clean >= 95% kept)"
echo "data_score_proxy: $(cat "$T/eval.out")"

# packing: three documents in one row score as each does alone
python3 - "$T" <<'EOF'
import sys
from strata_megatron import write
t = sys.argv[1]
texts = [b"The licence grants permission to copy.", b"Permission is hereby granted, free of charge, to any",
         b"NAME ls - list"]
docs = [list(x) for x in texts]
write(t + "/three", docs)
for i, d in enumerate(docs):
    write(t + "/one%d" % i, [d])
EOF
sc() { "$S" data score "$T/$1" --proxy "$T/proxy" -o "$T/$1.proxy" --batch 1 --seq 128 --quiet > /dev/null 2>&1 &&
       "$S" data inspect "$T/$1.proxy" --docs 10 | sed -n 's/^  document \([0-9]*\): score \([^ ]*\).*/\2/p'; }
sc three > "$T/three.txt"
for i in 0 1 2; do sc one$i; done > "$T/alone.txt"
check 'python3 -c "import sys; a=[float(x) for x in open(sys.argv[1])]; b=[float(x) for x in open(sys.argv[2])]; \
  sys.exit(0 if len(a)==3 and len(b)==3 and all(abs(x-y)<=1e-5*abs(y) for x,y in zip(a,b)) else 1)" "$T/three.txt" "$T/alone.txt"' \
  "packed scores $(tr '\n' ' ' < "$T/three.txt")differ from the documents alone $(tr '\n' ' ' < "$T/alone.txt")"

# a proxy of vocabulary 256 does not cover the packer's token 256: refused, no file
"$S" train --model gpt2-mini --n_layer 1 --n_embd 32 --n_head 2 --vocab_size 256 --batch 1 --seq 16 --steps 1 \
  --eval_every 0 --quiet 1 --data "$T/three" --run_dir "$T/small" > "$T/small.out" 2>&1
"$S" data score "$T/noisy" --proxy "$T/small" -o "$T/bad.proxy" --quiet > "$T/bad.out" 2>&1
rc=$?
check '[ $rc -ne 0 ] && grep -q "vocabulary (256) does not cover" "$T/bad.out" && grep -q "noisy.bin: token 256 " "$T/bad.out" &&
       [ ! -e "$T/bad.proxy" ] && ! ls "$T" | grep -q "bad.proxy"' "a proxy of too small a vocabulary (rc $rc): $(cat "$T/bad.out")"

# usage: --proxy and --from_text together, a run directory that is not one
"$S" data score "$T/noisy" --proxy "$T/proxy" --from_text "$T/x" -o "$T/u.proxy" > "$T/u.out" 2>&1
rc=$?
check '[ $rc -eq 2 ] && [ ! -e "$T/u.proxy" ]' "--proxy with --from_text: $(cat "$T/u.out")"
"$S" data score "$T/noisy" --proxy "$T" -o "$T/u.proxy" > "$T/u2.out" 2>&1
rc=$?
check '[ $rc -ne 0 ] && grep -q "proxy" "$T/u2.out" && [ ! -e "$T/u.proxy" ]' "a proxy that is no model: $(cat "$T/u2.out")"

[ $fail -eq 0 ] && rm -rf "$T"
exit $fail
