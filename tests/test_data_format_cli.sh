#!/usr/bin/env bash
# test_data_format_cli.sh - a token file's format is read from its header or said in the
# data list (FORMAT@PATH[:WEIGHT]), never guessed: `strata train --data` and
# `strata data inspect` refuse a headerless file, a .bin without its .idx and an llm.c
# shard with a damaged magic, and take the same files with their format said.
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
"$S" train $small --steps 1 --data "$T/a.bin" --run_dir "$T/r2" >"$T/e2.txt" 2>&1; rc=$?
check '[ $rc -ne 0 ] && grep -q "a.idx" "$T/e2.txt" && grep -q "raw16@" "$T/e2.txt"' "a .bin without its .idx is refused, naming the .idx (rc $rc)"
"$S" data inspect "$T/a.bin" >"$T/e3.txt" 2>&1; rc=$?
check '[ $rc -ne 0 ] && grep -q "offset 0" "$T/e3.txt"' "data inspect refuses it too"
"$S" data inspect "raw16@$T/a.bin" >"$T/i.txt" 2>&1; rc=$?
check '[ $rc -eq 0 ] && grep -q "format: *raw16" "$T/i.txt"' "data inspect takes raw16@PATH"

# the same files with their format said: FORMAT@PATH:WEIGHT beside a plain Megatron prefix
"$S" train $small --steps 2 --data "raw16@$T/a.bin:0.5,$T/b:0.3,megatron@$T/b:0.2" --run_dir "$T/ok" >"$T/ok.txt" 2>&1; rc=$?
check '[ $rc -eq 0 ] && [ $(wc -l < "$T/ok/metrics.jsonl") -eq 2 ]' "training on raw16@PATH:WEIGHT with Megatron sources (rc $rc)"
"$S" train $small --steps 1 --data "rawl6@$T/a.bin" --run_dir "$T/r4" >"$T/e4.txt" 2>&1; rc=$?
check '[ $rc -ne 0 ] && grep -q "unknown format .rawl6." "$T/e4.txt"' "a misspelt format is named (rc $rc)"

if [ $fail -eq 0 ]; then rm -rf "$T"; else echo "kept $T"; fi
echo "data_format_cli: $checks checks, $((checks-fail)) passed, $fail failed"
[ $fail -eq 0 ]
