#!/usr/bin/python3
"""Generate tests/fixtures/gpt2_tiny.safetensors, the fp64 PyTorch reference the C tests compare against.

Rerun (from the repo root, with Debian's system PyTorch; no network, no `transformers`):

    /usr/bin/python3 tools/gen_fixtures.py

Tiny GPT-2 (V=64, n_positions=16, L=2, NH=4, C=32), batch B=2, T=8, implemented here following
Hugging Face's GPT2LMHeadModel equations. Parameters are drawn in float32 (seeded), then ALL math is
float64. The file holds (all F32 unless noted, names sorted in the header):
  <param>          every parameter under its HF name/shape/layout (Conv1D weights are (in, out))
  inputs, targets  I32 [B, T]
  logits [B,T,V], loss [1]        forward pass
  grad.<param>                    d(loss)/d(param), autograd in fp64
  adamw_losses [3], after3.<param> torch.optim.AdamW (fp64), 3 steps on the same batch
The output is byte-identical across runs; the script reads its file back and checks it.
"""
import json
import math
import os
import struct

import numpy as np
import torch
import torch.nn.functional as F

V, NPOS, L, NH, C, B, T = 64, 16, 2, 4, 32, 2, 8
LR, BETAS, EPS, WD, STEPS = 1e-2, (0.9, 0.95), 1e-8, 0.1, 3
LN_EPS = 1e-5
OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures",
                   "gpt2_tiny.safetensors")
META = {"format": "strata-fixture", "version": "1", "model": "gpt2", "vocab_size": str(V),
        "n_positions": str(NPOS), "n_layer": str(L), "n_head": str(NH), "n_embd": str(C),
        "B": str(B), "T": str(T), "lr": "0.01", "beta1": "0.9", "beta2": "0.95", "eps": "1e-08",
        "weight_decay": "0.1"}


def param_specs():
    """(name, shape, kind) in HF order; kind picks the init distribution."""
    specs = [("transformer.wte.weight", (V, C), "w"), ("transformer.wpe.weight", (NPOS, C), "w")]
    for i in range(L):
        p = f"transformer.h.{i}."
        specs += [(p + "ln_1.weight", (C,), "lnw"), (p + "ln_1.bias", (C,), "b"),
                  (p + "attn.c_attn.weight", (C, 3 * C), "w"), (p + "attn.c_attn.bias", (3 * C,), "b"),
                  (p + "attn.c_proj.weight", (C, C), "w"), (p + "attn.c_proj.bias", (C,), "b"),
                  (p + "ln_2.weight", (C,), "lnw"), (p + "ln_2.bias", (C,), "b"),
                  (p + "mlp.c_fc.weight", (C, 4 * C), "w"), (p + "mlp.c_fc.bias", (4 * C,), "b"),
                  (p + "mlp.c_proj.weight", (4 * C, C), "w"), (p + "mlp.c_proj.bias", (C,), "b")]
    return specs + [("transformer.ln_f.weight", (C,), "lnw"), ("transformer.ln_f.bias", (C,), "b")]


def init_params():
    """float32 draws (so every value is exactly an fp32), in HF order, from torch.manual_seed(1234)."""
    torch.manual_seed(1234)
    params = {}
    for name, shape, kind in param_specs():
        r = torch.randn(shape, dtype=torch.float32)
        params[name] = {"w": 0.1 * r, "b": 0.05 * r, "lnw": 1.0 + 0.1 * r}[kind].float()
    tok = torch.randint(0, V, (B, T + 1), generator=torch.Generator().manual_seed(4321))
    return params, tok[:, :T].contiguous(), tok[:, 1:].contiguous()


def gelu(x):  # HF "gelu_new": tanh approximation
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x.pow(3))))


def forward(P, idx, targets):
    b, t = idx.shape
    hs = C // NH
    x = P["transformer.wte.weight"][idx] + P["transformer.wpe.weight"][:t]
    causal = torch.tril(torch.ones(t, t, dtype=torch.bool))
    for i in range(L):
        p = f"transformer.h.{i}."
        h = F.layer_norm(x, (C,), P[p + "ln_1.weight"], P[p + "ln_1.bias"], LN_EPS)
        qkv = h @ P[p + "attn.c_attn.weight"] + P[p + "attn.c_attn.bias"]         # [b, t, 3C]
        q, k, v = (z.view(b, t, NH, hs).transpose(1, 2) for z in qkv.split(C, dim=2))  # [b, NH, t, hs]
        att = (q @ k.transpose(-1, -2)) / math.sqrt(hs)
        att = att.masked_fill(~causal, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(b, t, C)
        x = x + (y @ P[p + "attn.c_proj.weight"] + P[p + "attn.c_proj.bias"])
        h = F.layer_norm(x, (C,), P[p + "ln_2.weight"], P[p + "ln_2.bias"], LN_EPS)
        h = gelu(h @ P[p + "mlp.c_fc.weight"] + P[p + "mlp.c_fc.bias"])
        x = x + (h @ P[p + "mlp.c_proj.weight"] + P[p + "mlp.c_proj.bias"])
    x = F.layer_norm(x, (C,), P["transformer.ln_f.weight"], P["transformer.ln_f.bias"], LN_EPS)
    logits = x @ P["transformer.wte.weight"].t()
    loss = F.cross_entropy(logits.reshape(-1, V), targets.reshape(-1))  # mean over B*T
    return logits, loss


DT = {np.dtype("<f4"): "F32", np.dtype("<i4"): "I32"}


def save_safetensors(path, tensors, metadata):
    header, blobs, off = {"__metadata__": metadata}, [], 0
    for name in sorted(tensors):
        a = np.ascontiguousarray(tensors[name])
        raw = a.tobytes()
        header[name] = {"dtype": DT[a.dtype], "shape": list(a.shape), "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    hb = json.dumps(header, sort_keys=True, separators=(",", ":")).encode("utf-8")
    hb += b" " * (-len(hb) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hb)) + hb + b"".join(blobs))


def load_safetensors(path):
    with open(path, "rb") as f:
        buf = f.read()
    n = struct.unpack("<Q", buf[:8])[0]
    header = json.loads(buf[8:8 + n].decode("utf-8"))
    meta = header.pop("__metadata__")
    inv = {v: k for k, v in DT.items()}
    out = {}
    for name, h in header.items():
        s, e = h["data_offsets"]
        out[name] = np.frombuffer(buf[8 + n + s:8 + n + e], dtype=inv[h["dtype"]]).reshape(h["shape"])
    assert 8 + n + max(h["data_offsets"][1] for h in header.values()) == len(buf)
    return out, meta


def f32(t):
    return t.detach().to(torch.float32).numpy().astype("<f4")


def main():
    torch.set_num_threads(1)  # fixed reduction order -> reproducible bytes
    params32, inputs, targets = init_params()
    P = {n: p.double().requires_grad_(True) for n, p in params32.items()}
    out = {n: f32(p) for n, p in params32.items()}
    out["inputs"] = inputs.numpy().astype("<i4")
    out["targets"] = targets.numpy().astype("<i4")

    # AdamW: decay on 2-D tensors (matmul weights, wte, wpe), none on 1-D (biases, LayerNorm).
    groups = [{"params": [p for p in P.values() if p.dim() == 2], "weight_decay": WD},
              {"params": [p for p in P.values() if p.dim() == 1], "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=LR, betas=BETAS, eps=EPS)
    losses = []
    for step in range(STEPS):
        opt.zero_grad(set_to_none=True)
        logits, loss = forward(P, inputs, targets)
        loss.backward()
        if step == 0:
            out["logits"], out["loss"] = f32(logits), f32(loss.reshape(1))
            out.update({"grad." + n: f32(p.grad) for n, p in P.items()})
        losses.append(loss.item())
        opt.step()
    out["adamw_losses"] = f32(torch.tensor(losses, dtype=torch.float64))
    out.update({"after3." + n: f32(p) for n, p in P.items()})

    save_safetensors(OUT, out, META)

    # Self-checks: exact read-back, sane initial loss, decreasing AdamW losses.
    back, meta = load_safetensors(OUT)
    assert meta == META and sorted(back) == sorted(out)
    for n, a in out.items():
        assert back[n].dtype == a.dtype and back[n].shape == a.shape, n
        assert back[n].tobytes() == a.tobytes(), n
    assert abs(losses[0] - math.log(V)) < 1.0, losses[0]
    assert all(b < a for a, b in zip(losses, losses[1:])), losses
    assert out["adamw_losses"][0] == out["loss"][0]
    print(f"wrote {os.path.normpath(OUT)}: {os.path.getsize(OUT)} bytes, {len(out)} tensors, "
          f"{sum(p.numel() for p in params32.values())} params")
    print(f"loss {losses[0]:.10f} (ln V = {math.log(V):.10f})")
    print("adamw_losses " + " ".join(f"{l:.10f}" for l in losses))


if __name__ == "__main__":
    main()
