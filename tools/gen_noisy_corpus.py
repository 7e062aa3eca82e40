#!/usr/bin/env python3
"""gen_noisy_corpus.py - a real-text corpus with injected noise, for data selection tests.

Gathers text this machine has (licences, packages' copyright files, manual pages, Python
sources), cuts it into paragraph documents, and packs it with `strata data pack` (byte-level
tokens) twice:

  OUT/clean.{bin,idx,json}   the clean documents
  OUT/noisy.{bin,idx,json}   the clean documents with a share of noise documents (default
                             25%) of four kinds in equal parts, inserted at seeded random
                             places: uniformly random tokens, a real document's tokens
                             shuffled, an exact duplicate and a near duplicate (a few tokens,
                             2% of the document and at least one, changed) of an earlier
                             clean document
  OUT/noisy.labels           one line a document of noisy: "ID KIND SOURCE" (KIND clean,
                             random, shuffled, exact or near; SOURCE the id in noisy of the
                             document it was made from, -1 if none)

Everything is deterministic for --seed on a given machine. Clean paragraphs are distinct
after collapsing white space (licence texts repeat across packages).

  tools/gen_noisy_corpus.py --strata build/strata --out DIR [--docs 3000] [--noise 0.25]
      [--heldout N]  (also OUT/heldout.{bin,idx,json}: N more clean paragraphs, in neither
                     clean nor noisy, for validation; clean and noisy are the same as without)
      [--small N]    (also OUT/small.{bin,idx,json}: the first N clean documents, a subset
                     of clean, for the regime of a small corpus seen for several epochs;
                     everything else is the same as without)
  tools/gen_noisy_corpus.py --strata build/strata --out DIR --synthetic 100000000
      (the benchmark's stream: random-token documents of 200-2000 tokens with 5% exact and
      5% near duplicates, packed the same way; tokens from 32..126 so lines stay documents)

Exit 77 when the machine has too little text.
"""
import argparse
import glob
import gzip
import os
import random
import re
import subprocess
import sys
import tempfile

MIN_BYTES, MAX_BYTES = 300, 3000


def sources():
    files = sorted(glob.glob("/usr/share/common-licenses/*"))
    files += sorted(glob.glob("/usr/share/doc/*/copyright"))
    files += sorted(glob.glob("/usr/share/man/man[1-8]/*.gz"))
    for d in sorted(glob.glob("/usr/lib/python3*")):
        files += sorted(glob.glob(d + "/*.py")) + sorted(glob.glob(d + "/*/*.py"))
    return files


def read_text(path):
    try:
        if path.endswith(".gz"):
            with gzip.open(path, "rb") as f:
                raw = f.read(1 << 16)
        else:
            with open(path, "rb") as f:
                raw = f.read(1 << 16)
    except OSError:
        return ""
    return raw.decode("utf-8", "replace")


def paragraphs(text):
    for p in re.split(r"\n[ \t]*\n", text):
        p = p.strip("\n")
        b = p.encode("utf-8")
        if MIN_BYTES <= len(b) <= MAX_BYTES and "\x00" not in p:
            yield b


def gather(rng, want):
    """Paragraphs, none a near copy of an earlier one: real text repeats itself (licences
    in many packages, man pages made from one template), and a clean document that is a
    duplicate would be counted against deduplication. A paragraph is left out when more
    than a fifth of its word 4-grams were seen before (a check of its own, independent of
    strata's MinHash over token n-grams)."""
    files = sources()
    rng.shuffle(files)  # a seeded mix of licences, man pages and code
    seen, docs = set(), []
    per_file = 3  # no single file dominates
    for path in files:
        got = 0
        for b in paragraphs(read_text(path)):
            w = b.split()
            grams = {b" ".join(w[i:i + 4]) for i in range(max(1, len(w) - 3))}
            if sum(g in seen for g in grams) > 0.2 * len(grams):
                continue
            seen.update(grams)
            docs.append(b)
            got += 1
            if got == per_file or len(docs) == want:
                break
        if len(docs) == want:
            break
    return docs


def pack(strata, prefix, docs, tmp):
    d = tempfile.mkdtemp(dir=tmp)
    names = []
    for i, b in enumerate(docs):
        n = os.path.join(d, "%07d" % i)
        with open(n, "wb") as f:
            f.write(b)
        names.append(n)
    # many documents: pack reads them a file each (one document per file)
    r = subprocess.run([strata, "data", "pack", "-o", prefix, "--split", "file", "--threads", "2"] + names,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    if r.returncode != 0:
        sys.exit("gen_noisy_corpus: strata data pack failed: " + r.stdout.decode(errors="replace"))
    for n in names:
        os.unlink(n)
    os.rmdir(d)


def near_copy(rng, b):
    b = bytearray(b)
    k = max(1, len(b) // 50)
    for pos in rng.sample(range(len(b)), k):
        c = b[pos]
        while c == b[pos] or c == 10:
            c = rng.randrange(32, 127)
        b[pos] = c
    return bytes(b)


def noisy(rng, clean, share):
    n_noise = int(round(len(clean) * share / (1 - share)))
    kinds = ["random", "shuffled", "exact", "near"]
    items = [(float(i), "clean", i, clean[i]) for i in range(len(clean))]
    for j in range(n_noise):
        kind = kinds[j % 4]
        src = rng.randrange(len(clean))
        if kind == "random":
            n = len(clean[src])
            items.append((rng.uniform(0, len(clean)), kind, -1, bytes(rng.randrange(256) for _ in range(n))))
        elif kind == "shuffled":
            b = bytearray(clean[src])
            rng.shuffle(b)
            items.append((rng.uniform(0, len(clean)), kind, -1, bytes(b)))
        else:  # after the document it repeats
            key = rng.uniform(src + 0.5, len(clean))
            items.append((key, kind, src, clean[src] if kind == "exact" else near_copy(rng, clean[src])))
    items.sort(key=lambda t: t[0])
    where = {}
    for pos, it in enumerate(items):
        if it[1] == "clean":
            where[it[2]] = pos
    labels = [(pos, it[1], where[it[2]] if it[1] in ("exact", "near") else -1) for pos, it in enumerate(items)]
    return [it[3] for it in items], labels


def synthetic(rng, total):
    docs, made = [], 0
    table = bytes(32 + x % 95 for x in range(256))  # any byte to a printable one (no newline)
    while made < total:
        r = rng.random()
        if docs and r < 0.05:
            b = docs[rng.randrange(len(docs))]
        elif docs and r < 0.10:
            b = near_copy(rng, docs[rng.randrange(len(docs))])
        else:
            n = rng.randrange(200, 2001)
            b = rng.randbytes(n).translate(table)
        docs.append(b)
        made += len(b) + 1
    return docs


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--strata", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--docs", type=int, default=3000, help="clean documents")
    ap.add_argument("--noise", type=float, default=0.25, help="share of noise documents in noisy")
    ap.add_argument("--seed", type=int, default=27)
    ap.add_argument("--heldout", type=int, default=0, help="clean documents held out for validation")
    ap.add_argument("--small", type=int, default=0, help="also OUT/small: the first N clean documents")
    ap.add_argument("--synthetic", type=int, default=0, help="tokens of a synthetic stream instead")
    a = ap.parse_args()
    if not 0 <= a.small <= a.docs:
        sys.exit("gen_noisy_corpus: --small %d: give 1 to --docs (%d) documents" % (a.small, a.docs))
    rng = random.Random(a.seed)
    os.makedirs(a.out, exist_ok=True)
    if a.synthetic:
        docs = synthetic(rng, a.synthetic)
        txt = os.path.join(a.out, "synthetic.txt")
        with open(txt, "wb") as f:
            for b in docs:
                f.write(b + b"\n")
        r = subprocess.run([a.strata, "data", "pack", "-o", os.path.join(a.out, "synthetic"), "--split", "line", txt])
        os.unlink(txt)
        sys.exit(r.returncode)
    # gather reads its files in a seeded order and stops at the count: the first --docs
    # paragraphs are the same with or without --heldout, and the held-out ones come after
    got = gather(rng, a.docs + a.heldout)
    clean, held = got[:a.docs], got[a.docs:]
    if len(clean) < min(a.docs, 500) or len(held) < min(a.heldout, 100):
        print("gen_noisy_corpus: only %d paragraphs of text on this machine (want %d)" % (len(got), a.docs + a.heldout))
        sys.exit(77)
    if held:
        pack(a.strata, os.path.join(a.out, "heldout"), held, a.out)
    pack(a.strata, os.path.join(a.out, "clean"), clean, a.out)
    if a.small:
        pack(a.strata, os.path.join(a.out, "small"), clean[:a.small], a.out)
    docs, labels = noisy(rng, clean, a.noise)
    pack(a.strata, os.path.join(a.out, "noisy"), docs, a.out)
    with open(os.path.join(a.out, "noisy.labels"), "w") as f:
        for pos, kind, src in labels:
            f.write("%d %s %d\n" % (pos, kind, src))
    counts = {}
    for _, k, _ in labels:
        counts[k] = counts.get(k, 0) + 1
    print("gen_noisy_corpus: %d clean documents, %d in noisy: %s" % (
        len(clean), len(docs), ", ".join("%s %d" % kv for kv in sorted(counts.items()))))


if __name__ == "__main__":
    main()
