#!/usr/bin/python3
"""Generate tests/fixtures/poetx_linear.safetensors (an fp64 PyTorch reference of one POET-X linear layer)
and tests/fixtures/poetx_gpt2_tiny.safetensors, poetx_llama_tiny.safetensors (every matmul weight of the
tiny GPT-2 and Llama fixtures under POET-X: the loss, every gradient, the weights after a merge).

Rerun (from the repo root, with Debian's system PyTorch, torch 1.13; no network):

    /usr/bin/python3 tools/gen_poetx_fixtures.py

The parameterisation, written here from the papers' equations (POET, Qiu et al. 2025; POET-X):
a weight W0 (d_out, d_in), frozen, is used as W = R W0 P with R (d_out, d_out) and P (d_in, d_in)
orthogonal. POET-X makes each of them block-diagonal under a random permutation,

    P = Pi_in^T  blockdiag(G_in_1 .. G_in_m)  Pi_in,     (Pi x)[i] = x[perm[i]],

and each block the Cayley transform of a skew-symmetric Q, (I + Q)(I - Q)^-1, with the inverse cut
to k Neumann terms: G = (I + Q)(I + Q + Q^2 + ... + Q^k). Q is stored as its strict upper triangle,
row by row (b(b-1)/2 floats per block). The layer's output for a row x is y = R W0 P x, i.e.
y = x W^T as nn.Linear computes it.

Everything here is dense and explicit: the permutation matrices, torch.block_diag, the product
(I + Q) S_k with S_k summed from matrix powers, W = R W0 P formed and applied; gradients by
autograd, all in float64. strata computes the same thing without forming any of these matrices
(gather, per-block products, scatter), so the two are independent.

Contents (F32 unless noted): x (N, d_in), W0 (d_out, d_in), q_in (d_in/b, b(b-1)/2),
q_out (d_out/b, b(b-1)/2), perm_in (d_in) I32, perm_out (d_out) I32, G_in, G_out (blocks, b, b),
y (N, d_out), dy (N, d_out) (the upstream gradient: the loss is sum(y * dy)), grad.x, grad.q_in,
grad.q_out, W_merged = R W0 P (d_out, d_in) (what a merge folds into W0).
Metadata: b, k, N, d_in, d_out.

The model fixtures (test_poetx_model.c): the base fixture's weights (gpt2_tiny, llama_tiny), every
matmul weight of every block (GPT-2: attn.c_attn, attn.c_proj, mlp.c_fc, mlp.c_proj, Conv1D (in, out),
so W0 is their transpose; the Llama family: q, k, v, o, gate, up, down_proj, each its own R and P)
replaced by R W0 P; the bias is added after R (y = R W0 P x + b); embeddings, norms and biases as
in the base. The forward is tools/gen_fixtures.py's own (forward, llama_forward) over a parameter
dict in which each matmul weight is the dense R W0 P. Contents: inputs, targets I32 (the base
fixture's batch), loss [1]; for each matmul weight <w> (its Hugging Face name less ".weight"):
<w>.poet_q_in (d_in/b, b(b-1)/2), <w>.poet_q_out (d_out/b, ...), <w>.perm_in, <w>.perm_out I32, and
grad.<w>.poet_q_in, grad.<w>.poet_q_out; grad.<name> of every embedding, norm and bias (trained as
usual); merged.<name> of every matmul weight: R W0 P in the base's layout (what a merge folds into
W0). Metadata: b, k, weights (the base fixture's file). Parameters are drawn in float32 from a seeded generator (so every
stored value is exactly an fp32) and the math is float64. The output is byte-identical across
runs; the script reads the file back and checks it.
"""
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gen_fixtures import f32, load_safetensors, save_safetensors  # noqa: E402 (the fixtures' one writer)

B_BLK, K_TERMS, N, D_IN, D_OUT = 8, 3, 6, 16, 24
OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures", "poetx_linear.safetensors")


def skew_from_packed(q, b):
    """Q (b, b) with Q[i][j] = q[p] for i < j in row order, Q[j][i] = -Q[i][j]."""
    iu = torch.triu_indices(b, b, offset=1)
    Q = torch.zeros(b, b, dtype=q.dtype)
    Q = Q.index_put((iu[0], iu[1]), q)
    return Q - Q.t()


def cayley_neumann(Q, k):
    """(I + Q)(I + Q + ... + Q^k)"""
    eye = torch.eye(Q.shape[0], dtype=Q.dtype)
    S = sum(torch.matrix_power(Q, m) for m in range(0, k + 1))
    return (eye + Q) @ S


def perm_matrix(perm):
    """Pi with (Pi x)[i] = x[perm[i]]: Pi[i, perm[i]] = 1"""
    d = len(perm)
    Pm = torch.zeros(d, d, dtype=torch.float64)
    Pm[torch.arange(d), torch.as_tensor(perm, dtype=torch.long)] = 1.0
    return Pm


def orthogonal_factor(qs, perm, b, k):
    """Pi^T blockdiag(G_1 .. G_m) Pi, and the blocks"""
    Gs = [cayley_neumann(skew_from_packed(qs[j], b), k) for j in range(qs.shape[0])]
    Pm = perm_matrix(perm)
    return Pm.t() @ torch.block_diag(*Gs) @ Pm, torch.stack(Gs)


def model_case(base, b, k, seed):
    """One model fixture (see the docstring): base is gpt2_tiny or llama_tiny."""
    import gen_fixtures as gf
    torch.set_num_threads(1)
    params, _ = load_safetensors(os.path.join(os.path.dirname(OUT), base + ".safetensors"))
    gpt2 = base.startswith("gpt2")
    if gpt2:
        names = [n for n, _, _ in gf.param_specs()]
        mm = [n for n in names if n.endswith(("c_attn.weight", "c_proj.weight", "c_fc.weight"))]
    else:
        c = gf.LLAMA_CFGS[base]
        names = [n for n, _, _ in gf.llama_param_specs(c)]
        mm = [n for n in names if n.endswith("_proj.weight")]
    g = torch.Generator().manual_seed(seed)
    nq = b * (b - 1) // 2
    P = {n: torch.from_numpy(np.array(params[n])).double() for n in names}
    train = {n: P[n].requires_grad_(True) for n in names if n not in mm}
    out = {"inputs": np.array(params["inputs"]).astype("<i4"), "targets": np.array(params["targets"]).astype("<i4")}
    qs, eff = {}, {}
    for n in mm:
        w = n[: -len(".weight")]
        W0 = P[n].t() if gpt2 else P[n]  # (d_out, d_in)
        d_out, d_in = W0.shape
        q_in32 = torch.randn(d_in // b, nq, generator=g) * (0.25 / b ** 0.5)
        q_out32 = torch.randn(d_out // b, nq, generator=g) * (0.25 / b ** 0.5)
        perm_in = torch.randperm(d_in, generator=g).to(torch.int32)
        perm_out = torch.randperm(d_out, generator=g).to(torch.int32)
        q_in, q_out = q_in32.double().requires_grad_(True), q_out32.double().requires_grad_(True)
        Pm, _ = orthogonal_factor(q_in, perm_in, b, k)
        Rm, _ = orthogonal_factor(q_out, perm_out, b, k)
        W = Rm @ W0 @ Pm
        eff[n] = W.t() if gpt2 else W
        qs[w] = (q_in, q_out)
        out.update({w + ".poet_q_in": f32(q_in32), w + ".poet_q_out": f32(q_out32),
                    w + ".perm_in": perm_in.numpy().astype("<i4"), w + ".perm_out": perm_out.numpy().astype("<i4")})
    D = dict(P)
    D.update(eff)
    inputs = torch.from_numpy(out["inputs"]).long()
    targets = torch.from_numpy(out["targets"]).long()
    _, loss = gf.forward(D, inputs, targets) if gpt2 else gf.llama_forward(D, c, inputs, targets)
    loss.backward()
    out["loss"] = f32(loss.detach().reshape(1))
    for w, (qi, qo) in qs.items():
        out["grad." + w + ".poet_q_in"], out["grad." + w + ".poet_q_out"] = f32(qi.grad), f32(qo.grad)
    for n, p in train.items():
        out["grad." + n] = f32(p.grad)
    for n in mm:
        out["merged." + n] = f32(eff[n])
    # the rotations do something: the base's own loss differs
    with torch.no_grad():
        Pd = {n: p.detach() for n, p in P.items()}
        _, base_loss = gf.forward(Pd, inputs, targets) if gpt2 else gf.llama_forward(Pd, c, inputs, targets)
    assert abs(base_loss.item() - loss.item()) > 1e-3, (base_loss.item(), loss.item())
    meta = {"format": "strata-poetx-fixture", "version": "1", "b": str(b), "k": str(k),
            "weights": base + ".safetensors", "generator": "tools/gen_poetx_fixtures.py"}
    path = os.path.join(os.path.dirname(OUT), "poetx_" + base + ".safetensors")
    save_safetensors(path, out, meta)
    back, meta2 = load_safetensors(path)
    assert meta2 == meta and sorted(back) == sorted(out)
    for name, a in out.items():
        assert np.array_equal(back[name], a), name
    print(f"wrote {os.path.normpath(path)}: {len(out)} tensors, {len(mm)} POET-X weights, loss {loss.item():.10f} "
          f"(base {base_loss.item():.10f})")


def main():
    torch.set_num_threads(1)  # fixed reduction order -> reproducible bytes
    b, k = B_BLK, K_TERMS
    nq = b * (b - 1) // 2
    g = torch.Generator().manual_seed(2029)
    # float32 draws: x ~ 1, W0 ~ 1/sqrt(d_in), packed q so that each block's spectral norm is ~0.5
    # (large enough that the k-term polynomial differs from the exact Cayley transform by far more
    # than the test's tolerance)
    x32 = torch.randn(N, D_IN, generator=g)
    w32 = torch.randn(D_OUT, D_IN, generator=g) / D_IN ** 0.5
    qin32 = torch.randn(D_IN // b, nq, generator=g) * (0.25 / b ** 0.5)
    qout32 = torch.randn(D_OUT // b, nq, generator=g) * (0.25 / b ** 0.5)
    dy32 = torch.randn(N, D_OUT, generator=g)
    perm_in = torch.randperm(D_IN, generator=g).to(torch.int32)
    perm_out = torch.randperm(D_OUT, generator=g).to(torch.int32)

    x = x32.double().requires_grad_(True)
    q_in = qin32.double().requires_grad_(True)
    q_out = qout32.double().requires_grad_(True)
    W0, dy = w32.double(), dy32.double()
    P, G_in = orthogonal_factor(q_in, perm_in, b, k)
    R, G_out = orthogonal_factor(q_out, perm_out, b, k)
    W = R @ W0 @ P
    y = x @ W.t()
    (y * dy).sum().backward()

    # what the fixture is for: the polynomial is not orthogonal, and not the exact Cayley transform
    eye = torch.eye(b, dtype=torch.float64)
    for G, qs in ((G_in, q_in), (G_out, q_out)):
        for j in range(G.shape[0]):
            Q = skew_from_packed(qs[j].detach(), b)
            exact = (eye + Q) @ torch.linalg.inv(eye - Q)
            assert (G[j].detach() - exact).abs().max().item() > 1e-4, "the polynomial is too close to exact Cayley"

    tensors = {
        "x": f32(x32), "W0": f32(w32), "q_in": f32(qin32), "q_out": f32(qout32), "dy": f32(dy32),
        "perm_in": perm_in.numpy().astype("<i4"), "perm_out": perm_out.numpy().astype("<i4"),
        "G_in": f32(G_in), "G_out": f32(G_out), "y": f32(y), "W_merged": f32(W),
        "grad.x": f32(x.grad), "grad.q_in": f32(q_in.grad), "grad.q_out": f32(q_out.grad),
    }
    meta = {"b": str(b), "k": str(k), "N": str(N), "d_in": str(D_IN), "d_out": str(D_OUT),
            "form": "G = (I + Q)(I + Q + ... + Q^k), Q packed strict upper triangle row-major",
            "generator": "tools/gen_poetx_fixtures.py"}
    save_safetensors(OUT, tensors, meta)
    back, meta2 = load_safetensors(OUT)
    assert meta2 == meta and sorted(back) == sorted(tensors)
    for name, a in tensors.items():
        assert np.array_equal(back[name], a), name
    print(f"wrote {os.path.normpath(OUT)}: {len(tensors)} tensors, |y| max {y.abs().max().item():.3g}, "
          f"|grad.q_in| max {q_in.grad.abs().max().item():.3g}, |grad.q_out| max {q_out.grad.abs().max().item():.3g}")


if __name__ == "__main__":
    main()
    model_case("gpt2_tiny", 8, 3, 2931)
    model_case("llama_tiny", 8, 4, 2932)
