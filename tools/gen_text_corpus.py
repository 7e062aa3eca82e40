#!/usr/bin/env python3
"""gen_text_corpus.py - a deterministic UTF-8 text corpus for tokenizer tests and benchmarks.

Mixes English prose, Chinese, source code, emoji (with skin tones and ZWJ sequences), long
runs of spaces and of digits, tabs and blank lines, one paragraph or code block a line
group. The same --seed and --bytes give the same file byte for byte (Python's own
`random`, no third-party package), and the output is always valid UTF-8 of exactly
--bytes bytes or less (it stops at the last whole line that fits).

    python3 tools/gen_text_corpus.py --bytes 10000000 -o /tmp/corpus.txt
    python3 tools/gen_text_corpus.py --bytes 200000 --jsonl -o docs.jsonl   # {"text": ...} a line
    python3 tools/gen_text_corpus.py --docs --bytes 10000000 -o docs.bin     # NUL after each document
    python3 tools/gen_text_corpus.py --docs --invalid --bytes 300000 -o bad.bin

--docs writes documents for the tokenizer corpus test (tests/test_tokenizer_corpus.c,
tools/gen_tokenizer_fixtures.py --corpus): each document is 25-250 paragraphs (3-30 with
--invalid) as above, some of them long runs (hundreds to thousands of spaces, digits,
newlines, mixed whitespace, an emoji repeated), and the special tokens
<|endoftext|> and <|im_start|> (and pieces of them) put anywhere, even inside a word, and is
followed by one NUL byte (the text never holds one). The output without the NULs is valid
UTF-8. With --invalid each document also gets invalid UTF-8: stray continuation bytes,
C0/C1/F5-FF, sequences cut short, overlong forms, UTF-16 surrogates, code points past
U+10FFFF, and some documents end inside a character. The default output (no --docs) is
unchanged by these options.
"""
import argparse
import json
import random
import sys

ENGLISH = ("the model reads text and writes tokens while the optimizer keeps its state on disk "
           "we're sure it'll work they've said I'm here you'd think DON'T stop Can't WE'LL see "
           "training offload memory bandwidth gradient checkpoint layer attention head batch "
           "a an of to in is was for on with as by at from that this which be are it not").split()
CHINESE = ("我们 模型 训练 数据 文本 中文 北京 东京 上海 计算 内存 磁盘 梯度 优化器 注意力 "
           "机器 学习 语言 今天 天气 很好 你好 世界 的 了 是 在 有 和 人 这 中 大 为 上 个 国").split()
CODE = [
    "def main(argv):\n    return run(argv[1:]) or 0\n",
    "for (int i = 0; i < n; i++) {\n\ty[i] = 2.0f * x[i] + b;\n}\n",
    "if __name__ == \"__main__\":\n    sys.exit(main(sys.argv))\n",
    "static inline uint32_t rotl(uint32_t x, int k) { return (x << k) | (x >> (32 - k)); }\n",
    "    let v: Vec<u8> = s.bytes().filter(|b| *b != b' ').collect();\n",
    "SELECT id, name FROM users WHERE age >= 18 ORDER BY name;\n",
    "<div class=\"row\"><span>{{ item.title }}</span></div>\n",
]
EMOJI = ["🙂", "🚀", "👍🏽", "👩‍💻", "🇯🇵", "❤️", "🎉", "🤖", "😀😃😄", "🧑🏿‍🚀"]
OTHER = "café naïve Zürich résumé ещё привет мир γειά σου κόσμε שלום مرحبا नमस्ते".split()


def paragraph(r):
    kind = r.random()
    if kind < 0.40:  # English prose with some capitals and punctuation
        words = [r.choice(ENGLISH) for _ in range(r.randint(5, 60))]
        words[0] = words[0].capitalize()
        text = " ".join(words)
        return text + r.choice([".", "!", "?", "...", ""]) + "\n"
    if kind < 0.60:  # Chinese, no spaces, full-width punctuation
        return "".join(r.choice(CHINESE) for _ in range(r.randint(5, 50))) + r.choice(["。", "！", "？", "，"]) + "\n"
    if kind < 0.75:  # code
        return "".join(r.choice(CODE) for _ in range(r.randint(1, 4)))
    if kind < 0.82:  # emoji mixed with words
        return " ".join(r.choice(EMOJI + ENGLISH + OTHER) for _ in range(r.randint(3, 20))) + "\n"
    if kind < 0.90:  # runs of spaces (and tabs) between words
        return "".join(r.choice(ENGLISH) + " " * r.randint(1, 40) + ("\t" if r.random() < 0.1 else "")
                       for _ in range(r.randint(2, 8))) + "\n"
    if kind < 0.97:  # runs of digits: numbers, dates, long serials
        parts = [str(r.randint(0, 10 ** r.randint(1, 30))) for _ in range(r.randint(1, 8))]
        return " ".join(parts) + " 2026-12-01 3.14159\n"
    return "\n" * r.randint(1, 3)  # blank lines


SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|endof", "<|im_", "|>", "<|"]
INVALID = [b"\x80", b"\xbf", b"\xc0\xaf", b"\xc1", b"\xf5", b"\xff", b"\xfe\xff", b"\xe4\xb8", b"\xe4",
           b"\xf0\x9f\x99", b"\xed\xa0\x80", b"\xed\xbf\xbf", b"\xe0\x80\xaf", b"\xf4\x90\x80\x80",
           b"\xf8\x88\x80\x80\x80", b"\xc3", b"\xc3 ", b" \xff\xfe ", b"\x80\x80\x80\x80"]


def long_run(r):
    """Hundreds to thousands of one kind of character: what indented code, tables and dumps hold."""
    kind = r.random()
    if kind < 0.35:
        return r.choice(ENGLISH) + " " * r.randint(50, 3000) + r.choice(ENGLISH) + "\n"
    if kind < 0.65:
        return "".join(r.choice("0123456789") for _ in range(r.randint(50, 2000))) + "\n"
    if kind < 0.80:
        return "\n" * r.randint(10, 500)
    if kind < 0.90:
        return "".join(r.choice([" ", "\t", "\n", "\r\n", "\u3000", "\u00a0"]) for _ in range(r.randint(50, 1000)))
    return r.choice(EMOJI) * r.randint(20, 300) + "\n"


def document(r, most):
    parts = []
    for _ in range(r.randint(most // 10, most)):
        p = long_run(r) if r.random() < 0.03 else paragraph(r)
        if r.random() < 0.05:  # a special token (or a piece of one) anywhere in the paragraph
            at = r.randint(0, len(p))
            p = p[:at] + r.choice(SPECIALS) + p[at:]
        parts.append(p)
    return "".join(parts)


def corrupt(r, doc):
    """Valid UTF-8 bytes of doc with invalid sequences put in at random byte offsets."""
    b = bytearray(doc.encode("utf-8"))
    for _ in range(r.randint(1, 12)):
        at = r.randint(0, len(b))
        b[at:at] = r.choice(INVALID)
    if r.random() < 0.3:  # ends inside a character
        b += "中🙂é".encode("utf-8")[:r.choice([1, 2, 4, 5])]
    return bytes(b)


def write_docs(a, out):
    r = random.Random(a.seed)
    total = 0
    while True:
        doc = document(r, 30 if a.invalid else 250)
        data = corrupt(r, doc) if a.invalid else doc.encode("utf-8")
        if total + len(data) + 1 > a.bytes:
            break
        out.write(data + b"\0")
        total += len(data) + 1


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bytes", type=int, default=10_000_000, help="size of the output (at most)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--jsonl", action="store_true", help='one {"text": ...} document of a few paragraphs a line')
    ap.add_argument("--docs", action="store_true", help="documents for the tokenizer corpus test, a NUL after each")
    ap.add_argument("--invalid", action="store_true", help="with --docs: put invalid UTF-8 into every document")
    ap.add_argument("-o", "--output", default="-")
    a = ap.parse_args()
    r = random.Random(a.seed)
    out = sys.stdout.buffer if a.output == "-" else open(a.output, "wb")
    if a.docs:
        write_docs(a, out)
        out.flush()
        if out is not sys.stdout.buffer:
            out.close()
        return
    total = 0
    while True:
        if a.jsonl:
            doc = "".join(paragraph(r) for _ in range(r.randint(1, 6)))
            line = (json.dumps({"text": doc}, ensure_ascii=False) + "\n").encode("utf-8")
        else:
            line = paragraph(r).encode("utf-8")
        if total + len(line) > a.bytes:
            break
        out.write(line)
        total += len(line)
    out.flush()
    if out is not sys.stdout.buffer:
        out.close()


if __name__ == "__main__":
    main()
