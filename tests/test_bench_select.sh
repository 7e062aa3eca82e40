#!/usr/bin/env bash
# test_bench_select.sh - strata bench select --json on a small noisy real-text corpus
# (tools/gen_noisy_corpus.py --docs 500 --heldout 100) in a tiny configuration (a 1-layer
# model, 40 steps; a 1-layer proxy, 20 steps). The JSON object holds every field, and its
# numbers agree with each other and with references computed here: each run's FLOPs a token
# is GPT-2's 6 (12 L C^2 + V C) + 6 L T C for its shape, its tokens steps x batch x seq, its
# FLOPs their product; the proxy's training FLOPs the same for the proxy's shape and steps;
# the scoring a third of the proxy's FLOPs a token over the corpus's inputs (every token but
# a document's last; padding to a whole batch at most); the selection side's overhead the
# proxy's training plus the scoring; the step where a run reaches the full run's final
# validation loss lies on its curve (the curve interpolated there gives that loss, and no
# earlier evaluation is below it), its FLOPs the FLOPs a step times that step plus the
# overhead, the ratio the full run's FLOPs over them, meets_1_3x that ratio >= 1.3; a run
# that never reaches it has every evaluation above. The budget run is the longest whose
# FLOPs with the overhead stay under the full run's over --budget, and says whether its
# final loss reaches the full run's. The view keeps no more documents than the corpus less
# its duplicates. The clean corpus's comparison is there, without curriculum and online
# runs. No --corpus, and a corpus without held-out documents, are refused.
# --bands 1 (the regime question, on OUT/small from --small 150 and on OUT/clean): per corpus
# the three bands' views hold the documents the bench ranks from the score files, a third
# each of the corpus less its duplicates (together all of them), their proxy losses in order
# (the easy band's highest at most the middle's lowest, and so on); every run has the same
# steps and FLOPs; the epochs are the tokens trained over the band's (or corpus's) tokens;
# the reach of the whole corpus's final loss is checked as above; the winner is the band of
# the lowest final loss, its margin the next band's loss less its own. A corpus without
# small is refused.
set -u
. "$(dirname "$0")/lib_corpus.sh"
corpus_begin bsel
: "${SRC:?STRATA_SOURCE_DIR not set}"
python3 "$SRC/tools/gen_noisy_corpus.py" --strata "$S" --out "$T/c" --docs 500 --heldout 100 --small 150 --seed 27 > "$T/gen.out" 2>&1
rc=$?
if [ $rc -eq 77 ]; then cat "$T/gen.out"; rm -rf "$T"; exit 77; fi
check "[ $rc -eq 0 ]" "gen_noisy_corpus (rc $rc): $(cat "$T/gen.out")"

# the checks both JSON readings below share (bad collects what failed)
cat > "$T/bsel_checks.py" <<'PY'
bad = []
def close(a, b, rel=1e-4):
    return abs(a - b) <= rel * max(abs(a), abs(b), 1e-30)
def need(cond, what):
    if not cond:
        bad.append(what)
def fpt(L, C, V, T):
    return 6.0 * (L * 12.0 * C * C + V * C) + 6.0 * L * T * C
PY

A="--n_layer 1 --n_embd 32 --n_head 2 --batch 4 --seq 32 --steps 40 --eval_every 10 --eval_tokens 1024
   --proxy_layers 1 --proxy_embd 16 --proxy_heads 2 --proxy_steps 20 --proxy_batch 4 --proxy_seq 32 --threads 2"
# --budget: the scoring alone is 10x the tiny run's FLOPs; 0.06 leaves the budget run room
"$S" bench select --corpus "$T/c" $A --budget 0.06 --json > "$T/out.json" 2> "$T/err.txt"
rc=$?
check '[ $rc -eq 0 ]' "bench select (rc $rc): $(tail -n 3 "$T/err.txt")"
python3 - "$T/out.json" > "$T/eval.out" "$T" 2>&1 <<'PY'
import json, sys
sys.path.insert(0, sys.argv[2])
from bsel_checks import bad, close, need, fpt
j = json.load(open(sys.argv[1]))
for k in ("corpus", "model", "batch", "seq", "steps", "lr", "schedule", "min_lr_frac", "eval_every", "proxy", "band",
          "noisy", "clean", "seconds", "load_before", "load_after"):
    need(k in j, "no key " + k)
need(j["min_lr_frac"] == 0 and j["schedule"] == "cosine", "not fully decayed: %s %s" % (j["schedule"], j["min_lr_frac"]))
B, T, steps, V, p = j["batch"], j["seq"], j["steps"], j["vocab_size"], j["proxy"]
want_fpt = fpt(j["n_layer"], j["n_embd"], V, T)
want_pfpt = fpt(p["n_layer"], p["n_embd"], V, p["seq"])
for side, arms in (("noisy", ("selected", "curriculum", "online")), ("clean", ("selected",))):
    s = j[side]
    for k in ("documents", "tokens", "proxy_train_flops", "score_flops", "dedup_s", "exact_duplicates",
              "near_duplicates", "view_documents", "view_tokens", "full") + arms:
        need(k in s, "%s: no key %s" % (side, k))
    if side == "clean":
        need("curriculum" not in s and "online" not in s, "clean: curriculum or online runs")
    need(close(s["proxy_flops_per_token"], want_pfpt), "%s: proxy FLOPs a token %s, want %s" % (side, s["proxy_flops_per_token"], want_pfpt))
    need(close(s["proxy_train_flops"], want_pfpt * p["steps"] * p["batch"] * p["seq"]), "%s: proxy training FLOPs %s" % (side, s["proxy_train_flops"]))
    # every token but a document's last is an input; forwards are whole batches
    pos = s["tokens"] - s["documents"]
    lo, hi = want_pfpt / 3 * pos, want_pfpt / 3 * (pos + p["batch"] * p["seq"])
    need(lo * 0.999 <= s["score_flops"] <= hi * 1.001, "%s: scoring FLOPs %s outside [%s, %s]" % (side, s["score_flops"], lo, hi))
    need(0 < s["view_documents"] <= s["documents"] - s["exact_duplicates"] - s["near_duplicates"]
         and s["view_tokens"] < s["tokens"], "%s: view of %s documents, %s tokens" % (side, s["view_documents"], s["view_tokens"]))
    over = s["proxy_train_flops"] + s["score_flops"]
    full = s["full"]
    for name in ("full",) + arms:
        r = s[name]
        w = "%s %s" % (side, name)
        need(close(r["flops_per_token"], want_fpt), "%s: FLOPs a token %s, want %s" % (w, r["flops_per_token"], want_fpt))
        need(r["tokens"] == steps * B * T, "%s: tokens %s, want %s" % (w, r["tokens"], steps * B * T))
        need(close(r["train_flops"], want_fpt * steps * B * T), "%s: train FLOPs %s" % (w, r["train_flops"]))
        c = r["curve"]
        need(len(c) == steps // j["eval_every"] and c[-1][0] == steps and abs(c[-1][1] - r["final_val_loss"]) < 1e-6,
             "%s: curve %s against final %s" % (w, c, r["final_val_loss"]))
        if name == "full":
            need(r["overhead_flops"] == 0, "full: overhead %s" % r["overhead_flops"])
            continue
        need(close(r["overhead_flops"], over) and close(r["total_flops"], r["train_flops"] + over),
             "%s: overhead %s, total %s, want %s and %s" % (w, r["overhead_flops"], r["total_flops"], over, r["train_flops"] + over))
        L = full["final_val_loss"]
        if r["reaches_full_loss"]:
            x = r["step_at_full_loss"]
            i = next(i for i, (st, v) in enumerate(c) if v <= L)
            need(all(v > L for _, v in c[:i]), "%s: an evaluation before the reach is below %s" % (w, L))
            if i == 0:
                need(x == c[0][0], "%s: reached at the first evaluation, step %s" % (w, x))
            else:
                (s0, v0), (s1, v1) = c[i - 1], c[i]
                need(s0 <= x <= s1 and abs(v0 + (v1 - v0) * (x - s0) / (s1 - s0) - L) < 1e-5 * max(1, abs(v0 - v1)) + 1e-6,
                     "%s: step %s does not give %s on the curve %s" % (w, x, L, c))
            f = want_fpt * B * T * x + over
            need(close(r["flops_at_full_loss"], f, 1e-3), "%s: FLOPs at the full loss %s, want %s" % (w, r["flops_at_full_loss"], f))
            need(close(r["flop_ratio"], full["train_flops"] / f, 1e-3), "%s: ratio %s, want %s" % (w, r["flop_ratio"], full["train_flops"] / f))
            need(r["meets_1_3x"] == (r["flop_ratio"] >= 1.3), "%s: meets_1_3x %s at ratio %s" % (w, r["meets_1_3x"], r["flop_ratio"]))
        else:
            need(all(v > L for _, v in c) and r["flop_ratio"] is None and r["meets_1_3x"] is False,
                 "%s: never reaches %s but its curve %s does" % (w, L, c))
    b = s["budget"]
    n = b["steps"]
    need(b["ratio"] == j["budget"] and n > j["warmup"], "%s: budget %s" % (side, b))
    if n > 0:
        cap = full["train_flops"] / b["ratio"]
        per = want_fpt * B * T
        need(close(b["train_flops"], per * n) and close(b["total_flops"], per * n + over), "%s: budget FLOPs %s" % (side, b))
        need(b["total_flops"] <= cap * (1 + 1e-5) and b["total_flops"] + per > cap * (1 - 1e-5),
             "%s: budget run of %d steps (%s FLOPs) is not the longest under %s" % (side, n, b["total_flops"], cap))
        need(b["reaches_full_loss"] == (b["final_val_loss"] <= full["final_val_loss"]), "%s: budget reach %s" % (side, b))
    print("%s: full %.4f, selected %.4f (ratio %s)" % (side, full["final_val_loss"], s["selected"]["final_val_loss"],
                                                       s["selected"]["flop_ratio"]))
for b in bad:
    print("FAIL:", b)
sys.exit(1 if bad else 0)
PY
rc=$?
check '[ $rc -eq 0 ]' "the JSON: $(cat "$T/eval.out")"
echo "bench_select: $(tr '\n' ';' < "$T/eval.out")"

"$S" bench select --corpus "$T/c" $A --bands 1 --json > "$T/bands.json" 2> "$T/err.txt"
rc=$?
check '[ $rc -eq 0 ]' "bench select --bands 1 (rc $rc): $(tail -n 3 "$T/err.txt")"
python3 - "$T/bands.json" > "$T/evalb.out" "$T" 2>&1 <<'PY'
import json, sys
sys.path.insert(0, sys.argv[2])
from bsel_checks import bad, close, need, fpt
j = json.load(open(sys.argv[1]))
need(j.get("mode") == "bands" and j["min_lr_frac"] == 0 and j["schedule"] == "cosine", "mode or schedule: %s" % j.get("mode"))
B, T, steps, V, p = j["batch"], j["seq"], j["steps"], j["vocab_size"], j["proxy"]
want_fpt = fpt(j["n_layer"], j["n_embd"], V, T)
trained = steps * B * T
for side, ndocs in (("small", 150), ("clean", 500)):
    s = j[side]
    need(s["documents"] == ndocs, "%s: %s documents, want %s" % (side, s["documents"], ndocs))
    over = s["proxy_train_flops"] + s["score_flops"]
    full, bands = s["full"], s["bands"]
    need(list(bands) == ["easy", "middle", "hard"], "%s: bands %s" % (side, list(bands)))
    need(close(s["epochs"], trained / s["tokens"]), "%s: epochs %s, want %s" % (side, s["epochs"], trained / s["tokens"]))
    m = s["documents"] - s["exact_duplicates"] - s["near_duplicates"]
    need(sum(b["view_documents"] for b in bands.values()) == m, "%s: the bands hold %s documents, want %s"
         % (side, [b["view_documents"] for b in bands.values()], m))
    need(sum(b["view_tokens"] for b in bands.values()) <= s["tokens"], "%s: the bands' tokens exceed the corpus's" % side)
    prev = None
    for name, b in bands.items():
        w = "%s %s" % (side, name)
        need(b["view_documents"] == b["ranked_documents"] and abs(b["view_documents"] - m / 3) < 1,
             "%s: %s documents in the view, %s ranked, want a third of %s" % (w, b["view_documents"], b["ranked_documents"], m))
        q = b["proxy_loss"]
        need(q["min"] <= q["mean"] <= q["max"], "%s: proxy loss %s" % (w, q))
        need(prev is None or prev <= q["min"], "%s: lowest proxy loss %s below the previous band's highest %s" % (w, q["min"], prev))
        prev = q["max"]
        need(close(b["epochs"], trained / b["view_tokens"]), "%s: epochs %s, want %s" % (w, b["epochs"], trained / b["view_tokens"]))
    for name, r in [("full", full)] + list(bands.items()):
        w = "%s %s" % (side, name)
        need(close(r["flops_per_token"], want_fpt) and r["tokens"] == trained and close(r["train_flops"], want_fpt * trained),
             "%s: FLOPs a token %s, tokens %s, FLOPs %s" % (w, r["flops_per_token"], r["tokens"], r["train_flops"]))
        c = r["curve"]
        need(len(c) == steps // j["eval_every"] and c[-1][0] == steps and abs(c[-1][1] - r["final_val_loss"]) < 1e-6,
             "%s: curve %s against final %s" % (w, c, r["final_val_loss"]))
        if name == "full":
            continue
        need(close(r["overhead_flops"], over) and close(r["total_flops"], r["train_flops"] + over), "%s: overhead %s" % (w, r["overhead_flops"]))
        L = full["final_val_loss"]
        if r["reaches_full_loss"]:
            x = r["step_at_full_loss"]
            i = next(i for i, (st, v) in enumerate(c) if v <= L)
            need(all(v > L for _, v in c[:i]), "%s: an evaluation before the reach is below %s" % (w, L))
            if i > 0:
                (s0, v0), (s1, v1) = c[i - 1], c[i]
                need(s0 <= x <= s1 and abs(v0 + (v1 - v0) * (x - s0) / (s1 - s0) - L) < 1e-5 * max(1, abs(v0 - v1)) + 1e-6,
                     "%s: step %s does not give %s on the curve %s" % (w, x, L, c))
            f = want_fpt * B * T * x + over
            need(close(r["flop_ratio"], full["train_flops"] / f, 1e-3), "%s: ratio %s, want %s" % (w, r["flop_ratio"], full["train_flops"] / f))
        else:
            need(all(v > L for _, v in c) and r["flop_ratio"] is None, "%s: never reaches %s but its curve %s does" % (w, L, c))
    ranked = sorted(bands, key=lambda n: bands[n]["final_val_loss"])
    need(s["winner"] == ranked[0], "%s: winner %s, want %s" % (side, s["winner"], ranked[0]))
    need(abs(s["winner_margin"] - (bands[ranked[1]]["final_val_loss"] - bands[ranked[0]]["final_val_loss"])) < 2e-6,
         "%s: margin %s" % (side, s["winner_margin"]))
    need(abs(s["winner_minus_full"] - (bands[ranked[0]]["final_val_loss"] - full["final_val_loss"])) < 2e-6,
         "%s: winner against the whole corpus %s" % (side, s["winner_minus_full"]))
    print("%s: full %.4f, %s" % (side, full["final_val_loss"],
                                 ", ".join("%s %.4f" % (n, b["final_val_loss"]) for n, b in bands.items())))
for b in bad:
    print("FAIL:", b)
sys.exit(1 if bad else 0)
PY
rc=$?
check '[ $rc -eq 0 ]' "the --bands JSON: $(cat "$T/evalb.out")"
echo "bench_select --bands: $(tr '\n' ';' < "$T/evalb.out")"
mkdir "$T/nosmall" && cp "$T/c/clean".* "$T/c/heldout".* "$T/nosmall/"
"$S" bench select --corpus "$T/nosmall" $A --bands 1 --json > "$T/s.out" 2>&1
rc=$?
check '[ $rc -eq 1 ] && grep -q "small" "$T/s.out"' "--bands 1 on a corpus without small (rc $rc): $(cat "$T/s.out")"

"$S" bench select --json > "$T/u.out" 2>&1
rc=$?
check '[ $rc -eq 2 ] && grep -q "corpus DIR is required" "$T/u.out"' "no --corpus (rc $rc): $(cat "$T/u.out")"
mkdir "$T/nohold" && cp "$T/c/noisy".* "$T/c/clean".* "$T/nohold/"
"$S" bench select --corpus "$T/nohold" $A --clean 0 --curriculum 0 --online 0 --json > "$T/h.out" 2>&1
rc=$?
check '[ $rc -eq 1 ] && grep -q "heldout" "$T/h.out"' "a corpus without held-out documents (rc $rc): $(cat "$T/h.out")"

[ $fail -eq 0 ] && rm -rf "$T"
exit $fail
