#!/usr/bin/env bash
# test_data_pack.sh - strata data pack / inspect / cat end to end: text and JSON-lines
# in, a Megatron .bin/.idx out, every document read back byte for byte; bad input
# refused with the file named; strata bench data prints its fields.
set -u
S=${STRATA_BIN:?STRATA_BIN not set}
T=$(mktemp -d /tmp/strata-test-pack-XXXXXX)
fail=0
check() { if ! eval "$1"; then echo "FAIL: $2"; fail=1; fi; }

printf 'The quick brown fox.\nJumps over the lazy dog.\n' > "$T/a.txt"
printf 'caf\xc3\xa9 \xe2\x82\xac 100\n\ttabs\tand \\ backslashes\n' > "$T/b.txt"
printf 'third document, no newline at the end' > "$T/c.txt"
"$S" data pack -o "$T/ds" "$T/a.txt" "$T/b.txt" "$T/c.txt" > "$T/pack.out" 2>&1
rc=$?
check '[ $rc -eq 0 ]' "pack failed: $(cat "$T/pack.out")"
"$S" data inspect "$T/ds" --json > "$T/inspect.json"
bytes=$(cat "$T/a.txt" "$T/b.txt" "$T/c.txt" | wc -c)
check 'grep -q "\"documents\": 3," "$T/inspect.json"' "inspect documents: $(cat "$T/inspect.json")"
check 'grep -q "\"tokens\": $((bytes + 3))," "$T/inspect.json"' "inspect tokens != bytes + 3 EOD: $(cat "$T/inspect.json")"
check 'grep -q "\"dtype\": \"uint16\"" "$T/inspect.json"' "inspect dtype"
i=0
for f in a b c; do
  "$S" data cat "$T/ds" --doc $i > "$T/back.$f"
  check 'cmp -s "$T/$f.txt" "$T/back.$f"' "document $i does not round-trip"
  i=$((i + 1))
done
last=$("$S" data cat "$T/ds" --doc 2 --tokens | awk '{print $NF}')
check '[ "$last" = 256 ]' "document does not end with the end-of-document token 256 (got $last)"
"$S" data inspect "$T/ds" --validate 257 > /dev/null
rc=$?
check '[ $rc -eq 0 ]' "validate 257"
"$S" data inspect "$T/ds" --validate 200 > /dev/null 2> "$T/val.err"
rc=$?
check '[ $rc -ne 0 ] && grep -q "ds.bin" "$T/val.err" && grep -q "byte offset" "$T/val.err"' "validate 200 should fail naming the file and offset: $(cat "$T/val.err")"

# JSON lines, another key, plus line and blank-line splitting
printf '{"text": "first line doc", "id": 1}\n{"id": 2, "text": "second \\"quoted\\" doc\\n"}\n\n{"text": "third"}\n' > "$T/d.jsonl"
"$S" data pack --jsonl -o "$T/js" "$T/d.jsonl" > /dev/null
rc=$?
check '[ $rc -eq 0 ]' "jsonl pack"
check '[ "$("$S" data cat "$T/js" --doc 1)" = "second \"quoted\" doc" ]' "jsonl doc 1 wrong: $("$S" data cat "$T/js" --doc 1)"
check '"$S" data inspect "$T/js" --json | grep -q "\"documents\": 3,"' "jsonl documents"
"$S" data pack --jsonl --key body -o "$T/js2" "$T/d.jsonl" > /dev/null 2> "$T/js2.err"
rc=$?
check '[ $rc -ne 0 ] && grep -q "d.jsonl: line 1" "$T/js2.err"' "missing key should name the file and line: $(cat "$T/js2.err")"
printf 'p1 l1\np1 l2\n\np2\n\n\np3\n' > "$T/e.txt"
"$S" data pack --split blank -o "$T/bl" "$T/e.txt" > /dev/null
check '"$S" data inspect "$T/bl" --json | grep -q "\"documents\": 3,"' "blank split"
"$S" data pack --split line -o "$T/ln" "$T/e.txt" > /dev/null
check '"$S" data inspect "$T/ln" --json | grep -q "\"documents\": 4,"' "line split"

# bad input: truncated .bin, wrong magic
cp "$T/ds.idx" "$T/tr.idx"; head -c 10 "$T/ds.bin" > "$T/tr.bin"
"$S" data inspect "$T/tr" > /dev/null 2> "$T/tr.err"
rc=$?
check '[ $rc -ne 0 ] && grep -q "tr.bin" "$T/tr.err" && grep -q "truncated" "$T/tr.err"' "truncated bin: $(cat "$T/tr.err")"
printf 'XXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXX' > "$T/mg.idx"; cp "$T/ds.bin" "$T/mg.bin"
"$S" data inspect "$T/mg" > /dev/null 2> "$T/mg.err"
rc=$?
check '[ $rc -ne 0 ] && grep -q "mg.idx: offset 0" "$T/mg.err"' "bad magic: $(cat "$T/mg.err")"

# help and the benchmark's fields
check '"$S" data --help | grep -q "pack"' "data --help"
check '"$S" bench data --help | grep -q "first_batch_s"' "bench data --help"
"$S" bench data --json --tokens 3e6 --seconds 0.3 --seq-len 256 --dir "$T" > "$T/bench.json"
rc=$?
check '[ $rc -eq 0 ]' "bench data failed"
for k in first_batch_s tokens_per_s bytes_per_token cpu_s_per_gtok rss_mb memcpy_gbps; do
  check 'grep -q "\"$k\": [0-9]" "$T/bench.json"' "bench field $k missing: $(cat "$T/bench.json")"
done
check '[ -z "$(ls "$T" | grep strata-bench-data)" ]' "bench left its files behind"

if [ $fail -eq 0 ]; then rm -rf "$T"; echo "data_pack: ok"; else echo "data_pack: files in $T"; fi
exit $fail
