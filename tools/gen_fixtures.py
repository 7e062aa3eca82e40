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

It also writes the Llama-family fixtures, the same contents for two tiny decoders written here
following Hugging Face's LlamaForCausalLM / Qwen2ForCausalLM equations (RMSNorm, rotate_half rotary
embeddings with cos/sin = [cos, cos] over the two halves, repeat_kv grouped-query attention with scale
1/sqrt(head_dim), SwiGLU down(silu(gate(x)) * up(x))):
  tests/fixtures/llama_tiny.safetensors  GQA (4 heads, 2 kv heads), untied lm_head, Llama-3 rope scaling,
                                         attention_bias (q/k/v and o_proj biases)
  tests/fixtures/qwen2_tiny.safetensors  multi-query (4 heads, 1 kv head), q/k/v biases, tied head
  tests/fixtures/qwen3_tiny.safetensors  Qwen3ForCausalLM: per-head q/k RMSNorm, head_dim 16 != hidden/heads
Their __metadata__ names the strata preset ("preset") and every configuration value.

    /usr/bin/python3 tools/gen_fixtures.py --check-hf DIR LOGITS
loads a Hugging Face directory written by strata (config.json and model.safetensors or its shards)
with this script's own reader and model, runs the inputs stored in LOGITS (a safetensors file with
"inputs" I32 and "logits" F32) and exits non-zero if the logits differ by more than 1e-4 relative.
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
READ_DT = {"F32": np.dtype("<f4"), "I32": np.dtype("<i4"), "F16": np.dtype("<f2"), "BF16": "bf16"}


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


def main_gpt2():
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


# ---------------------------------------------------------------------------------------------
# Llama family: tiny Llama (GQA, untied, Llama-3 rope scaling) and tiny Qwen2 (MQA, biases, tied).
# The configurations must equal strata's presets of the same name (src/model/llama.c); the C
# test cross-checks them against the metadata.

LLAMA_CFGS = {
    "llama_tiny": dict(preset="llama-tiny", model_type="llama", vocab_size=64, hidden_size=32,
                       intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                       num_key_value_heads=2, head_dim=8, max_position_embeddings=16, rope_theta=100.0,
                       rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0,
                                         high_freq_factor=4.0, original_max_position_embeddings=32),
                       rms_norm_eps=1e-5, qkv_bias=True, o_bias=True, tie_word_embeddings=False,
                       seed=1235, token_seed=4322),
    "qwen2_tiny": dict(preset="qwen2-tiny", model_type="qwen2", vocab_size=64, hidden_size=32,
                       intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                       num_key_value_heads=1, head_dim=8, max_position_embeddings=16, rope_theta=1e6,
                       rope_scaling=None, rms_norm_eps=1e-6, qkv_bias=True, tie_word_embeddings=True,
                       seed=1236, token_seed=4323),
    "qwen3_tiny": dict(preset="qwen3-tiny", model_type="qwen3", vocab_size=64, hidden_size=32,
                       intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                       num_key_value_heads=2, head_dim=16, max_position_embeddings=16, rope_theta=1e6,
                       rope_scaling=None, rms_norm_eps=1e-6, qkv_bias=False, qk_norm=True,
                       tie_word_embeddings=True, seed=1237, token_seed=4324),
}


def llama_param_specs(c):
    C, F, hs = c["hidden_size"], c["intermediate_size"], c["head_dim"]
    Q, K = c["num_attention_heads"] * hs, c["num_key_value_heads"] * hs
    specs = [("model.embed_tokens.weight", (c["vocab_size"], C), "w")]
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        specs += [(p + "input_layernorm.weight", (C,), "lnw"),
                  (p + "self_attn.q_proj.weight", (Q, C), "w"), (p + "self_attn.k_proj.weight", (K, C), "w"),
                  (p + "self_attn.v_proj.weight", (K, C), "w")]
        if c["qkv_bias"]:
            specs += [(p + "self_attn.q_proj.bias", (Q,), "b"), (p + "self_attn.k_proj.bias", (K,), "b"),
                      (p + "self_attn.v_proj.bias", (K,), "b")]
        if c.get("qk_norm"):
            specs += [(p + "self_attn.q_norm.weight", (hs,), "lnw"), (p + "self_attn.k_norm.weight", (hs,), "lnw")]
        specs.append((p + "self_attn.o_proj.weight", (C, Q), "w"))
        if c.get("o_bias"):  # Llama's attention_bias puts a bias on o_proj too
            specs.append((p + "self_attn.o_proj.bias", (C,), "b"))
        specs += [(p + "post_attention_layernorm.weight", (C,), "lnw"),
                  (p + "mlp.gate_proj.weight", (F, C), "w"), (p + "mlp.up_proj.weight", (F, C), "w"),
                  (p + "mlp.down_proj.weight", (C, F), "w")]
    specs.append(("model.norm.weight", (C,), "lnw"))
    if not c["tie_word_embeddings"]:
        specs.append(("lm_head.weight", (c["vocab_size"], C), "w"))
    return specs


def llama_init(c):
    torch.manual_seed(c["seed"])
    params = {}
    for name, shape, kind in llama_param_specs(c):
        r = torch.randn(shape, dtype=torch.float32)
        params[name] = {"w": 0.1 * r, "b": 0.05 * r, "lnw": 1.0 + 0.1 * r}[kind].float()
    tok = torch.randint(0, c["vocab_size"], (B, T + 1), generator=torch.Generator().manual_seed(c["token_seed"]))
    return params, tok[:, :T].contiguous(), tok[:, 1:].contiguous()


def rope_inv_freq(c):
    """HF _compute_default_rope_parameters, and _compute_llama3_parameters when configured (fp64)."""
    hs, base = c["head_dim"], c["rope_theta"]
    inv_freq = 1.0 / (base ** (torch.arange(0, hs, 2, dtype=torch.int64).double() / hs))
    rs = c["rope_scaling"]
    if rs is None:
        return inv_freq
    factor, lo, hi, old = rs["factor"], rs["low_freq_factor"], rs["high_freq_factor"], \
        rs["original_max_position_embeddings"]
    low_freq_wavelen, high_freq_wavelen = old / lo, old / hi
    wavelen = 2 * math.pi / inv_freq
    inv_freq_llama = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth_factor = (old / wavelen - lo) / (hi - lo)
    smoothed_inv_freq = (1 - smooth_factor) * inv_freq_llama / factor + smooth_factor * inv_freq_llama
    is_medium_freq = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium_freq, smoothed_inv_freq, inv_freq_llama)


def rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def rms_norm(x, w, eps):  # LlamaRMSNorm / Qwen2RMSNorm
    variance = x.pow(2).mean(-1, keepdim=True)
    return w * (x * torch.rsqrt(variance + eps))


def repeat_kv(x, n_rep):  # [b, nkv, t, hs] -> [b, nkv * n_rep, t, hs]
    b, nkv, t, hs = x.shape
    return x[:, :, None, :, :].expand(b, nkv, n_rep, t, hs).reshape(b, nkv * n_rep, t, hs)


def llama_forward(P, c, idx, targets=None):
    b, t = idx.shape
    NHq, NKV, hs, eps = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"], c["rms_norm_eps"]
    inv_freq = rope_inv_freq(c).to(P["model.embed_tokens.weight"].dtype)
    freqs = torch.arange(t, dtype=inv_freq.dtype)[:, None] * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos(), emb.sin()                                                # [t, hs]
    causal = torch.tril(torch.ones(t, t, dtype=torch.bool))
    x = P["model.embed_tokens.weight"][idx]
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        h = rms_norm(x, P[p + "input_layernorm.weight"], eps)
        q = F.linear(h, P[p + "self_attn.q_proj.weight"], P.get(p + "self_attn.q_proj.bias"))
        k = F.linear(h, P[p + "self_attn.k_proj.weight"], P.get(p + "self_attn.k_proj.bias"))
        v = F.linear(h, P[p + "self_attn.v_proj.weight"], P.get(p + "self_attn.v_proj.bias"))
        q, k = q.view(b, t, NHq, hs), k.view(b, t, NKV, hs)
        if c.get("qk_norm"):  # Qwen3: per-head RMSNorm of q and k, before rope
            q = rms_norm(q, P[p + "self_attn.q_norm.weight"], eps)
            k = rms_norm(k, P[p + "self_attn.k_norm.weight"], eps)
        q, k = q.transpose(1, 2), k.transpose(1, 2)
        v = v.view(b, t, NKV, hs).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        k, v = repeat_kv(k, NHq // NKV), repeat_kv(v, NHq // NKV)
        att = (q @ k.transpose(-1, -2)) / math.sqrt(hs)
        att = att.masked_fill(~causal, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(b, t, NHq * hs)
        x = x + F.linear(y, P[p + "self_attn.o_proj.weight"], P.get(p + "self_attn.o_proj.bias"))
        h = rms_norm(x, P[p + "post_attention_layernorm.weight"], eps)
        g = F.linear(h, P[p + "mlp.gate_proj.weight"])
        u = F.linear(h, P[p + "mlp.up_proj.weight"])
        x = x + F.linear(F.silu(g) * u, P[p + "mlp.down_proj.weight"])
    x = rms_norm(x, P["model.norm.weight"], eps)
    head = P["model.embed_tokens.weight"] if c["tie_word_embeddings"] else P["lm_head.weight"]
    logits = F.linear(x, head)
    if targets is None:
        return logits, None
    return logits, F.cross_entropy(logits.reshape(-1, c["vocab_size"]), targets.reshape(-1))


def llama_meta(c):
    m = {"format": "strata-fixture", "version": "1", "model": c["model_type"], "preset": c["preset"]}
    for k in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
              "num_key_value_heads", "head_dim", "max_position_embeddings"):
        m[k] = str(c[k])
    m.update({"rope_theta": repr(c["rope_theta"]), "rms_norm_eps": repr(c["rms_norm_eps"]),
              "rope_scaling": json.dumps(c["rope_scaling"], sort_keys=True),
              "qkv_bias": str(int(c["qkv_bias"])), "qk_norm": str(int(c.get("qk_norm", False))),
              "o_bias": str(int(c.get("o_bias", False))),
              "tie_word_embeddings": str(int(c["tie_word_embeddings"])),
              "B": str(B), "T": str(T), "lr": "0.01", "beta1": "0.9", "beta2": "0.95", "eps": "1e-08",
              "weight_decay": "0.1"})
    return m


def main_llama(key):
    torch.set_num_threads(1)
    c = LLAMA_CFGS[key]
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures",
                        key + ".safetensors")
    params32, inputs, targets = llama_init(c)
    P = {n: p.double().requires_grad_(True) for n, p in params32.items()}
    out = {n: f32(p) for n, p in params32.items()}
    out["inputs"] = inputs.numpy().astype("<i4")
    out["targets"] = targets.numpy().astype("<i4")
    groups = [{"params": [p for p in P.values() if p.dim() == 2], "weight_decay": WD},
              {"params": [p for p in P.values() if p.dim() == 1], "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=LR, betas=BETAS, eps=EPS)
    losses = []
    for step in range(STEPS):
        opt.zero_grad(set_to_none=True)
        logits, loss = llama_forward(P, c, inputs, targets)
        loss.backward()
        if step == 0:
            out["logits"], out["loss"] = f32(logits), f32(loss.reshape(1))
            out.update({"grad." + n: f32(p.grad) for n, p in P.items()})
        losses.append(loss.item())
        opt.step()
    out["adamw_losses"] = f32(torch.tensor(losses, dtype=torch.float64))
    out.update({"after3." + n: f32(p) for n, p in P.items()})
    meta = llama_meta(c)
    save_safetensors(path, out, meta)

    back, bmeta = load_safetensors(path)
    assert bmeta == meta and sorted(back) == sorted(out)
    for n, a in out.items():
        assert back[n].tobytes() == a.tobytes(), n
    assert abs(losses[0] - math.log(c["vocab_size"])) < 1.0, losses[0]
    assert all(b < a for a, b in zip(losses, losses[1:])), losses
    print(f"wrote {os.path.normpath(path)}: {os.path.getsize(path)} bytes, {len(out)} tensors, "
          f"{sum(p.numel() for p in params32.values())} params")
    print(f"loss {losses[0]:.10f}; adamw_losses " + " ".join(f"{l:.10f}" for l in losses))
    for n in out:
        if n.startswith("grad.") and n.endswith("k_proj.bias"):
            print(f"max |{n}| = {np.abs(out[n]).max():.3g}")


def read_any_safetensors(path):
    """name -> float64 tensor (F32, F16, BF16) or int tensor (I32), with this script's own parser."""
    with open(path, "rb") as f:
        buf = f.read()
    n = struct.unpack("<Q", buf[:8])[0]
    header = json.loads(buf[8:8 + n].decode("utf-8"))
    header.pop("__metadata__", None)
    out = {}
    for name, h in header.items():
        s, e = h["data_offsets"]
        raw = buf[8 + n + s:8 + n + e]
        if h["dtype"] == "BF16":
            a = (np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
        elif h["dtype"] in ("F32", "F16", "I32"):
            a = np.frombuffer(raw, dtype=READ_DT[h["dtype"]])
        else:
            raise SystemExit(f"{path}: tensor {name}: dtype {h['dtype']} not handled by the checker")
        out[name] = torch.from_numpy(a.reshape(h["shape"]).copy())
    return out


def check_hf(directory, logits_path):
    """Load strata's HF directory independently and compare its logits with strata's."""
    with open(os.path.join(directory, "config.json")) as f:
        cfg = json.load(f)
    arch = cfg["architectures"][0]
    assert arch in ("LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM", "MistralForCausalLM"), arch
    c = {k: cfg[k] for k in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                             "num_attention_heads", "num_key_value_heads", "rms_norm_eps", "rope_theta",
                             "tie_word_embeddings")}
    c["head_dim"] = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    c["rope_scaling"] = cfg.get("rope_scaling")
    c["qk_norm"] = arch == "Qwen3ForCausalLM"
    index = os.path.join(directory, "model.safetensors.index.json")
    P = {}
    if os.path.exists(index):
        with open(index) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
        for fn in files:
            P.update(read_any_safetensors(os.path.join(directory, fn)))
    else:
        P = read_any_safetensors(os.path.join(directory, "model.safetensors"))
    P = {k: v.double() for k, v in P.items()}
    ref = read_any_safetensors(logits_path)
    logits, _ = llama_forward(P, c, ref["inputs"].long())
    want = ref["logits"].double()
    err = ((logits - want).abs() / (1e-4 + 1e-4 * want.abs())).max().item()
    print(f"check-hf {directory}: {arch}, {len(P)} tensors, logits {tuple(logits.shape)}, worst error/tol {err:.3g}")
    return 0 if err <= 1.0 else 1


if __name__ == "__main__":
    import sys
    if len(sys.argv) == 4 and sys.argv[1] == "--check-hf":
        sys.exit(check_hf(sys.argv[2], sys.argv[3]))
    main_gpt2()
    for key in LLAMA_CFGS:
        main_llama(key)

