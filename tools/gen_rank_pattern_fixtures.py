#!/usr/bin/env python3
"""Fixtures for a tiktoken rank file's pre-tokenizer pattern (the names strata knows).

Writes, in tests/fixtures/:
  tok_ranks_digits.tiktoken   tok_ranks.tiktoken's 599 ranks (tok_llama3.json's model: bytes,
                              then merges) and after them the fullwidth digits ０-９ (U+FF10-FF19)
                              with their common prefix and the pairs １０ and ２０, so that
                              Llama-3's \\p{N}{1,3} and Qwen's \\p{N} give other ids on "２０２０",
                              and two whole pieces on which the other patterns split apart
  tok_ranks_patterns_expected.json
                              for each pattern name (gpt2, cl100k, o200k, llama3, qwen2): the
                              publisher's regex and PyPI tiktoken's ids of each text, with the
                              special tokens <|endoftext|>, <|im_start|>, <|im_end|> at ids
                              n_ranks, n_ranks + 1, n_ranks + 2 (Qwen's layout: tiktoken appends
                              them after the ranks)

The regexes: gpt2, cl100k and o200k are read from tiktoken's own tiktoken_ext.openai_public
(its loader of the published rank files is replaced by the local ranks, so nothing is
downloaded); llama3 is Meta's (llama3/tokenizer.py), qwen2 Qwen's (Qwen-7B's tokenization_qwen.py
PAT_STR, the Split regex of Qwen2's tokenizer.json).

Run in the repository root with PyPI tiktoken installed (pip install tiktoken):
    python3 tools/gen_rank_pattern_fixtures.py
"""
import base64
import json
import os
import sys

try:
    import tiktoken
    from tiktoken_ext import openai_public
except ImportError as e:
    sys.exit(f"{e}: install the reference first: pip install tiktoken")

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "..", "tests", "fixtures")

LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                  r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
                 r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

TEXTS = [
    "第１０章：２０２０年の報告、１０月２０日。",  # the fullwidth digits: \p{N}{1,3} vs \p{N}
    "In 2020 there were 12345 items, 7 left and 1000000 sold.",
    "He's here, they'll go; I'd've said WE'RE done. DON'T",
    "CamelCaseWords and HTTPServer's XMLHttpRequest, iPhone",
    "path/to/file.txt and a/b/c\n/etc/passwd",
    "trailing spaces   \n\n   ",
    "line one\r\nline two\n\n\n  indented\tTab\n",
    "  leading and   inner   spaces  ",
    "Numbers: ３.１４ and ²³ and ½ and ٣٤٥ and १२३",
    "Ελληνικά κείμενα και русский текст, 中文文本 🙂🚀",
    "<|im_start|>user\nhello 2024<|im_end|>\n<|endoftext|>",
    "x\n",
    "a  \n",
    "x\n  ",
]


def read_ranks(path):
    ranks = {}
    with open(path, "rb") as f:
        for line in f:
            if line.strip():
                tok, rank = line.split()
                ranks[base64.b64decode(tok)] = int(rank)
    return ranks


def published_patterns(ranks):
    """gpt2, cl100k and o200k as tiktoken ships them, read from its own definitions."""
    openai_public.load_tiktoken_bpe = lambda *a, **k: ranks
    openai_public.data_gym_to_mergeable_bpe_ranks = lambda *a, **k: ranks
    return {
        "gpt2": openai_public.r50k_base()["pat_str"],
        "cl100k": openai_public.cl100k_base()["pat_str"],
        "o200k": openai_public.o200k_base()["pat_str"],
        "llama3": LLAMA3_PATTERN,
        "qwen2": QWEN2_PATTERN,
    }


def main():
    ranks = read_ranks(os.path.join(OUT, "tok_ranks.tiktoken"))
    assert sorted(ranks.values()) == list(range(len(ranks))), "tok_ranks.tiktoken: ranks are not 0..n-1"
    # the fullwidth digits: their 2-byte prefix, each digit, then two pairs
    digits = [chr(0xFF10 + d).encode() for d in range(10)]
    # and two whole pieces where the patterns split apart (tiktoken takes a piece that is itself
    # a token): "CamelCaseWords" is one piece but for o200k (Camel|Case|Words), "\n  " at the
    # text's end one piece for cl100k and gpt2 (\s++$) and two for llama3 (\n then the spaces)
    whole = [b"CamelCaseWords", b"\n  "]
    for tok in [digits[0][:2]] + digits + ["１０".encode(), "２０".encode()] + whole:
        if tok not in ranks:
            ranks[tok] = len(ranks)
    path = os.path.join(OUT, "tok_ranks_digits.tiktoken")
    with open(path, "wb") as f:
        for tok, r in sorted(ranks.items(), key=lambda kv: kv[1]):
            f.write(base64.b64encode(tok) + b" " + str(r).encode() + b"\n")
    print(f"{path}: {len(ranks)} ranks")
    specials = {t: len(ranks) + i for i, t in enumerate(SPECIALS)}
    pats = published_patterns(ranks)
    out = {"rank_file": "tok_ranks_digits.tiktoken", "n_ranks": len(ranks), "special_tokens": specials,
           "tiktoken": tiktoken.__version__, "texts": TEXTS, "patterns": {}}
    for name, pat in pats.items():
        enc = tiktoken.Encoding(name=f"strata_{name}", pat_str=pat, mergeable_ranks=ranks, special_tokens=specials)
        ids = [enc.encode(t, allowed_special="all") for t in TEXTS]
        for t, i in zip(TEXTS, ids):
            assert enc.decode(i) == t, (name, t)
        out["patterns"][name] = {"regex": pat, "ids": ids}
    names = list(pats)
    for a in range(len(names)):  # each name's ids differ from every other's on some text
        for b in range(a + 1, len(names)):
            pa, pb = out["patterns"][names[a]]["ids"], out["patterns"][names[b]]["ids"]
            assert pa != pb, f"{names[a]} and {names[b]} give the same ids on every text"
    q, l = out["patterns"]["qwen2"]["ids"][0], out["patterns"]["llama3"]["ids"][0]
    assert q != l, "the fullwidth digits split alike with qwen2 and llama3: the fixture shows nothing"
    print(f"{TEXTS[0]}\n  qwen2:  {q}\n  llama3: {l}")
    path = os.path.join(OUT, "tok_ranks_patterns_expected.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"{path}: {len(pats)} patterns x {len(TEXTS)} texts")


if __name__ == "__main__":
    main()
