#!/usr/bin/env bash
# test_data_curriculum.sh - paced curricula as views (strata data select --pace): 48
# documents whose score is their id (document 0 the easiest). Each run records its documents
# (key doc_signals); the draws are rebuilt from the records (a draw ends when its document's
# length in targets is counted) and every draw g under the pacing's P = n x length must lie in
# the window a Python recomputation of the competence gives: the easiest ceil(c(g / P) n)
# documents (linear, root and stepwise pacing), or the band of ceil(W n) sliding from easy to
# hard; the first quarter of the draws stays in the easier half, and after P the hard end is
# reached. A paced run stopped at step 20 and resumed logs the same losses and writes the same
# records as one that did not stop. Bad pacings are refused naming the key, leaving no file;
# inspect says the view is paced.
. "$(dirname "$0")/lib_corpus.sh"
corpus_begin curric
corpus_ranked 11
A="--model gpt2-mini --n_layer 1 --n_embd 32 --n_head 2 --vocab_size 128 --batch 4 --seq 32 --steps 40 --lr 1e-2
   --eval_every 0 --sample_every 0 --quiet 1 --threads 2 --seed 3 --doc_signals 4"
cat > "$T/.py/draws.py" <<'PY'
import math, struct
H = 64 + 16 * (48 + 464)
def draws(path):
    """The documents drawn, in order, from a one-source run's records."""
    b = open(path, "rb").read()
    out, cur, got = [], None, 0
    for i in range((len(b) - H) // 40):
        doc, step, s, n = struct.unpack_from("<QQdI", b, H + 40 * i)
        if cur is None:
            cur, got = doc, 0
        assert doc == cur, "record %d: document %d inside a draw of %d" % (i, doc, cur)
        got += n
        if got == 40 + doc % 7:
            out.append(doc); cur = None
    return out
def competence(kind, c0, t, K=4):
    if t >= 1: return 1.0
    c = {"linear": c0 + (1 - c0) * t, "root": math.sqrt(c0 * c0 + (1 - c0 * c0) * t),
         "step": c0 + (1 - c0) * math.floor(K * t) / (K - 1)}[kind]
    return min(c, 1.0)
PY
run() { # NAME SELECT-ARGS: a view and a run on it
  "$S" data select "$T/base" -o "$T/$1.view" --scores "$T/s.scores" ${@:2} > "$T/$1.sel" 2>&1
  rc=$?
  check '[ $rc -eq 0 ]' "select $*: $(cat "$T/$1.sel")"
  "$S" train $A --data "$T/$1.view" --run_dir "$T/$1" > "$T/$1.out" 2>&1
  rc=$?
  check '[ $rc -eq 0 ]' "train on $1: $(tail -n 3 "$T/$1.out")"
}
run linear --pace linear --pace_start 0.25
run root --pace root --pace_start 0.2
run step --pace step --pace_start 0.25 --pace_steps 4
run band --pace linear --pace_start 0.1 --pace_band 0.25
python3 - "$T" > "$T/eval.out" 2>&1 <<'PY'
import math, sys
from draws import draws, competence
t, n, P = sys.argv[1], 48, 48
for name, kind, c0, band in (("linear", "linear", 0.25, 0), ("root", "root", 0.2, 0), ("step", "step", 0.25, 0),
                             ("band", "linear", 0.1, 0.25)):
    d = draws("%s/%s/doc_signals.bin" % (t, name))
    assert len(d) > P + 20, "%s: %d draws" % (name, len(d))
    for g in range(P):
        c = competence(kind, c0, g / P)
        if band:
            w = math.ceil(band * n)
            lo = min(math.floor((c - c0) / (1 - c0) * (n - w)), n - w)
            ok = lo <= d[g] < lo + w
        else:
            ok = d[g] < max(1, math.ceil(c * n))
        assert ok, "%s: draw %d is document %d, outside the window at competence %.4f" % (name, g, d[g], c)
    assert max(d[:P // 4]) < n // 2, "%s: the first draws reach %d" % (name, max(d[:P // 4]))
    assert max(d[P:]) >= n - 4, "%s: after pacing only up to %d" % (name, max(d[P:]))
    print("%s: %d draws, first quarter up to %d, then up to %d" % (name, len(d), max(d[:P // 4]), max(d)))
PY
rc=$?
check '[ $rc -eq 0 ]' "$(cat "$T/eval.out")"
echo "data_curriculum: $(tr '\n' ';' < "$T/eval.out")"

# stopped at 20 and resumed: the same losses and records
"$S" train $A --data "$T/linear.view" --stop_at 20 --run_dir "$T/part" > /dev/null 2>&1
"$S" train $A --data "$T/linear.view" --resume "$T/part" --stop_at 40 --run_dir "$T/part" > "$T/res.out" 2>&1
rc=$?
losses() { python3 -c 'import json,sys; print(" ".join("%s:%s" % (j["step"], j["loss"]) for j in map(json.loads, open(sys.argv[1])) if "loss" in j))' "$1"; }
check '[ $rc -eq 0 ] && [ "$(losses "$T/linear/metrics.jsonl")" = "$(losses "$T/part/metrics.jsonl")" ] &&
       cmp -s "$T/linear/doc_signals.bin" "$T/part/doc_signals.bin"' \
  "the resumed paced run differs (rc $rc): $(tail -n 2 "$T/res.out")"

"$S" data inspect "$T/band.view" --json > "$T/insp.json" 2>&1
check 'grep -q "\"paced\": true" "$T/insp.json" && grep -q "sliding band of 0.25" "$T/insp.json"' "inspect: $(cat "$T/insp.json")"

bad() { # EXPECTED-KEY ARGS...
  rm -f "$T/bad.view"
  "$S" data select "$T/base" -o "$T/bad.view" --scores "$T/s.scores" ${@:2} > "$T/bad.out" 2>&1
  local rc=$?
  check "[ $rc -ne 0 ] && grep -q \"$1\" \"$T/bad.out\" && [ ! -e \"$T/bad.view\" ]" "select ${*:2} (rc $rc): $(cat "$T/bad.out")"
}
bad "key 'pace_start'" --pace linear --pace_start 0
bad "key 'pace_band'" --pace root --pace_band 1
bad "key 'pace_steps'" --pace step --pace_steps 1
bad "key 'pace_length'" --pace linear --pace_length -1
bad "give linear, root or step" --pace cubic

[ $fail -eq 0 ] && rm -rf "$T"
exit $fail
