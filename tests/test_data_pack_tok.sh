#!/usr/bin/env bash
# test_data_pack_tok.sh - strata data pack --tokenizer end to end: text files and JSON lines
# tokenized with the GPT-2-style fixture tokenizer give, in the .bin, exactly the ids that
# Hugging Face `tokenizers` recorded for each text (tests/fixtures/tok_gpt2_expected.json,
# tools/gen_tokenizer_fixtures.py) plus the end-of-document id, in a pair read here the way
# Megatron's _IndexReader reads it; 1 and 2 threads write identical bytes; the sidecar is
# there and a smaller vocab_size is refused by the loader; cat --decode gives the texts
# back; a missing tokenizer, a missing --eod and a stale sidecar are refused by name; a tiktoken
# rank file needs its pattern said and packs tiktoken's ids with it, special tokens past the
# ranks being end-of-document ids.
set -u
S=${STRATA_BIN:?STRATA_BIN not set}
SRC=${STRATA_SOURCE_DIR:?STRATA_SOURCE_DIR not set}
PY=$(command -v python3 || true)
[ -n "$PY" ] || { echo "skip: needs python3 (the fixture rows are JSON, the pair is read with struct)"; exit 77; }
TK="$SRC/tests/fixtures/tok_gpt2.json"
T=$(mktemp -d /tmp/strata-test-packtok-XXXXXX)
fail=0
check() { if ! eval "$1"; then echo "FAIL: $2"; fail=1; fi; }

# the fixture rows: one text file each (empty texts are not documents), a JSONL of all, the
# expected ids of each document with the end-of-document id 0 (<|endoftext|>) appended
"$PY" - "$SRC/tests/fixtures/tok_gpt2_expected.json" "$T" <<'EOF'
import json, sys
rows = [r for r in json.load(open(sys.argv[1], encoding="utf-8")) if r["text"]]
out = sys.argv[2]
with open(out + "/all.jsonl", "w", encoding="utf-8") as j, open(out + "/files.txt", "w") as names:
    for k, r in enumerate(rows):
        with open("%s/d%03d.txt" % (out, k), "wb") as f:
            f.write(r["text"].encode("utf-8"))
        names.write("%s/d%03d.txt\n" % (out, k))
        j.write(json.dumps({"id": k, "text": r["text"]}, ensure_ascii=False) + "\n")
json.dump([r["ids"] + [0] for r in rows], open(out + "/expected.json", "w"))
with open(out + "/all.txt", "wb") as f:  # what cat --all --decode prints: each text and a newline
    for r in rows:
        f.write(r["text"].encode("utf-8") + b"\n")
EOF
# Reads PREFIX.idx/.bin as Megatron's _IndexReader does (header, int32 sizes, int64 byte
# pointers, int64 document indices) and compares with the expected ids.
cat >"$T/megatron_read.py" <<'EOF'
import json, struct, sys
prefix, expected = sys.argv[1], json.load(open(sys.argv[2]))
idx = open(prefix + ".idx", "rb").read()
assert idx[:9] == b"MMIDIDX\x00\x00", "magic"
version, = struct.unpack_from("<Q", idx, 9)
code = idx[17]
n, ndoc = struct.unpack_from("<QQ", idx, 18)
assert version == 1 and code == 8, "version %d dtype code %d (want 1, 8 = uint16)" % (version, code)
assert n == len(expected) and ndoc == n + 1, "%d sequences, %d document indices; expected %d" % (n, ndoc, len(expected))
sizes = struct.unpack_from("<%di" % n, idx, 34)
ptrs = struct.unpack_from("<%dq" % n, idx, 34 + 4 * n)
docs = struct.unpack_from("<%dq" % ndoc, idx, 34 + 12 * n)
assert list(docs) == list(range(n + 1)), "document indices"
binf = open(prefix + ".bin", "rb").read()
for k, want in enumerate(expected):
    got = list(struct.unpack_from("<%dH" % sizes[k], binf, ptrs[k]))
    if got != want:
        sys.exit("document %d: ids %s, tokenizers gives %s" % (k, got[:40], want[:40]))
assert ptrs[-1] + 2 * sizes[-1] == len(binf), "trailing bytes in the .bin"
print("%d documents as tokenizers encodes them" % n)
EOF

# text files, one document each, on one thread
"$S" data pack -o "$T/tx" --tokenizer "$TK" --eod 0 --threads 1 $(cat "$T/files.txt") >"$T/tx.out" 2>&1
rc=$?
check '[ $rc -eq 0 ]' "pack text files: $(tail -2 "$T/tx.out")"
"$PY" "$T/megatron_read.py" "$T/tx" "$T/expected.json" >"$T/tx.chk" 2>&1
rc=$?
check '[ $rc -eq 0 ]' "text files: $(tail -3 "$T/tx.chk")"
# JSON lines on two threads: the same documents, the same bytes
"$S" data pack -o "$T/js" --tokenizer "$TK" --eod 0 --jsonl --threads 2 "$T/all.jsonl" >"$T/js.out" 2>&1
rc=$?
check '[ $rc -eq 0 ]' "pack jsonl: $(tail -2 "$T/js.out")"
"$PY" "$T/megatron_read.py" "$T/js" "$T/expected.json" >"$T/js.chk" 2>&1
rc=$?
check '[ $rc -eq 0 ]' "jsonl: $(tail -3 "$T/js.chk")"
check 'cmp -s "$T/tx.bin" "$T/js.bin" && cmp -s "$T/tx.idx" "$T/js.idx"' "text files and jsonl packs differ"

# the sidecar
"$PY" - "$T/js.json" >"$T/side.chk" 2>&1 <<'EOF'
import json, re, sys
s = json.load(open(sys.argv[1]))
want = {"format": "strata-pack-sidecar", "version": 1, "vocab_size": 600, "eod": 0, "dtype": "uint16"}
for k, v in want.items():
    assert s.get(k) == v, "%s: %r, want %r" % (k, s.get(k), v)
assert s["tokenizer"]["name"] == "tok_gpt2.json" and re.fullmatch("[0-9a-f]{8}", s["tokenizer"]["crc32c"]), s["tokenizer"]
assert s["tokenizer"]["bytes"] > 0 and s["documents"] > 100 and s["tokens"] > s["documents"], s
EOF
rc=$?
check '[ $rc -eq 0 ]' "sidecar: $(tail -2 "$T/side.chk")"
check '"$S" data inspect "$T/js" --json | grep -q "\"vocab_size\": 600, \"eod\": 0"' "inspect shows the sidecar"

# a vocabulary smaller than the sidecar's is refused naming the file, both sizes and what to do
"$S" data inspect "$T/js" --validate 600 >/dev/null 2>&1
rc=$?
check '[ $rc -eq 0 ]' "validate 600 (the tokenizer's vocabulary) fails"
"$S" data inspect "$T/js" --validate 599 >/dev/null 2>"$T/small.err"
rc=$?
check '[ $rc -ne 0 ] && grep -q "js.json" "$T/small.err" && grep -q "600" "$T/small.err" && grep -q "599" "$T/small.err" \
  && grep -q "re-pack" "$T/small.err"' "vocab 599 < 600 not refused by the sidecar (rc $rc): $(cat "$T/small.err")"
"$S" train --model gpt2-mini --n_layer 1 --n_embd 32 --n_head 2 --batch 2 --seq 16 --quiet 1 --eval_every 0 \
  --sample_every 0 --steps 1 --vocab_size 500 --data "$T/js" --run_dir "$T/run" >"$T/train.out" 2>&1
rc=$?
check '[ $rc -ne 0 ] && grep -q "js.json" "$T/train.out" && grep -q "vocab_size" "$T/train.out"' \
  "strata train with vocab_size 500 on a 600-token pack is not refused by the sidecar (rc $rc): $(tail -2 "$T/train.out")"
check '[ ! -e "$T/run" ]' "the sidecar's refusal leaves no run directory ($(ls "$T/run" 2>/dev/null | tr '\n' ' '))"

# decode gives the texts back; --tokens gives the ids and the end-of-document id
"$S" data cat "$T/js" --all --decode --tokenizer "$TK" >"$T/back.txt" 2>"$T/back.err"
rc=$?
check '[ $rc -eq 0 ] && cmp -s "$T/back.txt" "$T/all.txt"' "cat --all --decode differs from the texts: $(cat "$T/back.err")"
"$S" data cat "$T/js" --doc 6 --decode --tokenizer "$TK" >"$T/d6.back"
check 'cmp -s "$T/d6.back" "$T/d006.txt"' "cat --doc 6 --decode differs from d006.txt"
last=$("$S" data cat "$T/js" --doc 1 --tokens | awk '{print $NF}')
check '[ "$last" = 0 ]' "document 1 does not end with the end-of-document id 0 (got $last)"

# threads 1 and 2 on a larger generated corpus (many documents per batch): identical bytes
"$PY" "$SRC/tools/gen_text_corpus.py" --bytes 400000 -o "$T/c.txt"
"$S" data pack -o "$T/c1" --tokenizer "$TK" --eod 0 --split line --threads 1 "$T/c.txt" >/dev/null 2>&1
"$S" data pack -o "$T/c2" --tokenizer "$TK" --eod 0 --split line --threads 2 --progress "$T/c.txt" >/dev/null 2>"$T/c2.err"
check '[ -s "$T/c1.bin" ] && cmp -s "$T/c1.bin" "$T/c2.bin" && cmp -s "$T/c1.idx" "$T/c2.idx"' "1 and 2 threads differ"
check 'grep -q "MB/s" "$T/c2.err" && grep -q "documents" "$T/c2.err"' "--progress prints no progress line: $(cat "$T/c2.err")"
"$S" data cat "$T/c2" --all --decode --tokenizer "$TK" >"$T/c.back"
check 'cmp -s "$T/c.back" <(grep -v "^$" "$T/c.txt")' "the corpus does not decode back line for line"

# replacing a tokenizer pack: a fault at any of its three files leaves the old set byte for byte
sums() { cat "$T/c1.bin" "$T/c1.idx" "$T/c1.json" | md5sum; }
before=$(sums)
for fault in "file.write:enospc@c1.json" "file.fsync:eio@c1.json" "file.rename:eio@c1.json" "file.rename:eio@c1.idx"; do
  STRATA_IOFAULT=$fault "$S" data pack -o "$T/c1" --tokenizer "$TK" --eod 0 "$T/d000.txt" >/dev/null 2>"$T/f.err"
  rc=$?
  check '[ $rc -ne 0 ] && grep -q "c1\.\(json\|idx\)" "$T/f.err" && [ "$(sums)" = "$before" ]' "$fault: rc $rc, old set changed or error unnamed: $(cat "$T/f.err")"
  check '[ -z "$(ls "$T" | grep "^c1\..*\(tmp\|old\)")" ]' "$fault: temporaries left: $(ls "$T" | grep '^c1')"
done

# a model directory: the end-of-document id is tokenizer_config.json's eos_token, the
# identity names the directory and the file digested
mkdir -p "$T/model" && cp "$TK" "$T/model/tokenizer.json"
printf '{"eos_token": "<|endoftext|>"}\n' >"$T/model/tokenizer_config.json"
"$S" data pack -o "$T/md" --tokenizer "$T/model" --jsonl "$T/all.jsonl" >"$T/md.out" 2>&1
rc=$?
check '[ $rc -eq 0 ] && cmp -s "$T/md.bin" "$T/js.bin" && grep -q "\"name\":\"model/tokenizer.json\"" "$T/md.json" \
  && grep -q "\"eod\":0" "$T/md.json"' "model directory with eos_token (rc $rc): $(tail -2 "$T/md.out") $(cat "$T/md.json")"

# a tiktoken rank file: the pre-tokenizer pattern is said (--pattern, a tokenizer_config.json
# beside it), never guessed, and recorded in the sidecar; special tokens are named with their
# ids (--special, added_tokens_decoder) and --eod takes one past the ranks, as Qwen's
# <|endoftext|>. The ids are PyPI tiktoken's (tok_ranks_patterns_expected.json,
# tools/gen_rank_pattern_fixtures.py) of the fullwidth digits "第１０章：２０２０年...".
RK="$SRC/tests/fixtures/tok_ranks_digits.tiktoken"
"$PY" - "$SRC/tests/fixtures/tok_ranks_patterns_expected.json" "$T" <<'EOF'
import json, sys
fx, out = json.load(open(sys.argv[1], encoding="utf-8")), sys.argv[2]
open(out + "/jp.txt", "wb").write(fx["texts"][0].encode("utf-8"))
eot = fx["special_tokens"]["<|endoftext|>"]
for name in ("qwen2", "llama3"):
    open("%s/jp_%s.ids" % (out, name), "w").write(" ".join(map(str, fx["patterns"][name]["ids"][0] + [eot])))
open(out + "/qwen2.regex", "w").write(fx["patterns"]["qwen2"]["regex"])
open(out + "/n_ranks", "w").write(str(fx["n_ranks"]))
EOF
N=$(cat "$T/n_ranks")
"$S" data pack -o "$T/r0" --tokenizer "$RK" --eod 0 "$T/jp.txt" >/dev/null 2>"$T/r0.err"
rc=$?
check '[ $rc -ne 0 ] && grep -q "tok_ranks_digits.tiktoken" "$T/r0.err" && grep -q -- "--pattern NAME|REGEX" "$T/r0.err" \
  && [ ! -e "$T/r0.bin" ]' "a rank file with no pattern not refused naming the file and --pattern (rc $rc): $(cat "$T/r0.err")"
for p in qwen2 llama3; do
  "$S" data pack -o "$T/r_$p" --tokenizer "$RK" --pattern $p --special "<|endoftext|>=$N" --eod $N "$T/jp.txt" \
    >"$T/r_$p.out" 2>&1
  rc=$?
  check '[ $rc -eq 0 ] && [ "$("$S" data cat "$T/r_$p" --tokens)" = "$(cat "$T/jp_$p.ids")" ]' \
    "--pattern $p: rc $rc, ids $("$S" data cat "$T/r_$p" --tokens 2>&1), tiktoken's $(cat "$T/jp_$p.ids"): $(tail -2 "$T/r_$p.out")"
done
check '! cmp -s "$T/r_qwen2.bin" "$T/r_llama3.bin"' "qwen2's and llama3's split give the same ids on the fullwidth digits"
"$PY" -c 'import json,sys; t=json.load(open(sys.argv[1]))["tokenizer"]; assert t["pattern"] == open(sys.argv[2]).read() and t["pattern_name"] == "qwen2", t' \
  "$T/r_qwen2.json" "$T/qwen2.regex" 2>"$T/rside.err"
rc=$?
check '[ $rc -eq 0 ]' "the sidecar does not record the pattern: $(cat "$T/rside.err")"
"$S" data pack -o "$T/r_re" --tokenizer "$RK" --pattern "$(cat "$T/qwen2.regex")" --special "<|endoftext|>=$N" --eod $N \
  "$T/jp.txt" >/dev/null 2>&1
check 'cmp -s "$T/r_re.bin" "$T/r_qwen2.bin"' "--pattern with Qwen's regex differs from --pattern qwen2"
# cat --decode reads the pattern from the sidecar
"$S" data cat "$T/r_qwen2" --decode --tokenizer "$RK" --special "<|endoftext|>=$N" >"$T/r.back" 2>"$T/r.err"
check 'cmp -s "$T/r.back" "$T/jp.txt"' "cat --decode of the rank-file pack: $(cat "$T/r.err")"
# --eod: a special token past the ranks is one of the tokenizer's ids; an id past all is refused
"$S" data pack -o "$T/r1" --tokenizer "$RK" --pattern qwen2 --eod $N "$T/jp.txt" >/dev/null 2>"$T/r1.err"
rc=$?
check '[ $rc -ne 0 ] && grep -q -- "--eod $N is no token" "$T/r1.err" && grep -q -- "--special TEXT=ID" "$T/r1.err"' \
  "--eod $N with no special token there not refused naming --eod and --special (rc $rc): $(cat "$T/r1.err")"
"$S" data pack -o "$T/r2" --tokenizer "$RK" --pattern qwen2 --special "<|endoftext|>=$N" --eod $((N + 50)) "$T/jp.txt" \
  >/dev/null 2>"$T/r2.err"
rc=$?
check '[ $rc -ne 0 ] && grep -q -- "--eod $((N + 50)) is no token" "$T/r2.err" && [ ! -e "$T/r2.bin" ]' \
  "--eod past every id not refused naming the key (rc $rc): $(cat "$T/r2.err")"
# a tokenizer_config.json beside the rank file says the pattern, the special tokens and eos
mkdir -p "$T/qwen" && cp "$RK" "$T/qwen/ranks.tiktoken"
printf '{"tokenizer_class": "QWenTokenizer", "eos_token": "<|endoftext|>", "added_tokens_decoder": {"%d": {"content": "<|endoftext|>", "special": true}, "%d": {"content": "<|im_start|>", "special": true}}}\n' \
  "$N" "$((N + 1))" >"$T/qwen/tokenizer_config.json"
"$S" data pack -o "$T/r_cfg" --tokenizer "$T/qwen/ranks.tiktoken" "$T/jp.txt" >"$T/r_cfg.out" 2>&1
rc=$?
check '[ $rc -eq 0 ] && cmp -s "$T/r_cfg.bin" "$T/r_qwen2.bin" && grep -q "\"pattern_name\":\"qwen2\"" "$T/r_cfg.json"' \
  "a rank file with Qwen's tokenizer_config.json beside it (rc $rc): $(tail -2 "$T/r_cfg.out") $(cat "$T/r_cfg.json")"

# refusals: a missing tokenizer file (named), no --eod (said how), a stale sidecar (named)
"$S" data pack -o "$T/x" --tokenizer "$T/nope/tokenizer.json" --eod 0 "$T/d000.txt" >/dev/null 2>"$T/nope.err"
rc=$?
check '[ $rc -ne 0 ] && grep -q "nope/tokenizer.json" "$T/nope.err" && [ ! -e "$T/x.bin" ]' \
  "missing tokenizer not refused by name (rc $rc): $(cat "$T/nope.err")"
"$S" data pack -o "$T/x" --tokenizer "$TK" "$T/d000.txt" >/dev/null 2>"$T/eod.err"
rc=$?
check '[ $rc -ne 0 ] && grep -q -- "--eod" "$T/eod.err" && [ ! -e "$T/x.bin" ]' "missing --eod not refused: $(cat "$T/eod.err")"
"$S" data pack -o "$T/x" --tokenizer "$TK" --eod 600 "$T/d000.txt" >/dev/null 2>"$T/eod2.err"
rc=$?
check '[ $rc -ne 0 ] && grep -q "600" "$T/eod2.err"' "--eod past the vocabulary not refused: $(cat "$T/eod2.err")"
cp "$T/c1.json" "$T/tx.json"
"$S" data inspect "$T/tx" >/dev/null 2>"$T/stale.err"
rc=$?
check '[ $rc -ne 0 ] && grep -q "tx.json" "$T/stale.err"' "a sidecar of another pack not refused: $(cat "$T/stale.err")"
# re-packing byte-level (which writes no sidecar) removes the stale one; that pair is read as before
"$S" data pack -o "$T/tx" "$T/d000.txt" >/dev/null 2>&1
check '[ ! -e "$T/tx.json" ] && "$S" data inspect "$T/tx" --validate 257 >/dev/null 2>&1' "byte-level re-pack left tx.json"
"$S" data inspect "$T/tx" --validate 100 >/dev/null 2>"$T/v100.err"
check 'grep -q "tx.bin" "$T/v100.err" && grep -q "byte offset" "$T/v100.err"' "a pair without a sidecar: $(cat "$T/v100.err")"

if [ $fail -eq 0 ]; then rm -rf "$T"; echo "data_pack_tok: ok"; else echo "data_pack_tok: FAILED (kept $T)"; fi
exit $fail
