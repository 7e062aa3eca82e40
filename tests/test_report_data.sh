#!/usr/bin/env bash
# test_report_data.sh - strata report's charts of what a run trained on (issue 27): a run
# with --mix online over two sources and --doc_signals gets the chart of the sources' weights
# (a line per source) and the chart of the documents' losses (the first and the second half
# of the steps), each a well-formed SVG; the summary's last weights equal metrics.jsonl's
# last mix_weights, and its record count and mean loss equal a Python reading of
# doc_signals.bin (every record's loss sum over every record's targets). A plain run's page
# has neither chart; a damaged doc_signals.bin leaves its chart out and says why.
set -u
. "$(dirname "$0")/lib_corpus.sh"
corpus_begin reportdata
corpus_easy_hard
A="--model gpt2-mini --n_layer 1 --n_embd 32 --n_head 2 --vocab_size 256 --batch 4 --seq 32 --steps 12
   --lr 1e-2 --eval_every 0 --sample_every 0 --quiet 1 --threads 2 --seed 7"
"$S" train $A --mix online --data "$T/easy,$T/hard" --doc_signals 4 --run_dir "$T/run" > "$T/train.out" 2>&1
rc=$?
check '[ $rc -eq 0 ]' "train (rc $rc): $(tail -3 "$T/train.out")"
"$S" report "$T/run" > "$T/sum.txt" 2> "$T/sum.err"
rc=$?
check '[ $rc -eq 0 ]' "report (rc $rc): $(cat "$T/sum.err")"
html="$T/run/report.html"
check 'grep -qF "Mixture weights (mix online)" "$html" && grep -qF "Loss of the documents seen (doc_signals)" "$html"' \
  "both charts on the page"
python3 - "$T" > "$T/eval.out" 2>&1 <<'PY'
import json, re, struct, sys, xml.etree.ElementTree as ET
t = sys.argv[1]
html = open(t + "/run/report.html").read()
svgs = re.findall(r"<svg.*?</svg>", html, re.S)
for svg in svgs:
    ET.fromstring(svg)  # well-formed
mix = [s for s in svgs if "Mixture weights" in s][0]
docs = [s for s in svgs if "Loss of the documents seen" in s][0]
assert len(re.findall(r"<polyline", mix)) == 2, "mixture chart: %d lines" % len(re.findall(r"<polyline", mix))
assert len(re.findall(r"<polyline", docs)) == 2, "documents chart: %d lines" % len(re.findall(r"<polyline", docs))
last = [json.loads(l) for l in open(t + "/run/metrics.jsonl")][-1]["mix_weights"]
summ = open(t + "/sum.txt").read()
got = [float(x) for x in re.search(r"mix online  weights at step 12:(.*)", summ).group(1).split()]
assert all(abs(a - b) <= 5e-5 for a, b in zip(got, last)) and len(got) == len(last), (got, last)
b = open(t + "/run/doc_signals.bin", "rb").read()
H = 64 + 16 * (48 + 464)
s = c = n = 0
for i in range((len(b) - H) // 40):
    doc, step, ls, cnt = struct.unpack_from("<QQdI", b, H + 40 * i)
    if cnt:
        s += ls; c += cnt; n += 1
m = re.search(r"documents   (\d+) records \(doc_signals\), mean loss ([0-9.]+)", summ)
assert m and int(m.group(1)) == n and abs(float(m.group(2)) - s / c) <= 5e-7, (m and m.groups(), n, s / c)
print("mix %s; %d records, mean loss %.6f" % (got, n, s / c))
PY
rc=$?
check '[ $rc -eq 0 ]' "$(cat "$T/eval.out")"
# a plain run: neither chart
"$S" train $A --data "$T/easy" --run_dir "$T/plain" > /dev/null 2>&1
"$S" report "$T/plain" --quiet > /dev/null 2>&1
check '! grep -qF "Mixture weights" "$T/plain/report.html" && ! grep -qF "documents seen" "$T/plain/report.html"' \
  "a plain run has neither chart"
# a damaged doc_signals.bin: the chart left out, the reason said, the report still written
printf 'XXXXXXXX' | dd of="$T/run/doc_signals.bin" bs=1 seek=0 conv=notrunc 2>/dev/null
"$S" report "$T/run" > /dev/null 2> "$T/bad.err"
rc=$?
check '[ $rc -eq 0 ] && grep -q "doc_signals.bin: offset 0: not a doc_signals file" "$T/bad.err" && ! grep -qF "documents seen" "$html"' \
  "damaged doc_signals (rc $rc): $(cat "$T/bad.err")"
echo "report_data: $(cat "$T/eval.out")"
[ $fail -eq 0 ] && rm -rf "$T"
exit $fail
