#!/usr/bin/env bash
# test_presets.sh - every model preset `strata train --help` offers trains with the defaults:
# `strata train --model NAME --steps 2` and nothing else (the default seq 128 and the embedded
# corpus's 256 byte tokens must fit the preset's max_seq and vocabulary). gpt2-mini (and a
# -tiny fixture, were the help to offer one) runs as is; a preset of more than a few million
# parameters runs with its width and depth shrunk (--n_layer 1 --n_embd 64 --n_head 8), which
# keeps its vocabulary and max_seq, the two things the defaults must fit, and keeps the test
# to seconds on two cores (gpt2-124m as is takes 70 s, llama3.2-1b about 20 GB). The -tiny
# presets (vocabulary 64, max_seq 16) are the test fixtures' shapes, which the help does not
# offer.
set -u
S=${STRATA_BIN:?STRATA_BIN not set}
T=$(mktemp -d /tmp/strata-test-presets-XXXXXX)
fail=0
check() { if ! eval "$1"; then echo "FAIL: $2"; fail=1; fi; }

# the presets the help names on the --model line
line=$("$S" train --help | grep -E '^  --model ')
names=$(echo "$line" | grep -oE '[a-z0-9]+([.-][a-z0-9]+)+' | sort -u)
check '[ -n "$names" ] && echo "$names" | grep -qx gpt2-mini' "no presets found on the help's --model line: $line"
for m in $names; do
  extra=""
  case $m in gpt2-mini | *-tiny) ;; *) extra="--n_layer 1 --n_embd 64 --n_head 8" ;; esac
  "$S" train --model "$m" --steps 2 $extra --run_dir "$T/$m" >"$T/$m.out" 2>&1
  rc=$?
  check '[ $rc -eq 0 ] && [ "$(wc -l <"$T/$m/metrics.jsonl")" -eq 2 ]' \
    "strata train --model $m --steps 2 $extra: rc $rc: $(tail -2 "$T/$m.out")"
done

if [ $fail -eq 0 ]; then rm -rf "$T"; echo "presets: ok ($(echo $names))"; else echo "presets: FAILED (kept $T)"; fi
exit $fail
