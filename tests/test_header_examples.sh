#!/usr/bin/env bash
# test_header_examples.sh - every public header's worked example compiles and links: the
# build target header_examples (tests/CMakeLists.txt) puts each header's block between
# " * Example:" and " * End of example." into main() (tests/extract_header_example.sh) and
# builds it against libstrata with -Werror. The headers a newcomer reads first (core,
# tensor, backend, model, train) must have one.
set -u
SRC=${STRATA_SOURCE_DIR:?STRATA_SOURCE_DIR not set}
BIN=$(dirname "${STRATA_BIN:?STRATA_BIN not set}")
command -v cmake >/dev/null || { echo "cmake not on PATH: skipped"; exit 77; }
fail=0
for h in core tensor backend model train; do
  if ! grep -q '^ \* Example:$' "$SRC/include/strata/$h.h"; then
    echo "FAIL: include/strata/$h.h has no worked example (' * Example:' ... ' * End of example.')"
    fail=1
  fi
done
n=$(grep -l '^ \* Example:$' "$SRC"/include/strata/*.h | wc -l)
out=$(cmake --build "$BIN" --target header_examples 2>&1)
rc=$?
if [ $rc -ne 0 ]; then
  echo "$out" | grep -E "error|Error|warning|\.h:" | head -30
  echo "FAIL: a header's example does not compile or link (cmake --build $BIN --target header_examples)"
  fail=1
fi
[ $fail -eq 0 ] && echo "header_examples: $n headers' examples compile and link" && exit 0
echo "header_examples: FAILED"
exit 1
