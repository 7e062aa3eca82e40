#!/usr/bin/env python3
"""gen_tokenizer_fixtures.py - train tiny byte-level BPE tokenizers and record their ids.

Writes, for tests/test_tokenizer.c:
  tests/fixtures/tok_gpt2.json            ByteLevel pre-tokenizer (the GPT-2 regex), merges
                                          stored as "a b" strings (the older format)
  tests/fixtures/tok_llama3.json          Sequence[Split(Llama-3 regex), ByteLevel(use_regex
                                          false)], ignore_merges, merges as [a, b] pairs
  tests/fixtures/tok_gpt2_prefix.json     the GPT-2 one with add_prefix_space true
  tests/fixtures/tok_llama2.json          byte-fallback BPE as Llama-2 / Mistral v0.1 store it:
                                          normalizer Sequence[Prepend("▁"), Replace(" ", "▁")],
                                          no pre-tokenizer, <0xNN> tokens, fuse_unk, decoder
                                          Sequence[Replace, ByteFallback, Fuse, Strip]
  tests/fixtures/tok_mistral.json         the same model as newer converters write it: no
                                          normalizer, Metaspace(prepend_scheme first, split
                                          false), a normalized added token
  tests/fixtures/tok_spm_old.json         an older sentencepiece-style BPE without byte
                                          fallback (unk, fuse_unk): Metaspace(add_prefix_space)
                                          pre-tokenizer and decoder
  tests/fixtures/tok_<name>_expected.json [{"text", "ids", "decoded"}] from Hugging Face
                                          `tokenizers` (encode, then decode the ids)
  tests/fixtures/tok_ranks.tiktoken       tok_llama3.json's model as a tiktoken rank file
                                          ("base64token rank": the 256 bytes, then the merged
                                          tokens in merge order)
  tests/fixtures/tok_ranks_small.tiktoken the 256 bytes and a few tokens merges cannot reach
  tests/fixtures/tok_ranks_<name>_expected.json  the same rows from PyPI `tiktoken`
                                          (encode with allowed_special="all", then decode) with
                                          the Llama-3 and the GPT-2 pattern and the special
                                          tokens <|endoftext|>, <|im_start|> after the ranks

With --corpus it writes instead, for tests/test_tokenizer_corpus.c, two 32k-token byte-level
BPE tokenizers (tokens of at most 16 characters) trained on 10 MB of tools/gen_text_corpus.py
--docs --seed 2, and the digests of the reference ids of every document of another corpus
(--docs --seed 1, 10.5 MB):
  tests/fixtures/tok_corpus_gpt2.json     ByteLevel pre-tokenizer (the GPT-2 regex)
  tests/fixtures/tok_corpus_llama3.json   Split(Llama-3 regex) + ByteLevel, ignore_merges
  tests/fixtures/tok_corpus_<m>.tiktoken  each as a tiktoken rank file (bytes, then merges)
  tests/fixtures/tok_corpus_digests.txt   per tokenizer and document: the document's length
                                          and CRC-32C, the number of reference ids and the
                                          CRC-32C of the ids as little-endian int32
The references: `tokenizers` for the two .json files, and `tiktoken` (encode with
allowed_special="all") for the rank files with the GPT-2 and the Llama-3 pattern; both have
<|endoftext|> and <|im_start|> as special tokens. Documents with invalid UTF-8 (--docs
--invalid --seed 3, 0.3 MB), which `tokenizers` cannot take, are cut at the special tokens
and each piece between them goes through tiktoken's bytes API, Encoding._encode_bytes: the
rank files' rows, and the .json files' rows the same ids mapped to the .json's own ids.
--corpus --keep-tokenizers writes the digests again from the committed tokenizers, without
training them again.

Nothing is downloaded: the tokenizers are trained here on a deterministic text. Needs the
`tokenizers` and `tiktoken` packages from PyPI:
    python3 -m venv /tmp/tokvenv && /tmp/tokvenv/bin/pip install tokenizers tiktoken
    /tmp/tokvenv/bin/python tools/gen_tokenizer_fixtures.py            # the small fixtures
    /tmp/tokvenv/bin/python tools/gen_tokenizer_fixtures.py --corpus   # the 32k corpus test
(or `pip install --user tokenizers tiktoken`).
"""
import argparse
import array
import base64
import io
import json
import os
import random
import re
import sys

try:
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    import tiktoken
except ImportError as e:
    sys.exit(f"{e}: install the references first: pip install --user tokenizers tiktoken "
             "(or in a venv: python3 -m venv /tmp/tokvenv && /tmp/tokvenv/bin/pip install tokenizers tiktoken)")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gen_text_corpus  # noqa: E402  (stdlib only: the test regenerates the same corpus with it)

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "..", "tests", "fixtures")

LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                  r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
SPECIAL = "<|endoftext|>"

WORDS = ("the model reads text and writes tokens while we're sure it'll work they've "
         "I'm you'd DON'T Can't WE'LL hello world training offload state memory disk "
         "café naïve Zürich résumé東京 北京 中文 文本 模型 训练 数据 ещё привет мир "
         "γειά σου κόσμε שלום مرحبا नमस्ते 🙂 🚀 👍🏽 def main(): return x+1; "
         "for (i = 0; i < n; i++) { y[i] = 2*x[i]; } 12345 3.14159 2026-12-01 0x7fff "
         # letters and digits new in Unicode 15-16 (CJK Ext H, Latin, Garay digits)
         "\U00031350\U00031351\U00031352 abc\U00031350 \ua7cb\ua7ccx \U00010d40\U00010d41\U00010d42\U00010d43").split()


def corpus(seed=1):
    rng = random.Random(seed)
    lines = []
    for _ in range(300):
        n = rng.randint(3, 14)
        parts = []
        for _ in range(n):
            w = rng.choice(WORDS)
            sep = rng.choice([" ", " ", " ", "  ", "\t", "\n", ", ", ". ", "   "])
            parts.append(w + sep)
        lines.append("".join(parts))
    return lines


TESTS = [
    "",
    "hello world",
    "Hello World!",
    " leading space and trailing space ",
    "they're we'll I'd you've it's I'M DON'T Can't",
    "digits 1 12 123 1234 12345 1234567890 3.14159 -42",
    "spaces:    four, tab\tand\t\ttwo tabs, end   ",
    "lines\nand\r\nwindows\n\n\nthree blank\n   \n  indented",
    "café naïve Zürich résumé",
    "中文文本和模型训练数据 東京",
    "привет мир, γειά σου κόσμε",
    "emoji 🙂🚀 and 👍🏽 skin tone",
    "no\u00a0break\u3000ideographic space\u2003em",
    # U+180E: PCRE2 counts it as \s, Oniguruma (and Unicode White_Space) do not
    "mongolian\u180evowel \u180e sep\u180e \u0085next\u2028line x.\u180e!\u180e\u180e  y x  \u180ey",
    "def main():\n    return x+1  # comment\n",
    "for (i = 0; i < n; i++) { y[i] = 2*x[i]; }",
    "before" + SPECIAL + "after",
    SPECIAL + " starts and ends " + SPECIAL,
    "two" + SPECIAL + SPECIAL + "in a row",
    "<|endof not special <|endoftext| either",
    "!!!??? ... --- *** ''' \"\"\" ```",
    "mixed123abc456def 7x8y9z",
    "ax<|im_start|>b x<|im alone x<|im_start|>",
    # Unicode 15-16 letters and digits: PCRE2 10.42 (Unicode 14) has them in no class
    "\U00031350\U00031351\U00031352 abc\U00031350 \ua7cb\ua7ccx \U00010d40\U00010d41\U00010d42\U00010d43\U00010d44 "
    "x\U00031350\U00031351 \U00010d40\U00010d41\U00010d42\U00010d43",
    "   \n\t  ",
]


# for the sentencepiece-style (byte-fallback) tokenizers: their specials, "▁" in the text,
# characters the training text never had (byte fallback or unk), runs of spaces
SPM_TESTS = [
    "<s>hello world</s>",
    "<s> hello",
    "hello<s>world</s>",
    "a <unk> b",
    "<0x41> is text, not a byte",
    "▁ already ▁▁ metaspace ▁x",
    "  two  spaces   three    four",
    "rare 龘 🦀 ∮ ⅋ 𝔸 and combining e\u0301 a\u0308",
    "x<|im normalized x<|im_start|> special",
    "The model reads text 中文文本 🙂🚀 and code: def f(x):\n\treturn x**2  # done\n",
]


# pieces for random strings: the corner cases of \s, \p{L}, \p{N}, contractions, specials
POOL = (list("abcXYZ'sStTdDmMlLvVrRe ") +
        [" ", "  ", "\t", "\n", "\r\n", "\r", "\u00a0", "\u3000", "\u2003", "\u0085", "\u180e", "\u200b",
         "\u2028", "\u000b", "\u000c", "\u001c", "\u00ad", "é", "ü", "中", "文", "🙂", "👍🏽", "ß", "İ", "ǅ",
         "١٢٣", "²", "½", "Ⅻ", "0", "1", "23", "456", "7890", ".", ",", "!", "?", "-", "_", "#", "'", "\"", "(",
         ")", SPECIAL, "<|end", "ﬁ", "\u0301", "\ufeff", "\U0001d400", "ʰ", "々", "〇",
         "\U00031350", "\ua7cb", "\U00010d40", "\U00010d41\U00010d42"])


def random_texts(n, seed=7):
    rng = random.Random(seed)
    return ["".join(rng.choice(POOL) for _ in range(rng.randint(1, 30))) for _ in range(n)]


def expected(tok, name, round_trip, extra=()):
    rows = []
    for t in TESTS + list(extra) + random_texts(150):
        ids = tok.encode(t).ids
        back = tok.decode(ids, skip_special_tokens=False)
        assert back == t or not round_trip, (name, t, back)
        rows.append({"text": t, "ids": ids, "decoded": back})
    with open(os.path.join(OUT, f"tok_{name}_expected.json"), "w", encoding="utf-8") as f:
        json.dump(rows, f, ensure_ascii=False, indent=0)
        f.write("\n")


def train(pre, ignore_merges):
    tok = Tokenizer(models.BPE(ignore_merges=ignore_merges))
    tok.pre_tokenizer = pre
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=600, special_tokens=[SPECIAL], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus(), trainer)
    return tok


def save(tok, name, string_merges, round_trip=True, extra=(), edit=None):
    path = os.path.join(OUT, f"tok_{name}.json")
    d = json.loads(tok.to_str())
    if string_merges:
        d["model"]["merges"] = [" ".join(m) if isinstance(m, list) else m for m in d["model"]["merges"]]
    if edit:
        edit(d)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(d, f, ensure_ascii=False, separators=(",", ":"))
        f.write("\n")
    # the expected ids come from the file as written (as a user would load it)
    expected(Tokenizer.from_file(path), name, round_trip, extra)
    print(f"{path}: {os.path.getsize(path)} bytes, vocab {tok.get_vocab_size()}")


GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
RANK_SPECIALS = ["<|endoftext|>", "<|im_start|>"]


def byte_decoder():
    """GPT-2's bytes_to_unicode, inverted: byte-level character -> byte."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


def write_ranks(ranks, name):
    path = os.path.join(OUT, f"tok_{name}.tiktoken")
    with open(path, "wb") as f:
        for tok, r in sorted(ranks.items(), key=lambda kv: kv[1]):
            f.write(base64.b64encode(tok) + b" " + str(r).encode() + b"\n")
    print(f"{path}: {os.path.getsize(path)} bytes, {len(ranks)} ranks")


def save_rank_file(json_path, name="ranks"):
    """A byte-level tokenizer.json's model as tiktoken ranks: bytes 0-255, then merges in order."""
    d = json.load(open(json_path, encoding="utf-8"))
    dec = byte_decoder()
    ranks = {bytes([b]): b for b in range(256)}
    for m in d["model"]["merges"]:
        a, b = m.split(" ") if isinstance(m, str) else m
        tok = bytes(dec[ch] for ch in a + b)
        if tok not in ranks:
            ranks[tok] = len(ranks)
    write_ranks(ranks, name)
    return ranks


def tiktoken_expected(ranks, name, pattern, extra=()):
    specials = {t: len(ranks) + i for i, t in enumerate(RANK_SPECIALS)}
    enc = tiktoken.Encoding(name=f"strata_{name}", pat_str=pattern, mergeable_ranks=ranks, special_tokens=specials)
    rows = []
    for t in TESTS + SPM_TESTS + list(extra) + random_texts(150):
        ids = enc.encode(t, allowed_special="all")
        back = enc.decode(ids)
        assert back == t, (name, t, back)
        rows.append({"text": t, "ids": ids, "decoded": back})
    with open(os.path.join(OUT, f"tok_ranks_{name}_expected.json"), "w", encoding="utf-8") as f:
        json.dump(rows, f, ensure_ascii=False, indent=0)
        f.write("\n")


SPM_SPECIAL = ["<unk>", "<s>", "</s>"]
BYTE_TOKENS = [f"<0x{b:02X}>" for b in range(256)]


def train_spm(byte_fallback):
    """A BPE over characters as sentencepiece makes them (Llama-2, Mistral): words start with
    "▁"; with byte_fallback, ids 3-258 are <0x00>..<0xFF> as in Llama-2's vocabulary."""
    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=byte_fallback, fuse_unk=True))
    # trained without split, as sentencepiece does, so that runs of "▁" become tokens
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=False)
    # characters the training text lacks (SPM_TESTS, the random pool) need byte fallback or unk
    trainer = trainers.BpeTrainer(vocab_size=900, show_progress=False,
                                  special_tokens=SPM_SPECIAL + (BYTE_TOKENS if byte_fallback else []))
    # indented code: runs of "▁" (and how a splitting Metaspace cuts them matters)
    tok.train_from_iterator(corpus() + ["    if x:\n        return  y   z"] * 40, trainer)
    return tok


def bytes_in_model_only(d):
    # Llama-2's <0xNN> are model vocabulary, not added tokens (the trainer made them both)
    d["added_tokens"] = [a for a in d["added_tokens"] if a["content"] not in BYTE_TOKENS]


LLAMA2_DECODER = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                    decoders.Strip(" ", 1, 0)])


# ---- the corpus test: 32k tokenizers, 10 MB of documents, digests of the reference ids ----

CORPUS_SPECIALS = ["<|endoftext|>", "<|im_start|>"]
# what tests/test_tokenizer_corpus.c runs tools/gen_text_corpus.py with (besides -o): it reads
# them from the digest file's "corpus" lines
CORPUS_ARGS = {"valid": ["--docs", "--bytes", "10500000", "--seed", "1"],
               "invalid": ["--docs", "--invalid", "--bytes", "300000", "--seed", "3"]}
TRAIN_ARGS = ["--docs", "--bytes", "10000000", "--seed", "2"]


def crc32c_table():
    t = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        t.append(c)
    return t


CRC_TABLE = crc32c_table()


def crc32c(data):
    """CRC-32C (Castagnoli), as st_crc32c(0, data, n)."""
    c = 0xFFFFFFFF
    t = CRC_TABLE
    for b in data:
        c = t[(c ^ b) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF


def ids_bytes(ids):
    a = array.array("i", ids)
    if sys.byteorder != "little":
        a.byteswap()
    return a.tobytes()


def gen_docs(args):
    """The documents tools/gen_text_corpus.py writes with args (bytes, split at the NULs)."""
    a = argparse.Namespace(docs=True, invalid="--invalid" in args,
                           bytes=int(args[args.index("--bytes") + 1]), seed=int(args[args.index("--seed") + 1]))
    buf = io.BytesIO()
    gen_text_corpus.write_docs(a, buf)
    docs = buf.getvalue().split(b"\0")
    assert docs[-1] == b""
    return docs[:-1]


SPECIAL_RE = re.compile(b"|".join(re.escape(t.encode()) for t in CORPUS_SPECIALS))


def encode_bytes(enc, b):
    """tiktoken's ids for bytes that are not all UTF-8, as strata defines them: the special
    tokens are cut out first (as encode with allowed_special="all" finds them), and each piece
    between them goes through tiktoken's bytes API, Encoding._encode_bytes (valid UTF-8 as
    text; else the valid prefix as text, its last pre-token's tokens - with the all-whitespace
    tokens before them - taken back and BPE'd as one piece with all the bytes after it)."""
    ids, at = [], 0
    for m in SPECIAL_RE.finditer(b):
        ids += enc._encode_bytes(b[at:m.start()]) if m.start() > at else []
        ids.append(enc.encode_single_token(m.group()))
        at = m.end()
    return ids + (enc._encode_bytes(b[at:]) if at < len(b) else [])


def json_ids(ref, ranks):
    """rank-file id -> the same token's id in the tokenizer.json the rank file was made from."""
    enc_chr = {b: c for c, b in byte_decoder().items()}
    vocab = ref.get_vocab(with_added_tokens=True)
    out = {r: vocab["".join(enc_chr[x] for x in tok)] for tok, r in ranks.items()}
    for i, t in enumerate(CORPUS_SPECIALS):
        out[len(ranks) + i] = vocab[t]
    return out


def train_32k(pre, ignore_merges, text):
    tok = Tokenizer(models.BPE(ignore_merges=ignore_merges))
    tok.pre_tokenizer = pre
    tok.decoder = decoders.ByteLevel()
    # tokens of at most 16 characters, as a real vocabulary's are nearly all: without the
    # limit this corpus's few words make tokens of whole sentences and a 3.7 MB file
    trainer = trainers.BpeTrainer(vocab_size=32000, special_tokens=CORPUS_SPECIALS, show_progress=False,
                                  max_token_length=16, initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(text, trainer)
    return tok


def digest_lines(label, docs, ids_of):
    lines = []
    total = 0
    for i, (d, ids) in enumerate(zip(docs, ids_of)):
        lines.append(f"{label} {i} {len(d)} {crc32c(d):08x} {len(ids)} {crc32c(ids_bytes(ids)):08x}")
        total += len(ids)
    print(f"{label}: {len(docs)} documents, {sum(map(len, docs))} bytes, {total} ids")
    return lines


def corpus_main(keep):
    """keep: read the committed tok_corpus_*.json instead of training them again (the digests only)."""
    train_text = None if keep else [d.decode("utf-8") for d in gen_docs(TRAIN_ARGS)]
    valid = gen_docs(CORPUS_ARGS["valid"])
    invalid = gen_docs(CORPUS_ARGS["invalid"])
    texts = [d.decode("utf-8") for d in valid]
    out = [f"# tools/gen_tokenizer_fixtures.py --corpus: tokenizers {__import__('tokenizers').__version__}, "
           f"tiktoken {tiktoken.__version__}",
           "# corpus SET: the arguments of tools/gen_text_corpus.py (besides -o) that write it; NUL ends a document",
           "corpus valid " + " ".join(CORPUS_ARGS["valid"]),
           "corpus invalid " + " ".join(CORPUS_ARGS["invalid"]),
           "# tokenizer set document bytes crc32c(bytes) ids crc32c(ids as little-endian int32)"]
    models_ = {"gpt2": None, "llama3": None} if keep else {
        "gpt2": train_32k(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True), False, train_text),
        "llama3": train_32k(pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]), True, train_text),
    }
    for name, tok in models_.items():
        path = os.path.join(OUT, f"tok_corpus_{name}.json")
        if tok is not None:
            with open(path, "w", encoding="utf-8") as f:
                f.write(tok.to_str() + "\n")
        ref = Tokenizer.from_file(path)  # the ids come from the file as written
        print(f"{path}: {os.path.getsize(path)} bytes, vocab {ref.get_vocab_size()}")
        ids = [e.ids for e in ref.encode_batch(texts)]
        for t, i in zip(texts, ids):
            assert ref.decode(i, skip_special_tokens=False) == t, (name, "round trip")
        out += digest_lines(f"json_{name} valid", valid, ids)
        ranks = save_rank_file(path, f"corpus_{name}")
        pattern = GPT2_PATTERN if name == "gpt2" else LLAMA3_PATTERN
        specials = {t: len(ranks) + i for i, t in enumerate(CORPUS_SPECIALS)}
        enc = tiktoken.Encoding(name=f"strata_corpus_{name}", pat_str=pattern, mergeable_ranks=ranks,
                                special_tokens=specials)
        tids = enc.encode_batch(texts, allowed_special="all")
        for d, i in zip(valid, tids):
            assert enc.decode_bytes(i) == d, (name, "tiktoken round trip")
        out += digest_lines(f"ranks_{name} valid", valid, tids)
        bids = [encode_bytes(enc, d) for d in invalid]
        for d, i in zip(invalid, bids):
            assert enc.decode_bytes(i) == d, (name, "tiktoken bytes round trip")
        with_special = sum(SPECIAL_RE.search(d) is not None for d in invalid)
        print(f"ranks_{name} invalid: {with_special} of {len(invalid)} documents hold a special token")
        out += digest_lines(f"ranks_{name} invalid", invalid, bids)
        # the tokenizer.json: the same rule through the rank file made from it, its ids mapped
        to_json = json_ids(ref, ranks)
        out += digest_lines(f"json_{name} invalid", invalid, [[to_json[i] for i in b] for b in bids])
    path = os.path.join(OUT, "tok_corpus_digests.txt")
    with open(path, "w") as f:
        f.write("\n".join(out) + "\n")
    print(f"{path}: {os.path.getsize(path)} bytes")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--corpus", action="store_true", help="the 32k tokenizers and the corpus digests instead")
    ap.add_argument("--keep-tokenizers", action="store_true",
                    help="with --corpus: the digests of the committed 32k tokenizers, without training them again")
    a = ap.parse_args()
    if a.corpus:
        corpus_main(a.keep_tokenizers)
        return
    gpt2 = train(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True), False)
    save(gpt2, "gpt2", True)
    # the same model with a space put before each piece: decode keeps that space
    gpt2.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True, use_regex=True)
    save(gpt2, "gpt2_prefix", False, round_trip=False)
    llama3 = train(pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]), True)
    # a normalized added token that overlaps a special one which starts later: tokenizers
    # cuts out the special (normalized false) tokens first
    llama3.add_tokens([AddedToken("x<|im", normalized=True, special=False)])
    llama3.add_special_tokens([AddedToken("<|im_start|>", normalized=False, special=True)])
    save(llama3, "llama3", False)
    ranks = save_rank_file(os.path.join(OUT, "tok_llama3.json"))
    tiktoken_expected(ranks, "llama3", LLAMA3_PATTERN)
    tiktoken_expected(ranks, "gpt2", GPT2_PATTERN)
    # tokens that merges cannot reach ("bcd" needs "bc"; "abcd" then only as a whole piece, as
    # tiktoken takes a piece that is a token) and ranks that are not in length order
    small = {bytes([b]): b for b in range(256)}
    for t in [b"ab", b"bcd", b"abcd", b" abcd", b"dd", b"ddd", b"dddd", b"dd dd"]:
        small[t] = len(small)
    write_ranks(small, "ranks_small")
    tiktoken_expected(small, "small", LLAMA3_PATTERN,
                      ["abcd", " abcd", "xabcd abcd abcdabcd", "bcd abc cd", "dddddd ddddd dd dd d"])

    llama2 = train_spm(True)
    llama2.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    llama2.pre_tokenizer = None
    llama2.decoder = LLAMA2_DECODER
    # the decoder strips the space Prepend put in front: not so where a special token starts
    # the text ("<s> hello" comes back as "<s>  hello")
    save(llama2, "llama2", False, round_trip=False, extra=SPM_TESTS, edit=bytes_in_model_only)

    mistral = train_spm(True)
    mistral.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=False)
    mistral.decoder = LLAMA2_DECODER
    # a normalized added token: with Metaspace (a pre-tokenizer) its text is found as written
    mistral.add_tokens([AddedToken("x<|im", normalized=True, special=False)])
    mistral.add_special_tokens([AddedToken("<|im_start|>", normalized=False, special=True)])
    save(mistral, "mistral", False, round_trip=False, extra=SPM_TESTS, edit=bytes_in_model_only)

    def old_metaspace(d):
        # as tokenizers < 0.14 wrote it: add_prefix_space, no prepend_scheme or split
        for k in ("pre_tokenizer", "decoder"):
            d[k] = {"type": "Metaspace", "replacement": "▁", "add_prefix_space": True}

    spm_old = train_spm(False)
    spm_old.decoder = decoders.Metaspace()
    # a normalized added token in a file with a normalizer: it is looked for normalized
    spm_old.normalizer = normalizers.Replace("\t", "▁▁")
    spm_old.add_tokens([AddedToken("x\ty", normalized=True, special=False)])
    save(spm_old, "spm_old", False, round_trip=False, extra=SPM_TESTS + ["a x\ty b\tx\t\ty"], edit=old_metaspace)


if __name__ == "__main__":
    main()
