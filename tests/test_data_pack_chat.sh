#!/usr/bin/env bash
# test_data_pack_chat.sh - strata data pack --chat end to end: the conversations of
# tests/fixtures/chat_convs.jsonl packed with the Qwen2.5 and Llama-3 fixture directories give,
# in PREFIX.bin, the ids transformers' tokenizer gives the rendered text and, in PREFIX.mask,
# its assistant mask (tests/fixtures/chat_expected.json), each conversation followed by the
# end-of-document id with mask 0; --mask all is all ones; the sidecar names the mask; cat
# --decode shows the rendered text and cat --trained the assistant runs; an unknown template
# is refused quoting its first line; a bad line is refused naming file and line; a later pack
# without --chat removes the stale mask (and cat --trained then says there is none); a fault
# while replacing a chat pack leaves the old four files byte for byte; 1 and 3 threads write
# the same files over several batches.
set -u
S=${STRATA_BIN:?STRATA_BIN not set}
SRC=${STRATA_SOURCE_DIR:?STRATA_SOURCE_DIR not set}
PY=$(command -v python3 || true)
[ -n "$PY" ] || { echo "skip: needs python3 (the fixture rows are JSON)"; exit 77; }
FX="$SRC/tests/fixtures"
T=$(mktemp -d /tmp/strata-test-packchat-XXXXXX)
fail=0
check() { if ! eval "$1"; then echo "FAIL: $2"; fail=1; fi; }

# the pack's ids and mask against the fixture's rows (mask "all": all ones)
compare() { # PREFIX DIR MASKKIND
  "$PY" - "$1" "$FX/chat_expected.json" "$2" "$3" <<'EOF'
import json, struct, sys
prefix, exp, name, kind = sys.argv[1:5]
side = json.load(open(prefix + ".json"))
rows = json.load(open(exp, encoding="utf-8"))[name]
ids, mask = [], []
for r in rows:
    ids += r["ids"] + [side["eod"]]
    mask += (r["mask"] + [0]) if kind == "assistant" else [1] * (len(r["ids"]) + 1)
b = open(prefix + ".bin", "rb").read()
got = list(struct.unpack("<%dH" % (len(b) // 2), b))
m = list(open(prefix + ".mask", "rb").read())
bad = []
if got != ids: bad.append("ids differ (%d vs %d)" % (len(got), len(ids)))
if m != mask: bad.append("mask differs")
if side.get("mask") != prefix.rsplit("/", 1)[-1] + ".mask" or side.get("mask_kind") != kind:
    bad.append("sidecar mask fields: %r %r" % (side.get("mask"), side.get("mask_kind")))
if side["documents"] != len(rows) or side["tokens"] != len(ids): bad.append("sidecar counts")
print("; ".join(bad) or "ok")
EOF
}

"$S" data pack -o "$T/q" --tokenizer "$FX/chat_qwen25" --chat "$FX/chat_convs.jsonl" >"$T/q.out" 2>&1
rc=$?
check '[ $rc -eq 0 ] && grep -q "chat template qwen2.5, mask assistant" "$T/q.out"' "qwen2.5 pack rc $rc: $(cat "$T/q.out")"
r=$(compare "$T/q" chat_qwen25 assistant)
check '[ "$r" = ok ]' "qwen2.5 pack: $r"
"$S" data pack -o "$T/l" --tokenizer "$FX/chat_llama3" --chat --mask all "$FX/chat_convs.jsonl" >"$T/l.out" 2>&1
rc=$?
check '[ $rc -eq 0 ] && grep -q "chat template llama3, mask all" "$T/l.out"' "llama3 pack rc $rc: $(cat "$T/l.out")"
r=$(compare "$T/l" chat_llama3 all)
check '[ "$r" = ok ]' "llama3 --mask all: $r"

# threads: 4,501 lines (more than one batch of 4,096), a blank one among them: 1 and 3 threads
# write the same files, and the first 5 conversations are the fixture's
{ for i in $(seq 900); do cat "$FX/chat_convs.jsonl"; [ $i -eq 450 ] && echo; done; } >"$T/many.jsonl"
"$S" data pack -o "$T/m1" --tokenizer "$FX/chat_qwen25" --chat --threads 1 "$T/many.jsonl" >/dev/null 2>"$T/m.err"
"$S" data pack -o "$T/m3" --tokenizer "$FX/chat_qwen25" --chat --threads 3 "$T/many.jsonl" >/dev/null 2>>"$T/m.err"
check 'cmp -s "$T/m1.bin" "$T/m3.bin" && cmp -s "$T/m1.mask" "$T/m3.mask" && cmp -s "$T/m1.idx" "$T/m3.idx" \
  && grep -q "\"documents\":4500" "$T/m3.json" && cmp -s -n $(stat -c %s "$T/q.mask") "$T/q.mask" "$T/m3.mask"' \
  "1 and 3 threads differ, or the batches are wrong: $(cat "$T/m.err") $(grep documents "$T/m3.json")"

# cat --decode: the rendered text of conversation 2 (the end-of-document id dropped)
"$S" data cat "$T/q" --doc 1 --decode --tokenizer "$FX/chat_qwen25" >"$T/d1.txt" 2>"$T/d1.err"
"$PY" -c 'import json,sys; sys.stdout.write(json.load(open(sys.argv[1], encoding="utf-8"))["chat_qwen25"][1]["text"])' \
  "$FX/chat_expected.json" >"$T/d1.want"
check 'cmp -s "$T/d1.txt" "$T/d1.want"' "cat --decode of conversation 2 differs: $(cat "$T/d1.err")"

# cat --trained: the assistant messages' content and <|im_end|>, a run a line; refused without a mask
"$S" data cat "$T/q" --all --trained --tokenizer "$FX/chat_qwen25" >"$T/tr.txt" 2>"$T/tr.err"
"$PY" - "$FX/chat_convs.jsonl" >"$T/tr.want" <<'EOF'
import json, sys
for line in open(sys.argv[1], encoding="utf-8"):
    c = json.loads(line)
    if "messages" in c: msgs = c["messages"]
    else:
        p, q = c["prompt"], c["completion"]
        msgs = ([{"role": "user", "content": p}] if isinstance(p, str) else p) + \
               ([{"role": "assistant", "content": q}] if isinstance(q, str) else q)
    for m in msgs:
        if m["role"] == "assistant": sys.stdout.write(m["content"] + "<|im_end|>\n")
EOF
check 'cmp -s "$T/tr.txt" "$T/tr.want"' "cat --trained differs: $(diff "$T/tr.txt" "$T/tr.want" | head -5) $(cat "$T/tr.err")"

# an unknown template: refused, quoting its first line, nothing written; taken with --chat_format
"$S" data pack -o "$T/u" --tokenizer "$FX/chat_unknown" --chat "$FX/chat_convs.jsonl" >"$T/u.out" 2>&1
rc=$?
check '[ $rc -ne 0 ] && grep -qF "its first line: \"{{- bos_token }}\"" "$T/u.out" && grep -q -- "--chat_format chatml|llama3" "$T/u.out" \
  && [ ! -e "$T/u.bin" ] && [ ! -e "$T/u.mask" ]' "unknown template (rc $rc): $(cat "$T/u.out")"
"$S" data pack -o "$T/u" --tokenizer "$FX/chat_unknown" --chat --chat_format chatml "$FX/chat_convs.jsonl" >"$T/u.out" 2>&1
rc=$?
check '[ $rc -eq 0 ] && grep -q "chat template chatml" "$T/u.out" && [ -s "$T/u.mask" ]' "--chat_format chatml: $(cat "$T/u.out")"
"$S" data pack -o "$T/v" --chat "$FX/chat_convs.jsonl" >"$T/v.out" 2>&1
rc=$?
check '[ $rc -eq 2 ] && grep -q "needs --tokenizer" "$T/v.out"' "--chat without a tokenizer: $(cat "$T/v.out")"

# a bad line is refused by file and line; the earlier pack at that prefix stays
printf '%s\n' '{"messages": [{"role": "user", "content": "hi"}]}' \
  '{"messages": [{"role": "tool", "content": "42"}]}' >"$T/bad.jsonl"
sums() { cat "$T/q.bin" "$T/q.idx" "$T/q.mask" "$T/q.json" | md5sum; }
before=$(sums)
"$S" data pack -o "$T/q" --tokenizer "$FX/chat_qwen25" --chat "$T/bad.jsonl" >"$T/b.out" 2>&1
rc=$?
check '[ $rc -ne 0 ] && grep -q "bad.jsonl: line 2" "$T/b.out" && grep -q "role \"tool\"" "$T/b.out" && [ "$(sums)" = "$before" ]' \
  "bad line (rc $rc): $(cat "$T/b.out")"

# replacing a chat pack: a fault at the mask (or the sidecar after it) leaves the old set
for fault in "file.write:enospc@q.mask" "file.fsync:eio@q.mask" "file.rename:eio@q.mask" "file.rename:eio@q.json"; do
  STRATA_IOFAULT=$fault "$S" data pack -o "$T/q" --tokenizer "$FX/chat_qwen25" --chat --mask all \
    "$FX/chat_convs.jsonl" >/dev/null 2>"$T/f.err"
  rc=$?
  check '[ $rc -ne 0 ] && grep -q "q\.\(mask\|json\)" "$T/f.err" && [ "$(sums)" = "$before" ]' \
    "$fault: rc $rc, old set changed or error unnamed: $(cat "$T/f.err")"
  check '[ -z "$(ls "$T" | grep "^q\..*\(tmp\|old\)")" ]' "$fault: temporaries left: $(ls "$T" | grep '^q')"
done

# a later pack without --chat at the same prefix: no stale mask, no mask in the sidecar
printf 'plain text\n' >"$T/plain.txt"
"$S" data pack -o "$T/q" --tokenizer "$FX/chat_qwen25" "$T/plain.txt" >/dev/null 2>"$T/p.err"
rc=$?
check '[ $rc -eq 0 ] && [ ! -e "$T/q.mask" ] && ! grep -q "\"mask\"" "$T/q.json"' "stale mask after a plain pack: $(cat "$T/p.err")"
"$S" data cat "$T/q" --trained --tokenizer "$FX/chat_qwen25" >/dev/null 2>"$T/tr.err"
rc=$?
check '[ $rc -ne 0 ] && grep -q "has no loss mask" "$T/tr.err"' "cat --trained without a mask (rc $rc): $(cat "$T/tr.err")"

[ $fail -eq 0 ] && rm -rf "$T"
exit $fail
