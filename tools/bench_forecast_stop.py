#!/usr/bin/env python3
"""bench_forecast_stop.py - issue 28's "4x too long" figure: a run configured about four times
longer than useful, trained once in full and once with --stop_rule marginal:EPS.

The data: a seeded first-order Markov chain over 40 symbols (text, packed with the byte-level
tokenizer), whose validation loss approaches a floor (the chain's entropy plus what gpt2-tiny
cannot represent) like a saturating power law; the last three quarters of the configured run
buy about 1% of loss. Both runs are gpt2-tiny (vocab 257, seq 64, batch 16), wsd with the
decay over --decay_frac of the steps, lr 1e-3, a validation every 50 steps on 16,384 held-out
tokens.

What it measures, from the two runs' metrics.jsonl:
  - the measured curve's crossing step: the full run's evaluations before its decay, each
    step k's marginal gain the slope of a least-squares line through the evaluations in
    [0.8k, 1.2k] (at least 5), in loss per PFLOP (the records' achieved_gflops * step_ms is
    a step's FLOPs); the first evaluation step where it falls below EPS;
  - the step where the rule decided (the record with "stop"), its distance to the crossing;
  - the FLOPs saved (steps not trained, all steps the same FLOPs) of the configured run's;
  - the stopped run's final validation loss against the full run's.

  tools/bench_forecast_stop.py --strata build/strata --work DIR [--eps 100] [--steps 8000]
      [--decay_frac 0.075] [--keep_full] [--json]

Exit 0 when the three bars hold (within 10% of the crossing, >= 30% saved, final within 1%),
1 when one does not (the figures are printed either way), 2 on a failed run.
"""
import argparse
import bisect
import itertools
import json
import os
import random
import shutil
import subprocess
import sys


def gen_corpus(work, strata, seed=283, k=40, docs=2000, length=1000):
    rng = random.Random(seed)
    sym = [chr(48 + i) for i in range(k)]
    rows = []
    for _ in range(k):
        w = [rng.gammavariate(0.3, 1) for _ in range(k)]
        s = sum(w)
        rows.append(list(itertools.accumulate(x / s for x in w)))
    for name, n in (("tr", docs - docs // 20), ("va", docs // 20)):
        with open(os.path.join(work, name + ".txt"), "w") as f:
            for _ in range(n):
                a, out = rng.randrange(k), []
                for _ in range(length):
                    out.append(sym[a])
                    a = min(bisect.bisect(rows[a], rng.random()), k - 1)
                f.write("".join(out) + "\n")
        subprocess.run([strata, "data", "pack", "-o", os.path.join(work, name), "--split", "line",
                        os.path.join(work, name + ".txt")], check=True, stdout=subprocess.DEVNULL)


def train(strata, work, name, steps, decay_frac, rule):
    run = os.path.join(work, name)
    shutil.rmtree(run, ignore_errors=True)
    cmd = [strata, "train", "--model", "gpt2-tiny", "--vocab_size", "257", "--max_seq", "64", "--seq", "64",
           "--batch", "16", "--data", os.path.join(work, "tr"), "--val_data", os.path.join(work, "va"),
           "--eval_tokens", "16384", "--lr", "1e-3", "--schedule", "wsd", "--steps", str(steps),
           "--decay_frac", str(decay_frac), "--eval_every", "50", "--sample_every", "0", "--quiet", "1",
           "--run_dir", run]
    if rule:
        cmd += ["--stop_rule", rule]
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if r.returncode:
        sys.stderr.write(r.stdout)
        sys.exit(2)
    return [json.loads(line) for line in open(os.path.join(run, "metrics.jsonl"))], " ".join(cmd)


def median(xs):
    xs = sorted(xs)
    return xs[len(xs) // 2]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--strata", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--eps", type=float, default=100.0)
    ap.add_argument("--steps", type=int, default=8000)
    ap.add_argument("--decay_frac", type=float, default=0.075)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--keep_full", action="store_true", help="reuse WORK/full when it finished (the same settings)")
    a = ap.parse_args()
    os.makedirs(a.work, exist_ok=True)
    gen_corpus(a.work, a.strata)
    fm = os.path.join(a.work, "full", "metrics.jsonl")
    if a.keep_full and os.path.exists(fm):
        full = [json.loads(line) for line in open(fm)]
        full_cmd = "(kept) " + " ".join(json.load(open(os.path.join(a.work, "full", "config.json"))).get("run_dir", ""))
        if full[-1]["step"] != a.steps:
            sys.exit("%s ends at step %d, not %d: run without --keep_full" % (fm, full[-1]["step"], a.steps))
    else:
        full, full_cmd = train(a.strata, a.work, "full", a.steps, a.decay_frac, "")
    stop, stop_cmd = train(a.strata, a.work, "stop", a.steps, a.decay_frac, "marginal:%g" % a.eps)

    fps = median([r["achieved_gflops"] * 1e9 * r["step_ms"] * 1e-3 for r in full if r.get("achieved_gflops")])
    decay_begin = a.steps - int(round(a.decay_frac * a.steps))
    pts = [(r["step"], r["val_loss"]) for r in full if "val_loss" in r and r["step"] <= decay_begin]
    crossing, gains = None, []
    for k, _ in pts:
        w = [(s, l) for s, l in pts if 0.8 * k <= s <= 1.2 * k]
        if len(w) < 5:
            continue
        ms = sum(s for s, _ in w) / len(w)
        ml = sum(l for _, l in w) / len(w)
        slope = sum((s - ms) * (l - ml) for s, l in w) / sum((s - ms) ** 2 for s, _ in w)
        gain = -slope / fps * 1e15
        gains.append((k, gain))
        if crossing is None and gain < a.eps:
            crossing = k
    dec = [r for r in stop if "stop" in r]
    decided = dec[-1]["step"] if dec else None
    end_stop = stop[-1]["step"]
    val_full = [r["val_loss"] for r in full if "val_loss" in r][-1]
    val_stop = [r["val_loss"] for r in stop if "val_loss" in r][-1]
    out = {
        "eps_per_pflop": a.eps, "configured_steps": a.steps, "decay_frac": a.decay_frac,
        "flops_per_step": fps, "crossing_step": crossing, "decided_step": decided,
        "decision_off": (decided - crossing) / crossing if decided and crossing else None,
        "stopped_at": end_stop, "flops_saved_frac": 1 - end_stop / a.steps,
        "final_val_full": val_full, "final_val_stopped": val_stop, "final_val_diff": val_stop / val_full - 1,
        "forecast_at_decision": dec[-1].get("forecast_final") if dec else None,
        "gain_at_decision": dec[-1].get("gain_per_pflop") if dec else None,
        "full_cmd": full_cmd, "stop_cmd": stop_cmd,
    }
    ok = (crossing and decided and abs(out["decision_off"]) <= 0.10 and out["flops_saved_frac"] >= 0.30
          and abs(out["final_val_diff"]) <= 0.01)
    out["bars_met"] = bool(ok)
    if a.json:
        print(json.dumps(out))
    else:
        for key, v in out.items():
            print("%-22s %s" % (key, v))
        print("measured gains (step: loss per PFLOP):", " ".join("%d:%.3g" % g for g in gains[::4]))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
