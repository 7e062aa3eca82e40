#!/usr/bin/env python3
"""bench_torch_step.py - PyTorch's GPT-2 training step on the CPU, the reference that issue 31
compares `strata bench step` with: the same model (GPT-2 small: 12 layers, 768 wide, 12 heads,
vocabulary 50257, tied head, GELU tanh, causal attention), batch and sequence, random tokens,
one step = forward, cross-entropy, backward, clip to norm 1, AdamW; fp32, or under
torch.autocast("cpu", dtype=torch.bfloat16) with --bf16 (fp32 master weights and states, as
strata's matmul bf16). Prints one JSON object: the median step over --steps after one warm-up.

    python3 tools/bench_torch_step.py --batch 4 --seq 256 --steps 5 --bf16 --threads 2

Debian's python3-torch (1.13) is enough; the model is written here, not taken from a library.
"""
import argparse
import json
import math
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, C, NH):
        super().__init__()
        self.NH = NH
        self.ln1, self.ln2 = nn.LayerNorm(C), nn.LayerNorm(C)
        self.qkv, self.proj = nn.Linear(C, 3 * C), nn.Linear(C, C)
        self.fc, self.fc_proj = nn.Linear(C, 4 * C), nn.Linear(4 * C, C)

    def forward(self, x, mask):
        B, T, C = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.NH, C // self.NH).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(C // self.NH))
        att = F.softmax(att.masked_fill(mask[:T, :T], float("-inf")), dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        x = x + self.proj(y)
        return x + self.fc_proj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class GPT2(nn.Module):
    def __init__(self, V=50257, maxT=1024, L=12, C=768, NH=12):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(V, C), nn.Embedding(maxT, C)
        self.blocks = nn.ModuleList(Block(C, NH) for _ in range(L))
        self.lnf = nn.LayerNorm(C)
        self.register_buffer("mask", torch.triu(torch.ones(maxT, maxT, dtype=torch.bool), 1), persistent=False)
        for mod in self.modules():  # GPT-2's initialisation: weights N(0, 0.02), biases 0
            if isinstance(mod, (nn.Linear, nn.Embedding)):
                nn.init.normal_(mod.weight, std=0.02)
            if isinstance(mod, nn.Linear):
                nn.init.zeros_(mod.bias)

    def forward(self, idx, targets):
        T = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(T))
        for b in self.blocks:
            x = b(x, self.mask)
        logits = F.linear(self.lnf(x), self.wte.weight)  # tied head
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.view(-1))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--bf16", action="store_true")
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    torch.manual_seed(1)
    m = GPT2()
    opt = torch.optim.AdamW(m.parameters(), lr=1e-4, betas=(0.9, 0.95), weight_decay=0.1)
    idx = torch.randint(0, 50257, (a.batch, a.seq))
    tgt = torch.randint(0, 50257, (a.batch, a.seq))
    times, loss = [], 0.0
    for s in range(a.steps + 1):
        t0 = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.bf16):
            out = m(idx, tgt)
        opt.zero_grad(set_to_none=True)
        out.backward()
        torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
        opt.step()
        loss = out.item()
        if s:
            times.append(time.perf_counter() - t0)
    step = statistics.median(times)
    print(json.dumps({"bench": "torch_step", "torch": torch.__version__, "bf16": a.bf16, "batch": a.batch,
                      "seq": a.seq, "threads": torch.get_num_threads(), "steps": a.steps, "step_s": round(step, 4),
                      "tokens_per_s": round(a.batch * a.seq / step, 1), "loss": round(loss, 4)}))


if __name__ == "__main__":
    main()
