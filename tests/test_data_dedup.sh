#!/usr/bin/env bash
# test_data_dedup.sh - deduplication on real text with injected noise: tools/gen_noisy_corpus.py
# packs paragraphs of this machine's licences, man pages and Python sources and adds 25%
# noise documents (random tokens, shuffled documents, exact and near duplicates), with a
# label per document. strata data dedup must remove >= 99% of the exact and >= 90% of the
# near duplicates and keep >= 95% of the clean documents; each removed duplicate must
# lead (following the documents each repeats) where the clean document it was made from
# leads: to that document, or the earlier one it repeats itself; the score
# file is the same on 1 and 2 threads; a view dropping the duplicates keeps exactly the
# documents the score file does not flag; the score file is refused for another dataset,
# naming both.
set -u
S=${STRATA_BIN:?STRATA_BIN not set}
SRC=${STRATA_SOURCE_DIR:?STRATA_SOURCE_DIR not set}
command -v python3 >/dev/null || { echo "python3 not found: skipped"; exit 77; }
T=$(mktemp -d /tmp/strata-test-dedup-XXXXXX)
fail=0
check() { if ! eval "$1"; then echo "FAIL: $2"; fail=1; fi; }

python3 "$SRC/tools/gen_noisy_corpus.py" --strata "$S" --out "$T" --docs 3000 --seed 27 > "$T/gen.out" 2>&1
rc=$?
if [ $rc -eq 77 ]; then cat "$T/gen.out"; rm -rf "$T"; exit 77; fi
check '[ $rc -eq 0 ]' "gen_noisy_corpus (rc $rc): $(cat "$T/gen.out")"

"$S" data dedup "$T/noisy" -o "$T/noisy.dedup" --threads 2 --json > "$T/dedup.json" 2>&1
rc=$?
check '[ $rc -eq 0 ]' "dedup: $(cat "$T/dedup.json")"
"$S" data dedup "$T/noisy" -o "$T/noisy1.dedup" --threads 1 > /dev/null 2>&1
check 'cmp -s "$T/noisy.dedup" "$T/noisy1.dedup"' "the score file differs between 1 and 2 threads"
"$S" data inspect "$T/noisy.dedup" --docs 100000000 > "$T/dedup.txt" 2>&1

python3 - "$T/noisy.labels" "$T/dedup.txt" > "$T/eval.out" 2>&1 <<'EOF'
import re, sys
labels = {}
for line in open(sys.argv[1]):
    i, kind, src = line.split()
    labels[int(i)] = (kind, int(src))
found = {}
for line in open(sys.argv[2]):
    m = re.match(r"\s+document (\d+): score (\S+) dup (\w+) of (-?\d+)", line)
    if m:
        found[int(m.group(1))] = (m.group(3), int(m.group(4)))
assert len(found) == len(labels), "%d documents in the score file, %d labelled" % (len(found), len(labels))
def root(x):  # the kept document a chain of duplicates ends at
    while found[x][1] >= 0:
        assert found[x][1] < x, "document %d points at a later one, %d" % (x, found[x][1])
        x = found[x][1]
    return x
total, removed, wrong_ref = {}, {}, 0
for i, (kind, src) in labels.items():
    total[kind] = total.get(kind, 0) + 1
    dup, ref = found[i]
    if dup != "none" and (kind != "exact" or dup == "exact"):  # an exact copy found as one
        removed[kind] = removed.get(kind, 0) + 1
        # a duplicate leads to the document its source leads to (the source itself, unless
        # the source is a duplicate of an earlier real document)
        if kind in ("exact", "near") and root(i) != root(src):
            wrong_ref += 1
share = {k: removed.get(k, 0) / total[k] for k in total}
print(" ".join("%s %d/%d" % (k, removed.get(k, 0), total[k]) for k in sorted(total)), "wrong refs", wrong_ref)
ok = share["exact"] >= 0.99 and share["near"] >= 0.90 and 1 - share["clean"] >= 0.95 and wrong_ref == 0
sys.exit(0 if ok else 1)
EOF
rc=$?
check '[ $rc -eq 0 ]' "removal: $(cat "$T/eval.out") (need exact >= 99%, near >= 90% removed, clean >= 95% kept, refs right)"
echo "data_dedup: $(cat "$T/eval.out")"

# the view without duplicates keeps exactly the unflagged documents
flagged=$(grep -c "dup \(exact\|near\)" "$T/dedup.txt")
total=$(grep -c "^  document" "$T/dedup.txt")
"$S" data select "$T/noisy" -o "$T/nodup.view" --drop_duplicates "$T/noisy.dedup" > "$T/sel.out" 2>&1
rc=$?
check '[ $rc -eq 0 ] && grep -q "^[^ ]*: $((total - flagged)) of $total documents" "$T/sel.out"' \
  "select --drop_duplicates ($flagged flagged of $total): $(cat "$T/sel.out")"

# another dataset: refused naming the score file and the dataset
"$S" data select "$T/clean" -o "$T/bad.view" --drop_duplicates "$T/noisy.dedup" > "$T/bad.out" 2>&1
rc=$?
check '[ $rc -ne 0 ] && grep -q "noisy.dedup was made for another dataset than [^ ]*clean" "$T/bad.out" && [ ! -e "$T/bad.view" ]' \
  "a score file of another dataset (rc $rc): $(cat "$T/bad.out")"
"$S" data dedup "$T/noisy" -o "$T/bad.dedup" --bands 64 --rows 4 > "$T/bad2.out" 2>&1
rc=$?
check '[ $rc -ne 0 ] && grep -q "bands x rows" "$T/bad2.out" && [ ! -e "$T/bad.dedup" ]' "64 x 4 bands over 128 hashes (rc $rc): $(cat "$T/bad2.out")"

if [ $fail -eq 0 ]; then rm -rf "$T"; fi
exit $fail
