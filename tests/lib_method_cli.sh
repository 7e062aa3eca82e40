# lib_method_cli.sh - what the training-method CLI tests share (test_lora_cli.sh,
# test_poetx_cli.sh, test_poetx_disk.sh; sourced by them, not a test itself: its name does not match test_*.sh).
# After `. "$(dirname "$0")/lib_method_cli.sh"`:
#   method_begin NAME     S (strata), T (a fresh temporary directory /tmp/strata-NAME-*),
#                         fail=0, checks=0, check COND MESSAGE (COND eval'd; counted), tiny (the
#                         keys of a tiny run: vocabulary 256, batch 2 x seq 16, quiet), losses DIR
#                         (the run's logged losses on one line); skips (77) without jq.
#   resume_refused DIR KEY ARGS...
#                         `strata train --resume DIR ARGS --steps 9` must fail naming key KEY and
#                         leave DIR/config.json as it was.
#   refused NAME ARGS W1 W2
#                         `strata train ARGS --run_dir T/bad_NAME` must fail, its output naming
#                         W1 and W2, and create no run directory.
#   method_end NAME       prints the count of checks, removes T when all passed (kept to look
#                         at otherwise); its status is the test's.
method_begin() {
    S=${STRATA_BIN:?STRATA_BIN not set}
    command -v jq >/dev/null || { echo "no jq: skipped"; exit 77; }
    T=$(mktemp -d "/tmp/strata-$1-XXXXXX")
    fail=0
    checks=0
    tiny="--vocab_size 256 --batch 2 --seq 16 --sample_every 0 --eval_every 0 --quiet 1"
}
check() { checks=$((checks+1)); if ! eval "$1"; then echo "FAIL: $2"; fail=$((fail+1)); fi; }
losses() { jq -r .loss "$1/metrics.jsonl" | tr '\n' ' '; }

resume_refused() {
    local dir=$1 key=$2 sum rc out
    shift 2
    sum=$(md5sum <"$dir/config.json")
    out="$T/resume_refused_$key.out"
    "$S" train --resume "$dir" "$@" --steps 9 >"$out" 2>&1
    rc=$?
    check '[ $rc -ne 0 ] && grep -q "key '"'"'$key'"'"'" "$out" && [ "$(md5sum <"$dir/config.json")" = "$sum" ]' \
      "resume with $* refused naming key '$key', config.json untouched (rc $rc): $(tail -1 "$out")"
}

refused() {
    local name=$1 w1=$3 w2=$4 rc
    "$S" train $2 --run_dir "$T/bad_$name" >"$T/bad_$name.out" 2>&1
    rc=$?
    check '[ $rc -ne 0 ] && grep -q -- "$w1" "$T/bad_$name.out" && grep -q -- "$w2" "$T/bad_$name.out" && [ ! -e "$T/bad_$name" ]' \
      "$name: refused naming '$w1' and '$w2', no run directory (rc $rc): $(tail -1 "$T/bad_$name.out")"
}

method_end() {
    echo "$1: $checks checks, $((checks - fail)) passed, $fail failed"
    [ $fail -eq 0 ] && rm -rf "$T"
    [ $fail -eq 0 ]
}
