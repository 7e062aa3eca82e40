#!/usr/bin/env bash
# test_layers.sh - the layers point one way: every #include under src/ and include/strata/
# names a header of its own layer or of one below it in docs/ARCHITECTURE.md's table
# "Layers, bottom to top" (each row: a folder under src/ and the public headers it declares).
# The includes that still point up are listed in tests/layers_known.txt with the reason; the
# test fails on any other, and on a listed one that is gone (so the list only shrinks). It
# fails too on a folder under src/ or a header under include/strata/ that the table does not
# name. Usage: test_layers.sh [REPO_ROOT]
set -euo pipefail
root=${1:-$(cd "$(dirname "$0")/.." && pwd)}
exec python3 - "$root" <<'PY'
import os, re, sys
root = sys.argv[1]
arch = os.path.join(root, "docs", "ARCHITECTURE.md")
text = open(arch, encoding="utf-8").read()
m = re.search(r"^## Layers, bottom to top\n(.*?)(?=^## |\Z)", text, re.S | re.M)
if not m:
    sys.exit(f"test_layers: {arch}: no section '## Layers, bottom to top'")
rank, header_layer, folders = {}, {}, []
for line in m.group(1).splitlines():
    cells = [c.strip() for c in line.strip().strip("|").split("|")]
    if len(cells) < 4 or not cells[1].startswith("`src/"):
        continue
    layer, folder = cells[0], cells[1].strip("`")[4:]
    rank[folder] = len(folders)
    folders.append(folder)
    if "internal" not in cells[3]:
        for h in re.findall(r"`([a-z_0-9]+\.h)`", cells[3]):
            header_layer[h] = folder
if len(folders) < 5:
    sys.exit(f"test_layers: {arch}: the layer table has {len(folders)} rows; is it still a table of `src/FOLDER` rows?")
bad = []
for d in sorted(os.listdir(os.path.join(root, "src"))):
    if os.path.isdir(os.path.join(root, "src", d)) and d not in rank:
        bad.append(f"src/{d}/ is not a row of the layer table in docs/ARCHITECTURE.md")
for h in sorted(os.listdir(os.path.join(root, "include", "strata"))):
    if h.endswith(".h") and h not in header_layer:
        bad.append(f"include/strata/{h} is in no row's header column of the layer table")

def target(inc):
    if inc.startswith("strata/"):
        return header_layer.get(inc[len("strata/"):])
    if "/" in inc and not inc.startswith("."):
        return inc.split("/")[0] if inc.split("/")[0] in rank else None
    return None  # the file's own folder ("x.h", "../cpu/x.h")

found = set()
for base in ("src", os.path.join("include", "strata")):
    for dirpath, _, names in os.walk(os.path.join(root, base)):
        for n in sorted(names):
            if not n.endswith((".c", ".h", ".cu", ".cuh", ".cpp")):
                continue
            path = os.path.join(dirpath, n)
            rel = os.path.relpath(path, root)
            own = header_layer.get(n) if base != "src" else rel.split(os.sep)[1]
            if own not in rank:
                continue
            for line in open(path, encoding="utf-8", errors="replace"):
                im = re.match(r'\s*#\s*include\s+"([^"]+)"', line)
                if not im:
                    continue
                t = target(im.group(1))
                if t is not None and rank[t] > rank[own]:
                    found.add(f"{rel} -> {im.group(1)}")
known = {}
kpath = os.path.join(root, "tests", "layers_known.txt")
for line in open(kpath, encoding="utf-8"):
    line = line.strip()
    if line and not line.startswith("#"):
        edge, _, why = line.partition(":")
        known[edge.strip()] = why.strip()
for e in sorted(found - set(known)):
    src, inc = e.split(" -> ")
    bad.append(f"{src} includes {inc}, a layer above its own ({src.split('/')[1] if src.startswith('src/') else 'include'}) "
               "in docs/ARCHITECTURE.md's table: move the code to the layer that owns it, or the declaration down")
for e in sorted(set(known) - found):
    bad.append(f"tests/layers_known.txt lists '{e}', which no longer points up: remove the line")
print(f"test_layers: {len(folders)} layers ({' < '.join(folders)}); {len(found)} includes point up, "
      f"{len(known)} known")
for b in bad:
    print("FAIL:", b)
sys.exit(1 if bad else 0)
PY
