#!/usr/bin/python3
"""Generate tests/fixtures/sft_<model>.safetensors: a packed SFT batch's loss and gradients, the
PyTorch reference of strata's document-aware packing (test_sft_fixture.c).

Rerun (from the repo root, with Debian's system PyTorch 1.13, as tools/gen_fixtures.py):

    apt-get install -y python3-torch python3-numpy && /usr/bin/python3 tools/gen_sft_fixtures.py

The weights are those of the existing fixtures (gpt2_tiny, llama_tiny, qwen2_tiny,
qwen3_tiny .safetensors, read back here), so the new files hold only the batch and its results.
The batch: B=2 rows of T=16 tokens packing several documents each (DOCS below). The reference
runs EACH DOCUMENT SEPARATELY through tools/gen_fixtures.py's model (positions from 0, causal
attention over the document alone), with labels -100 on the masked targets: each document's
last target (it would be the next document's first token) and a seeded SFT-style mask (the
"prompt" tokens). The packed loss is the mean over every unmasked target of the batch
(cross_entropy with ignore_index=-100, summed over the documents, divided by their count), and
grad.<param> is its gradient (autograd, fp64). The file holds (F32 unless noted):
  inputs, targets I32 [B, T]   targets -100 where masked
  positions, doc_start I32 [B, T]   each token's position in its document, its document's start
  loss [1], grad.<param>
"""
import math
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gen_fixtures as gf  # noqa: E402  (the models and the safetensors writer)

B, T = 2, 16
DOCS = [[5, 1, 10], [7, 9]]  # document lengths of each row: a document of length 1 included
FIX = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures")


def batch(vocab, seed):
    g = torch.Generator().manual_seed(seed)
    inputs = torch.randint(0, vocab, (B, T), generator=g)
    targets = torch.randint(0, vocab, (B, T), generator=g)
    prompt = torch.rand((B, T), generator=g) < 0.25  # the SFT mask: not trained on
    positions = torch.zeros((B, T), dtype=torch.int64)
    doc_start = torch.zeros((B, T), dtype=torch.int64)
    for b, lens in enumerate(DOCS):
        assert sum(lens) == T
        t = 0
        for n in lens:
            positions[b, t:t + n] = torch.arange(n)
            doc_start[b, t:t + n] = t
            targets[b, t + n - 1] = -100  # the target would start the next document
            t += n
    targets[prompt] = -100
    return inputs, targets, positions, doc_start


def packed_loss(logits_of, inputs, targets):
    """Each document alone through logits_of(idx [1, n]) -> [1, n, V]; the batch's mean loss."""
    total, count = 0.0, int((targets != -100).sum())
    for b, lens in enumerate(DOCS):
        t = 0
        for n in lens:
            logits = logits_of(inputs[b:b + 1, t:t + n])
            total = total + F.cross_entropy(logits.reshape(n, -1), targets[b, t:t + n], ignore_index=-100,
                                            reduction="sum")
            t += n
    return total / count


def write(name, params, logits_of, vocab, seed, meta):
    torch.set_num_threads(1)
    P = {n: torch.from_numpy(np.array(a)).double().requires_grad_(True) for n, a in params.items()}
    inputs, targets, positions, doc_start = batch(vocab, seed)
    loss = packed_loss(lambda idx: logits_of(P, idx), inputs, targets)
    loss.backward()
    out = {"inputs": inputs.numpy().astype("<i4"), "targets": targets.numpy().astype("<i4"),
           "positions": positions.numpy().astype("<i4"), "doc_start": doc_start.numpy().astype("<i4"),
           "loss": gf.f32(loss.reshape(1))}
    out.update({"grad." + n: gf.f32(p.grad) for n, p in P.items()})
    path = os.path.join(FIX, "sft_" + name + ".safetensors")
    meta = dict(meta, format="strata-sft-fixture", version="1", B=str(B), T=str(T),
                docs=";".join(",".join(str(n) for n in lens) for lens in DOCS), weights=name + ".safetensors")
    gf.save_safetensors(path, out, meta)
    back, bmeta = gf.load_safetensors(path)
    assert bmeta == meta and all(back[n].tobytes() == a.tobytes() for n, a in out.items())
    assert abs(loss.item() - math.log(vocab)) < 1.5, loss.item()
    print(f"wrote {os.path.normpath(path)}: {os.path.getsize(path)} bytes, loss {loss.item():.10f}, "
          f"{int((targets != -100).sum())} of {B * T} targets")


def main():
    params, _ = gf.load_safetensors(os.path.join(FIX, "gpt2_tiny.safetensors"))
    names = [n for n, _, _ in gf.param_specs()]
    gpt2 = {n: params[n] for n in names}
    write("gpt2_tiny", gpt2, lambda P, idx: gf.forward(P, idx, torch.zeros_like(idx))[0], gf.V, 777,
          {"model": "gpt2", "preset": "gpt2-tiny"})
    for key, c in gf.LLAMA_CFGS.items():
        params, _ = gf.load_safetensors(os.path.join(FIX, key + ".safetensors"))
        names = [n for n, _, _ in gf.llama_param_specs(c)]
        write(key, {n: params[n] for n in names}, lambda P, idx, c=c: gf.llama_forward(P, c, idx)[0],
              c["vocab_size"], 778, {"model": c["model_type"], "preset": c["preset"]})


if __name__ == "__main__":
    main()
