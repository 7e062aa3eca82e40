#!/usr/bin/env bash
# test_bench_stream_cli.sh - strata bench stream's refusals: a --store-beside that is
# neither 0 nor 1 (exit 2, the flag named), and a --state-path directory that already
# holds the bench's state store (a killed run's, or another bench's), refused by name and
# left as it was. A finished run removes its store, so the store here is a real one left
# by a run killed (SIGKILL) as soon as its manifest appears.
set -u
S=${STRATA_BIN:?}
T=$(mktemp -d /tmp/strata-bench-stream-XXXXXX)
fail=0; checks=0
check() { checks=$((checks+1)); if ! eval "$1"; then echo "FAIL: $2"; fail=$((fail+1)); fi; }
tiny="--model gpt2-tiny --batch 1 --seq 8 --device-budget 1MiB"
name=strata-bench-stream-state

"$S" bench stream $tiny --steps 1 --state-path "$T" --store-beside 2 >"$T/beside.out" 2>&1; rc=$?
check '[ $rc -eq 2 ] && grep -q -- "--store-beside .2." "$T/beside.out"' \
  "--store-beside 2 exits 2 naming the flag (rc $rc): $(tail -1 "$T/beside.out")"

mkdir -p "$T/st"
"$S" bench stream $tiny --steps 1 --state-path "$T/st" >"$T/ok.out" 2>&1; rc=$?
check '[ $rc -eq 0 ] && grep -q "losses equal" "$T/ok.out"' "a tiny run with --state-path succeeds (rc $rc): $(tail -1 "$T/ok.out")"
check '[ -z "$(ls "$T/st")" ]' "a finished run removes its store: $(ls "$T/st")"

# a run killed with its store on disk: many steps, killed once the manifest is there
"$S" bench stream $tiny --steps 100000 --state-path "$T/st" >"$T/killed.out" 2>&1 &
pid=$!
for _ in $(seq 100); do
  [ -e "$T/st/$name.manifest" ] && break
  sleep 0.1
done
kill -KILL "$pid" 2>/dev/null
wait "$pid" 2>/dev/null
if [ ! -e "$T/st/$name.manifest" ]; then
  echo "FAIL: no store manifest appeared within 10 s: $(tail -2 "$T/killed.out")"
  rm -rf "$T"
  exit 1
fi
before=$(ls -l "$T/st" | md5sum)
"$S" bench stream $tiny --steps 1 --state-path "$T/st" >"$T/again.out" 2>&1; rc=$?
check '[ $rc -ne 0 ] && grep -q -- "--state-path $T/st already holds $name.manifest" "$T/again.out"' \
  "a directory holding a store is refused by name (rc $rc): $(tail -1 "$T/again.out")"
check '[ "$(ls -l "$T/st" | md5sum)" = "$before" ]' "the refused run leaves the store as it was: $(ls "$T/st")"

rm -rf "$T"
echo "bench_stream_cli: $checks checks, $fail failed"
[ $fail -eq 0 ]
