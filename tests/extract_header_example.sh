#!/usr/bin/env bash
# extract_header_example.sh HEADER OUT.c - the worked example in HEADER's opening comment,
# the lines between " * Example:" and " * End of example.", written into main() of OUT.c
# with the header included (its own #include lines go to the top), so that building OUT.c
# against libstrata checks the example (tests/CMakeLists.txt: target header_examples).
# Exits 1 naming the header when the block is missing or has no end.
set -u
h=$1 out=$2
name=$(basename "$h")
body=$(awk '
  /^ \* Example:$/ { inside = 1; found = 1; next }
  inside && /^ \* End of example\.$/ { inside = 0; done = 1; exit }
  inside && /\*\// { exit }
  inside { sub(/^ \*/, ""); sub(/^     /, ""); print }
  END { if (!found) exit 2; if (!done) exit 3 }' "$h")
case $? in
  0) ;;
  2) echo "$h: no ' * Example:' line in its opening comment" >&2; exit 1 ;;
  *) echo "$h: ' * Example:' without ' * End of example.' before the comment ends" >&2; exit 1 ;;
esac
{
  echo "/* Generated from include/strata/$name by tests/extract_header_example.sh: its worked"
  echo " * example inside main(). Edit the header, not this file. */"
  printf '#include <stdint.h>\n#include <stdio.h>\n#include <stdlib.h>\n#include <string.h>\n\n'
  echo "#include \"strata/$name\""
  printf '%s\n' "$body" | grep '^#include' || true
  echo
  echo "int main(void) {"
  printf '%s\n' "$body" | grep -v '^#include' | sed '/./,$!d; s/^./    &/'
  echo "    return 0;"
  echo "}"
} >"$out.tmp" && mv "$out.tmp" "$out"
