#!/usr/bin/env bash
# test_data_format_cli.sh - a token file's format is read from its header or said in the
# data list (FORMAT@PATH[:WEIGHT]), never guessed: `strata train --data` and
# `strata data inspect` refuse a headerless file, a .bin without its .idx and an llm.c
# shard with a damaged magic, and take the same files with their format said. A data list
# refused (a file of unknown format, a missing or unreadable one, a bad weight, in data or
# val_data) leaves no run directory behind: it is checked before anything is written.
set -u
S=${STRATA_BIN:?}
T=$(mktemp -d /tmp/strata-datafmt-XXXXXX)
fail=0; checks=0
check() { checks=$((checks+1)); if ! eval "$1"; then echo "FAIL: $2"; fail=$((fail+1)); fi; }
small="--model gpt2-mini --n_layer 2 --n_embd 64 --n_head 2 --batch 4 --seq 32 --vocab_size 257"

for i in $(seq 1 100); do echo "line $i of the corpus, with some words in it."; done > "$T/a.txt"
"$S" data pack -o "$T/a" --split line "$T/a.txt" >/dev/null 2>&1 && "$S" data pack -o "$T/b" --split line "$T/a.txt" >/dev/null 2>&1
check '[ -f "$T/a.idx" ] && [ -f "$T/b.bin" ]' "data pack writes .bin/.idx"
mv "$T/a.idx" "$T/a.idx.away"   # a.bin alone: uint16 tokens with no header
# an llm.c shard whose magic was zeroed: header words 0 (magic), 1 (version), N (tokens), then a.bin
n=$(( $(stat -c %s "$T/a.bin") / 2 ))
{ printf '\x00\x00\x00\x00\x01\x00\x00\x00'; printf "\\x$(printf %02x $((n & 255)))\\x$(printf %02x $(((n >> 8) & 255)))\\x$(printf %02x $(((n >> 16) & 255)))\\x00";
  head -c 1012 /dev/zero; cat "$T/a.bin"; } > "$T/shard.bin"

"$S" train $small --steps 1 --data "$T/shard.bin" --run_dir "$T/r1" >"$T/e1.txt" 2>&1; rc=$?
check '[ $rc -ne 0 ] && grep -q "shard.bin" "$T/e1.txt" && grep -q "00 00 00 00 01 00 00 00" "$T/e1.txt" && grep -q "raw16@" "$T/e1.txt"' \
  "an llm.c shard with a zeroed magic is refused, with its first bytes and the ways to say its format (rc $rc)"
check '[ ! -f "$T/r1/metrics.jsonl" ]' "no step runs on a file of unknown format"
check '[ ! -e "$T/r1" ]' "a refused data list leaves no run directory ($(ls "$T/r1" 2>/dev/null | tr '\n' ' '))"
"$S" train $small --steps 1 --data "$T/a.bin" --run_dir "$T/r2" >"$T/e2.txt" 2>&1; rc=$?
check '[ $rc -ne 0 ] && grep -q "a.idx" "$T/e2.txt" && grep -q "raw16@" "$T/e2.txt"' "a .bin without its .idx is refused, naming the .idx (rc $rc)"
check '[ ! -e "$T/r2" ]' "no run directory after a .bin without its .idx"
"$S" data inspect "$T/a.bin" >"$T/e3.txt" 2>&1; rc=$?
check '[ $rc -ne 0 ] && grep -q "offset 0" "$T/e3.txt"' "data inspect refuses it too"
"$S" data inspect "raw16@$T/a.bin" >"$T/i.txt" 2>&1; rc=$?
check '[ $rc -eq 0 ] && grep -q "format: *raw16" "$T/i.txt"' "data inspect takes raw16@PATH"

# the same files with their format said: FORMAT@PATH:WEIGHT beside a plain Megatron prefix
"$S" train $small --steps 2 --data "raw16@$T/a.bin:0.5,$T/b:0.3,megatron@$T/b:0.2" --run_dir "$T/ok" >"$T/ok.txt" 2>&1; rc=$?
check '[ $rc -eq 0 ] && [ $(wc -l < "$T/ok/metrics.jsonl") -eq 2 ]' "training on raw16@PATH:WEIGHT with Megatron sources (rc $rc)"
"$S" train $small --steps 1 --data "rawl6@$T/a.bin" --run_dir "$T/r4" >"$T/e4.txt" 2>&1; rc=$?
check '[ $rc -ne 0 ] && grep -q "unknown format .rawl6." "$T/e4.txt"' "a misspelt format is named (rc $rc)"
check '[ ! -e "$T/r4" ]' "no run directory after a misspelt format"

# more refusals before anything is written: a missing file, a directory, a weight that is
# not a positive number, a bad val_data, a file this user cannot read
"$S" train $small --steps 1 --data "$T/b:0.5,$T/missing.bin:0.5" --run_dir "$T/r5" >"$T/e5.txt" 2>&1; rc=$?
check '[ $rc -ne 0 ] && grep -q "key .data.: $T/missing.bin: cannot open" "$T/e5.txt" && [ ! -e "$T/r5" ]' \
  "a missing file is refused, named, with no run directory (rc $rc: $(tail -n 1 "$T/e5.txt"))"
mkdir -p "$T/dir.bin"
"$S" train $small --steps 1 --data "raw16@$T/dir.bin" --run_dir "$T/r6" >"$T/e6.txt" 2>&1; rc=$?
check '[ $rc -ne 0 ] && grep -q "dir.bin" "$T/e6.txt" && [ ! -e "$T/r6" ]' \
  "a directory as a token file is refused, with no run directory (rc $rc: $(tail -n 1 "$T/e6.txt"))"
"$S" train $small --steps 1 --data "$T/b:0" --run_dir "$T/r7" >"$T/e7.txt" 2>&1; rc=$?
check '[ $rc -ne 0 ] && grep -q "weight .0. of source" "$T/e7.txt" && [ ! -e "$T/r7" ]' \
  "a zero weight is refused, with no run directory (rc $rc: $(tail -n 1 "$T/e7.txt"))"
"$S" train $small --steps 1 --data "$T/b" --val_data "$T/a.bin" --eval_every 1 --run_dir "$T/r8" >"$T/e8.txt" 2>&1; rc=$?
check '[ $rc -ne 0 ] && grep -q "key .val_data.: $T/a.bin" "$T/e8.txt" && [ ! -e "$T/r8" ]' \
  "a val_data file of unknown format is refused, with no run directory (rc $rc: $(tail -n 1 "$T/e8.txt"))"
if [ "$(id -u)" -eq 0 ] && command -v setpriv >/dev/null; then as_user() { setpriv --reuid=65534 --regid=65534 --clear-groups "$@"; }
else as_user() { "$@"; }; fi
mkdir -p "$T/w" && chmod 777 "$T/w" && chmod 755 "$T" && cp "$T/b.bin" "$T/w/u.bin" && cp "$T/b.idx" "$T/w/u.idx" && chmod 000 "$T/w/u.bin"
if as_user "$S" --help >/dev/null 2>&1 && ! as_user cat "$T/w/u.bin" >/dev/null 2>&1; then
  as_user "$S" train $small --steps 1 --data "$T/w/u" --run_dir "$T/w/r9" >"$T/e9.txt" 2>&1; rc=$?
  check '[ $rc -ne 0 ] && grep -q "u.bin: cannot open: Permission denied" "$T/e9.txt" && [ ! -e "$T/w/r9" ]' \
    "an unreadable file is refused, with no run directory (rc $rc: $(tail -n 1 "$T/e9.txt"))"
else
  echo "the unreadable-file case not run: no user here for whom a mode-000 file is unreadable"
fi

if [ $fail -eq 0 ]; then rm -rf "$T"; else echo "kept $T"; fi
echo "data_format_cli: $checks checks, $((checks-fail)) passed, $fail failed"
[ $fail -eq 0 ]
