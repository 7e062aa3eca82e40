#!/usr/bin/env bash
# test_probe.sh - strata probe end to end: valid JSON with positive bandwidths for each
# path, the test file removed, -o writing the same profile, clear errors for a missing
# directory and a bad option; both engines (io_uring where available, the thread pool).
set -u
S=${STRATA_BIN:?STRATA_BIN not set}
T=$(mktemp -d /tmp/strata-test-probe-XXXXXX)
fail=0
check() { if ! eval "$1"; then echo "FAIL: $2"; fail=1; fi; }
command -v jq >/dev/null || { echo "jq not installed: skipped"; exit 77; }

mkdir -p "$T/a" "$T/b"
"$S" probe --path "$T/a" --path "$T/b" --bytes 64MiB --json -o "$T/profile.json" >"$T/out.json" 2>"$T/err.txt"
rc=$?
check '[ $rc -eq 0 ]' "probe failed: $(cat "$T/err.txt")"
check 'jq -e ".paths | length == 2" "$T/out.json" >/dev/null' "two paths: $(cat "$T/out.json")"
check 'jq -e "all(.paths[]; .read_gbps > 0 and .write_gbps > 0 and .mixed_gbps > 0 and .request_bytes >= 1048576 and .depth >= 32 and .bytes == 67108864)" "$T/out.json" >/dev/null' \
  "positive bandwidths, engine request size and depth: $(cat "$T/out.json")"
check 'jq -e ".paths[0].path == \"$T/a\" and (.paths[0].engine | test(\"io_uring|threads\")) and (.paths[0].direct | type == \"boolean\")" "$T/out.json" >/dev/null' \
  "path, engine and direct fields: $(cat "$T/out.json")"
check 'cmp -s "$T/out.json" "$T/profile.json"' "-o writes the printed profile"
check '[ -z "$(find "$T/a" "$T/b" -type f)" ]' "test files removed: $(find "$T/a" "$T/b" -type f)"

STRATA_IO=threads "$S" probe --path "$T/a" --bytes 16MiB --json >"$T/thr.json" 2>"$T/thr.err"
rc=$?
check '[ $rc -eq 0 ] && jq -e ".paths[0].engine == \"threads\" and .paths[0].read_gbps > 0" "$T/thr.json" >/dev/null' \
  "STRATA_IO=threads probe: $(cat "$T/thr.json" "$T/thr.err")"
check 'grep -q "threads" "$T/thr.err"' "the log says which engine: $(cat "$T/thr.err")"

"$S" probe --path "$T/missing" --bytes 16MiB >"$T/e1" 2>&1; rc=$?
check '[ $rc -eq 1 ] && grep -q "$T/missing" "$T/e1"' "a missing directory is named: $(cat "$T/e1")"
"$S" probe --bytes 16MiB >"$T/e2" 2>&1; rc=$?
check '[ $rc -eq 2 ]' "no --path is a usage error"
"$S" probe --path "$T/a" --bytes lots >"$T/e3" 2>&1; rc=$?
check '[ $rc -eq 2 ] && grep -q "lots" "$T/e3"' "bad --bytes is named: $(cat "$T/e3")"
check '"$S" probe --help | grep -q "read_gbps"' "probe --help documents the profile"

[ $fail -eq 0 ] && rm -rf "$T"
exit $fail
