#!/usr/bin/env python3
"""poetx_spectrum.py - the singular values of every matmul weight of the blocks in two model
directories (safetensors, fp32), before and after training (issue 29: POET-X's R W0 P keeps the
spectrum of W0; after many steps and merges the effective weights' singular values must stay
within 1e-2 relative of W0's at the start).

    tools/poetx_spectrum.py START_DIR END_DIR [--json]

START_DIR and END_DIR hold model.safetensors (strata's --save_hf: POET-X writes the merged dense
weights). For each 2-D block weight (names with ".h." or ".layers.", ending in "weight"): the
largest relative change of a singular value, max_i |s1_i - s0_i| / s0_i, and the weight's own
relative change ||W1 - W0|| / ||W0|| (how far training moved it). Prints one line per tensor
and the worst, or with --json one object. Singular values from numpy when it is present, else
from a Jacobi eigen-solve of the smaller Gram matrix in fp64 (pure Python: fine for the tiny
and mini models the tests use). Reads the safetensors layout itself (F32 only; anything else
is refused naming the tensor).
"""
import json
import math
import struct
import sys


def load(path):
    with open(path, "rb") as f:
        b = f.read()
    if len(b) < 8:
        raise SystemExit("%s: %d bytes, not a safetensors file" % (path, len(b)))
    n = struct.unpack("<Q", b[:8])[0]
    if 8 + n > len(b):
        raise SystemExit("%s: header of %d bytes past the file's %d" % (path, n, len(b)))
    head = json.loads(b[8:8 + n])
    out = {}
    for k, v in head.items():
        if k == "__metadata__":
            continue
        shape = v["shape"]
        if len(shape) != 2 or not ((".h." in k or ".layers." in k) and k.endswith("weight")):
            continue
        if v["dtype"] != "F32":
            raise SystemExit("%s: tensor %s is %s; this tool reads F32 (save with --save_hf_dtype f32)"
                             % (path, k, v["dtype"]))
        s, e = v["data_offsets"]
        r, c = shape
        if e - s != 4 * r * c:
            raise SystemExit("%s: tensor %s holds %d bytes for shape %s" % (path, k, e - s, shape))
        vals = struct.unpack("<%df" % (r * c), b[8 + n + s:8 + n + e])
        out[k] = (r, c, vals)
    return out


def singular_values(r, c, vals):
    try:
        import numpy as np
        a = np.array(vals, dtype=np.float64).reshape(r, c)
        return sorted(np.linalg.svd(a, compute_uv=False).tolist())
    except ImportError:
        pass
    # Gram matrix of the smaller side, fp64; its eigenvalues by cyclic Jacobi
    rows = [vals[i * c:(i + 1) * c] for i in range(r)]
    if r >= c:
        cols = list(zip(*rows))
        vecs = cols
    else:
        vecs = rows
    m = len(vecs)
    g = [[math.fsum(x * y for x, y in zip(vecs[i], vecs[j])) for j in range(m)] for i in range(m)]
    for _ in range(100):
        off = math.fsum(g[i][j] ** 2 for i in range(m) for j in range(m) if i != j)
        if off <= 1e-30 * math.fsum(g[i][i] ** 2 for i in range(m)):
            break
        for p in range(m - 1):
            for q in range(p + 1, m):
                if g[p][q] == 0.0:
                    continue
                theta = (g[q][q] - g[p][p]) / (2.0 * g[p][q])
                t = math.copysign(1.0, theta) / (abs(theta) + math.sqrt(theta * theta + 1.0))
                cs = 1.0 / math.sqrt(t * t + 1.0)
                sn = t * cs
                for k in range(m):
                    gkp, gkq = g[k][p], g[k][q]
                    g[k][p], g[k][q] = cs * gkp - sn * gkq, sn * gkp + cs * gkq
                for k in range(m):
                    gpk, gqk = g[p][k], g[q][k]
                    g[p][k], g[q][k] = cs * gpk - sn * gqk, sn * gpk + cs * gqk
    return sorted(math.sqrt(max(g[i][i], 0.0)) for i in range(m))


def main(argv):
    args = [a for a in argv[1:] if a != "--json"]
    if len(args) != 2:
        raise SystemExit(__doc__)
    a = load(args[0] + "/model.safetensors")
    b = load(args[1] + "/model.safetensors")
    if not a:
        raise SystemExit("%s: no matmul weights of the blocks" % args[0])
    rows = []
    for k, (r, c, v0) in sorted(a.items()):
        if k not in b or b[k][:2] != (r, c):
            raise SystemExit("%s: tensor %s missing or of another shape than in %s" % (args[1], k, args[0]))
        v1 = b[k][2]
        s0, s1 = singular_values(r, c, v0), singular_values(r, c, v1)
        sv = max(abs(y - x) / x for x, y in zip(s0, s1) if x > 0)
        moved = math.sqrt(math.fsum((y - x) ** 2 for x, y in zip(v0, v1)) / math.fsum(x * x for x in v0))
        rows.append({"tensor": k, "shape": [r, c], "max_rel_sv_change": sv, "rel_weight_change": moved})
    worst = max(x["max_rel_sv_change"] for x in rows)
    least_moved = min(x["rel_weight_change"] for x in rows)
    if "--json" in argv:
        print(json.dumps({"tensors": rows, "worst_rel_sv_change": worst, "least_rel_weight_change": least_moved}))
    else:
        for x in rows:
            print("%-40s %-10s singular values %.3e, weight moved %.3e" % (
                x["tensor"], "x".join(map(str, x["shape"])), x["max_rel_sv_change"], x["rel_weight_change"]))
        print("worst relative singular-value change %.3e; the least-moved weight moved %.3e" % (worst, least_moved))


if __name__ == "__main__":
    main(sys.argv)
