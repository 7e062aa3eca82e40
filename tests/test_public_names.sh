#!/usr/bin/env bash
# test_public_names.sh - the one naming rule for public symbols (docs/ARCHITECTURE.md):
# everything a header under include/strata/ declares starts with st_ (functions, types,
# struct/enum tags) or ST_ (macros, enumerators); only the include guards STRATA_*_H differ.
# Functions come from the compiler itself (gcc -aux-info over a file including every
# header); macros from `cc -E -dD`; types, tags and enumerators from the preprocessed text
# of the headers alone (line markers say which file a line came from). A failure lists each
# symbol without the prefix with its header and line. Types of the libraries strata
# passes through (json-c's json_object) are the one exception, listed by name.
set -u
SRC=${STRATA_SOURCE_DIR:?STRATA_SOURCE_DIR not set}
command -v gcc >/dev/null || { echo "gcc not on PATH (needed for -aux-info): skipped"; exit 77; }
command -v python3 >/dev/null || { echo "python3 not on PATH: skipped"; exit 77; }
tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT
n=0
for f in "$SRC"/include/strata/*.h; do
  printf '#include "strata/%s"\n' "$(basename "$f")" >> "$tmp/all.c"; n=$((n + 1))
done
[ "$n" -gt 0 ] || { echo "FAIL: no header under $SRC/include/strata"; exit 1; }
gcc -std=c11 -I"$SRC/include" -aux-info "$tmp/aux.txt" -fsyntax-only "$tmp/all.c" || {
  echo "FAIL: the public headers do not compile together"; exit 1; }
gcc -std=c11 -I"$SRC/include" -E -dD "$tmp/all.c" > "$tmp/pp.c" || exit 1
python3 - "$SRC/include/strata" "$tmp/aux.txt" "$tmp/pp.c" <<'PY'
import re, sys
inc, aux, pp = sys.argv[1], sys.argv[2], sys.argv[3]
bad, seen = [], set()
EXTERNAL = {'json_object'}  # json-c's type, named by a header that passes it through
def check(name, where, upper):
    if name in EXTERNAL: return
    ok = name.startswith('ST_') if upper else name.startswith('st_')
    if upper and re.fullmatch(r'STRATA_[A-Z0-9_]+_H', name): ok = True
    if not ok and (name, where) not in seen:
        seen.add((name, where)); bad.append('%s (%s)' % (name, where))
nfun = 0
for line in open(aux):
    m = re.match(r'/\* (\S+):(\d+):\w+ \*/ (.*)', line)
    if not m or not m.group(1).startswith(inc): continue
    fm = re.search(r'([A-Za-z_]\w*) \((?!\*)', m.group(3))
    if fm: nfun += 1; check(fm.group(1), '%s:%s' % (m.group(1)[len(inc)+1:], m.group(2)), False)
# the headers' own lines of the preprocessed text
cur, ours, lines = '', [], []
for line in open(pp):
    m = re.match(r'# (\d+) "([^"]+)"', line)
    if m: cur = m.group(2); continue
    if cur.startswith(inc): ours.append((cur[len(inc)+1:], line))
nmac = 0
code = []
for f, line in ours:
    m = re.match(r'#define ([A-Za-z_]\w*)', line)
    if m: nmac += 1; check(m.group(1), f, True); continue
    if line.startswith('#'): continue
    code.append((f, line))
text = ''.join(l for _, l in code)
where = {}
ntype = 0
for m in re.finditer(r'\b(struct|enum|union)\s+([A-Za-z_]\w*)', text):
    ntype += 1; check(m.group(2), m.group(1) + ' tag', False)
for m in re.finditer(r'\btypedef\b([^;{]*(\{(?:[^{}]|\{[^{}]*\})*\})?[^;]*);', text):
    body = re.sub(r'\{(?:[^{}]|\{[^{}]*\})*\}', ' ', m.group(1))
    fp = re.search(r'\(\s*\*\s*([A-Za-z_]\w*)\s*\)', body)
    name = fp.group(1) if fp else re.findall(r'([A-Za-z_]\w*)\s*(?:\[[^\]]*\]\s*)*$', body.strip())
    name = name if fp else (name[0] if name else '')
    if name: ntype += 1; check(name, 'typedef', False)
for m in re.finditer(r'\benum\b[^{;]*\{([^}]*)\}', text):
    for e in m.group(1).split(','):
        e = e.strip().split('=')[0].strip()
        if e: ntype += 1; check(e, 'enumerator', True)
print('public_names: %d functions, %d macros, %d types/tags/enumerators checked' % (nfun, nmac, ntype))
if nfun < 100 or nmac < 10 or ntype < 50:
    print('FAIL: too few symbols found: the parse of the headers is broken'); sys.exit(1)
if bad:
    print('FAIL: %d public symbols without the st_/ST_ prefix (docs/ARCHITECTURE.md, the naming rule):' % len(bad))
    for b in bad: print('  ' + b)
    sys.exit(1)
PY
