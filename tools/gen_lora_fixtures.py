#!/usr/bin/python3
"""Generate tests/fixtures/lora_<name>.safetensors: LoRA adapters on the tiny GPT-2 and Llama
fixtures through Hugging Face PEFT (PyPI `peft`), their loss and the gradient of every adapter
matrix (test_lora_fixture.c). Also --check-adapter ADAPTER BASE MERGED: load an adapter directory that
`strata train --save_adapter` wrote into PEFT over the base Hugging Face directory BASE, and
compare its loss on a seeded batch with the merged directory strata's --save_hf wrote
(test_lora_peft.sh); --check-adapter ADAPTER BASE MERGED RESAVE also writes it again as PEFT's
save_pretrained does into RESAVE (fp32), for strata to continue from.

Rerun (from the repo root, with Debian's PyTorch 1.13 as tools/gen_fixtures.py, and PyPI
transformers and peft):

    apt-get install -y python3-torch python3-numpy
    pip install --break-system-packages transformers==4.46.3 accelerate==1.0.1 peft
    /usr/bin/python3 tools/gen_lora_fixtures.py

The base weights are the existing fixtures (gpt2_tiny, llama_tiny .safetensors), loaded into
transformers' own GPT2LMHeadModel and LlamaForCausalLM in fp64; PEFT's get_peft_model wraps
the target projections with LoRA (r, lora_alpha, dropout 0; GPT-2's Conv1D with
fan_in_fan_out). PEFT initialises lora_B to zero, which would make every lora_A gradient zero,
so both matrices are then set from a seed (N(0, 0.2), in the state dict's order) and written.
The loss is the mean cross-entropy of the base fixture's logits against its targets (its own
batch), and grad.<name> the gradient of each adapter matrix (autograd, fp64). The file holds
(F32 unless noted):
  inputs, targets I32 [B, T]   the base fixture's batch
  loss [1]
  <name>, grad.<name>          every adapter matrix under PEFT's saved name
                               (base_model.model.<module>.lora_A.weight (r, in), lora_B (out, r))
metadata: r, lora_alpha, target_modules (comma-separated), weights (the base fixture's file).
"""
import math
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gen_fixtures as gf  # noqa: E402  (the base fixtures' shapes and the safetensors writer)

FIX = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures")

# name -> (base fixture, r, lora_alpha, targets, seed)
CASES = {
    "lora_gpt2_tiny": ("gpt2_tiny", 4, 8, ["c_attn", "c_proj", "c_fc"], 2901),
    "lora_llama_tiny": ("llama_tiny", 4, 16, ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                             "down_proj"], 2902),
    "lora_llama_tiny_qv": ("llama_tiny", 2, 4, ["q_proj", "v_proj"], 2903),
}


def hf_model(base):
    """transformers' model of a base fixture with its weights, fp64, eval mode (no dropout)."""
    import transformers as tr
    params, meta = gf.load_safetensors(os.path.join(FIX, base + ".safetensors"))
    if base == "gpt2_tiny":
        cfg = tr.GPT2Config(vocab_size=gf.V, n_positions=gf.NPOS, n_embd=gf.C, n_layer=gf.L, n_head=gf.NH,
                            activation_function="gelu_new", resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                            layer_norm_epsilon=gf.LN_EPS, tie_word_embeddings=True)
        model = tr.GPT2LMHeadModel(cfg)
        names = [n for n, _, _ in gf.param_specs()]
    else:
        c = gf.LLAMA_CFGS[base]
        assert c["model_type"] == "llama" and c["qkv_bias"] == c.get("o_bias", False)
        cfg = tr.LlamaConfig(vocab_size=c["vocab_size"], hidden_size=c["hidden_size"],
                             intermediate_size=c["intermediate_size"], num_hidden_layers=c["num_hidden_layers"],
                             num_attention_heads=c["num_attention_heads"],
                             num_key_value_heads=c["num_key_value_heads"], head_dim=c["head_dim"],
                             max_position_embeddings=c["max_position_embeddings"], rope_theta=c["rope_theta"],
                             rope_scaling=c["rope_scaling"], rms_norm_eps=c["rms_norm_eps"],
                             attention_bias=c["qkv_bias"], tie_word_embeddings=c["tie_word_embeddings"],
                             attention_dropout=0.0)
        model = tr.LlamaForCausalLM(cfg)
        names = [n for n, _, _ in gf.llama_param_specs(c)]
    sd = {n: torch.from_numpy(np.array(params[n])).double() for n in names}
    model = model.double()
    missing, unexpected = model.load_state_dict(sd, strict=False)
    assert not unexpected and all(k.endswith(("lm_head.weight", "attn.bias", "attn.masked_bias", "inv_freq"))
                                  for k in missing), (missing, unexpected)
    model.eval()
    return model, params


def batch_loss(model, params):
    inputs = torch.from_numpy(np.array(params["inputs"])).long()
    targets = torch.from_numpy(np.array(params["targets"])).long()
    logits = model(input_ids=inputs).logits
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=-100)


def adapter_names(peft_model):
    """(saved name, parameter) of every adapter matrix, in the state dict's order."""
    out = []
    for n, p in peft_model.named_parameters():
        if "lora_" in n:
            out.append((n.replace(".default", ""), p))
    return out


def write(name, base, r, alpha, targets, seed):
    import peft
    torch.set_num_threads(1)
    model, params = hf_model(base)
    cfg = peft.LoraConfig(r=r, lora_alpha=alpha, lora_dropout=0.0, target_modules=targets, bias="none",
                          fan_in_fan_out=base.startswith("gpt2"), task_type="CAUSAL_LM")
    pm = peft.get_peft_model(model, cfg)
    pm.eval()
    g = torch.Generator().manual_seed(seed)
    ad = adapter_names(pm)
    with torch.no_grad():
        for _, p in ad:
            p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float64) * 0.2)
    loss = batch_loss(pm, params)
    loss.backward()
    out = {"inputs": np.array(params["inputs"]).astype("<i4"), "targets": np.array(params["targets"]).astype("<i4"),
           "loss": gf.f32(loss.detach().reshape(1))}
    for n, p in ad:
        out[n] = gf.f32(p.detach())
        out["grad." + n] = gf.f32(p.grad)
    # the loss of the base model alone must differ (the adapters do something)
    with torch.no_grad(), pm.disable_adapter():
        base_loss = batch_loss(pm, params).item()
    assert abs(base_loss - loss.item()) > 1e-3, (base_loss, loss.item())
    meta = {"format": "strata-lora-fixture", "version": "1", "r": str(r), "lora_alpha": str(alpha),
            "target_modules": ",".join(targets), "weights": base + ".safetensors",
            "peft": peft.__version__}
    path = os.path.join(FIX, name + ".safetensors")
    gf.save_safetensors(path, out, meta)
    back, bmeta = gf.load_safetensors(path)
    assert bmeta == meta and all(back[n].tobytes() == a.tobytes() for n, a in out.items())
    assert abs(loss.item() - math.log(64)) < 2.5, loss.item()
    print(f"wrote {os.path.normpath(path)}: {os.path.getsize(path)} bytes, {len(ad)} adapter matrices, "
          f"loss {loss.item():.10f} (base {base_loss:.10f})")


def check_adapter(adir, base_dir, merged_dir, resave=None):
    """PEFT's loss with the adapter directory over the base Hugging Face directory, on a seeded
    batch, against transformers' loss of the merged directory strata wrote (--save_hf) and the
    base's own; exit status 1 unless the first two agree (1e-5 relative) and differ from the base.
    With resave, PEFT then writes the adapter there in fp32 as save_pretrained does (its
    config's save_pretrained, get_peft_model_state_dict's names), for strata to continue from
    (test_lora_peft.sh)."""
    import peft
    import transformers as tr
    torch.set_num_threads(1)

    def load(d):
        m = tr.AutoModelForCausalLM.from_pretrained(d, torch_dtype=torch.float64)
        m.eval()
        return m

    base = load(base_dir)
    V = base.config.vocab_size
    T = min(16, base.config.max_position_embeddings if hasattr(base.config, "max_position_embeddings")
            else base.config.n_positions)
    g = torch.Generator().manual_seed(29)
    params = {"inputs": torch.randint(0, V, (2, T), generator=g).numpy(),
              "targets": torch.randint(0, V, (2, T), generator=g).numpy()}
    with torch.no_grad():
        base_loss = batch_loss(base, params).item()
        pm = peft.PeftModel.from_pretrained(load(base_dir), adir)
        pm.eval()
        n = sum(1 for k, _ in pm.named_parameters() if "lora_" in k)
        loss = batch_loss(pm, params).item()
        merged = batch_loss(load(merged_dir), params).item()
    ok = n > 0 and abs(loss - merged) <= 1e-5 * abs(loss) and abs(loss - base_loss) > 1e-6
    if resave:  # save_pretrained's two files, without its model card (which needs Jinja2)
        import safetensors.torch
        pm.to(torch.float32)
        os.makedirs(resave, exist_ok=True)
        pm.peft_config["default"].save_pretrained(resave)
        sd = {k: v.contiguous() for k, v in peft.get_peft_model_state_dict(pm).items()}
        safetensors.torch.save_file(sd, os.path.join(resave, "adapter_model.safetensors"), metadata={"format": "pt"})
    print(f"peft-loss {loss:.9f} merged-loss {merged:.9f} base-loss {base_loss:.9f} adapters {n}: "
          f"{'ok' if ok else 'MISMATCH'}")
    return 0 if ok else 1


if __name__ == "__main__":
    if len(sys.argv) in (5, 6) and sys.argv[1] == "--check-adapter":
        sys.exit(check_adapter(*sys.argv[2:]))
    for k, (b, r, a, t, s) in CASES.items():
        write(k, b, r, a, t, s)
