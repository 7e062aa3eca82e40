#!/usr/bin/env bash
# test_header_examples.sh - every public header's worked example compiles and links: the
# build target example_NAME (tests/CMakeLists.txt) puts the block of include/strata/NAME.h
# between " * Example:" and " * End of example." into main() (tests/extract_header_example.sh)
# and builds it against libstrata with -Wall -Wextra -Werror; header_examples builds them all.
# Every header under include/strata/ with an Example block is checked (the CMake glob finds
# them); the headers a newcomer reads (listed below) must have one; a line that opens an
# example but is not exactly " * Example:" (so nothing would check it) is a failure. A
# failure names the header whose example does not compile, with the compiler's errors.
set -u
SRC=${STRATA_SOURCE_DIR:?STRATA_SOURCE_DIR not set}
BIN=$(dirname "${STRATA_BIN:?STRATA_BIN not set}")
command -v cmake >/dev/null || { echo "cmake not on PATH: skipped"; exit 77; }
fail=0
for h in core tensor backend model train generate block step io tier store data optim llama prof \
         tokenizer stream plan chat; do
  if ! grep -q '^ \* Example:$' "$SRC/include/strata/$h.h"; then
    echo "FAIL: include/strata/$h.h has no worked example (' * Example:' ... ' * End of example.')"
    fail=1
  fi
done
headers=()
for f in "$SRC"/include/strata/*.h; do
  if grep -q '^ \* Example:.' "$f"; then
    echo "FAIL: include/strata/$(basename "$f"): an 'Example:' line with text after it is never checked;" \
         "write ' * Example:' alone on its line"
    fail=1
  fi
  grep -q '^ \* Example:$' "$f" && headers+=("$(basename "$f" .h)")
done
# All at once first (fast when everything builds); on failure, each header's target alone,
# so the report names every header whose example does not compile.
if ! out=$(cmake --build "$BIN" --target header_examples 2>&1); then
  if ! cmake --build "$BIN" --target strata >/dev/null 2>&1; then
    echo "$out" | grep -E "error|Error" | head -20
    echo "FAIL: libstrata itself does not build (cmake --build $BIN --target strata)"
    exit 1
  fi
  for h in "${headers[@]}"; do
    if ! out=$(cmake --build "$BIN" --target "example_$h" 2>&1); then
      echo "$out" | grep -E "error|warning|undefined reference" | head -10
      echo "FAIL: include/strata/$h.h: its worked example does not compile or link" \
           "(cmake --build $BIN --target example_$h; the code: $BIN/tests/header_examples/example_$h.c)"
      fail=1
    fi
  done
  [ $fail -eq 0 ] && { echo "$out" | tail -20; echo "FAIL: header_examples failed, yet each example built"; fail=1; }
fi
[ $fail -eq 0 ] && echo "header_examples: ${#headers[@]} headers' examples compile and link: ${headers[*]}" && exit 0
echo "header_examples: FAILED"
exit 1
