#!/usr/bin/python3
"""Golden files for the CPU transformer math (tests/kernels/transformer/golden_test.cc).

An independent implementation of the Llama / Qwen2 / Qwen3 / Mistral decoder written directly in
PyTorch (eager attention with a full softmax, full logits, torch autograd for every gradient),
following transformers' modeling code: LlamaRMSNorm, rotate_half RoPE with
_compute_llama3_parameters, repeat_kv GQA, Qwen2 q/k/v bias, Qwen3 q_norm/k_norm before RoPE,
SiLU-gated MLP, tied or untied lm_head, CrossEntropyLoss(ignore_index=-100).

Parameters are drawn at random, rounded to bf16 (what the executor delivers) and stored as bf16;
everything is then computed in float64 from those exact values, so the golden loss and gradients
are exact up to float64 rounding. Each file is a safetensors file:
  __metadata__: config (the Hugging Face config.json text), batch, seq, loss_sum, num_tokens, ...
  params.<hf name>  BF16   the parameters
  input_ids, targets I32   (B, T); targets already shifted, -100 = masked
  grad.<hf name>    F64    d(loss_sum / num_tokens) / d(param)   (tied: embed_tokens gets both uses)

Run with Debian's interpreter and python3-torch (CI has no torch and only reads the committed files):
  /usr/bin/python3 scripts/golden/make_transformer_goldens.py tests/data/golden
"""
import json
import math
import struct
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

IGNORE_INDEX = -100

# Tiny configs: GQA everywhere, head_dim * heads (32) != hidden (16) as in Qwen3-32B, T = 13 so
# the C++ side can use tiles and loss chunks that do not divide it.
BASE = dict(hidden_size=16, num_attention_heads=4, head_dim=8, intermediate_size=28, vocab_size=53,
            max_position_embeddings=128, hidden_act="silu", torch_dtype="bfloat16")
CONFIGS = {
    # Llama 3.2-style: tied embeddings and llama3 rope scaling. With head_dim 8 and theta 1e4 the
    # wavelengths are 6.3, 63, 628, 6283; original context 64 with factors 1/4 puts them in the
    # keep (< 16), interpolate (16..64) and divide (> 64) bands.
    "llama3_tied": dict(BASE, model_type="llama", num_hidden_layers=3, num_key_value_heads=2, rope_theta=10000.0,
                        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                      "high_freq_factor": 4.0, "original_max_position_embeddings": 64},
                        rms_norm_eps=1e-5, tie_word_embeddings=True, attention_bias=False, mlp_bias=False),
    # Qwen2.5-style: q/k/v biases, untied, 4:1 GQA.
    "qwen2_bias_untied": dict(BASE, model_type="qwen2", num_hidden_layers=2, num_key_value_heads=1,
                              rope_theta=1000000.0, rope_scaling=None, rms_norm_eps=1e-6,
                              tie_word_embeddings=False, use_sliding_window=False),
    # Qwen3-0.6B-style: q/k norm, tied.
    "qwen3_qknorm_tied": dict(BASE, model_type="qwen3", num_hidden_layers=2, num_key_value_heads=2,
                              rope_theta=1000000.0, rope_scaling=None, rms_norm_eps=1e-6,
                              tie_word_embeddings=True, attention_bias=False),
    # Mistral-style: plain GQA, untied.
    "mistral_untied": dict(BASE, model_type="mistral", num_hidden_layers=2, num_key_value_heads=2,
                           rope_theta=1000000.0, rope_scaling=None, rms_norm_eps=1e-5,
                           tie_word_embeddings=False, sliding_window=None),
}
BATCH, SEQ = 2, 13


def tensor_names(cfg):
    """(name, shape) in checkpoint order, as model/unit_layout.cc lays them out."""
    C, I, V, hd = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"], cfg["head_dim"]
    Q, K = cfg["num_attention_heads"] * hd, cfg["num_key_value_heads"] * hd
    bias = cfg["model_type"] == "qwen2"
    qk_norm = cfg["model_type"] == "qwen3"
    out = [("model.embed_tokens.weight", (V, C))]
    for l in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{l}."
        out.append((p + "input_layernorm.weight", (C,)))
        out.append((p + "self_attn.q_proj.weight", (Q, C)))
        if bias: out.append((p + "self_attn.q_proj.bias", (Q,)))
        out.append((p + "self_attn.k_proj.weight", (K, C)))
        if bias: out.append((p + "self_attn.k_proj.bias", (K,)))
        out.append((p + "self_attn.v_proj.weight", (K, C)))
        if bias: out.append((p + "self_attn.v_proj.bias", (K,)))
        out.append((p + "self_attn.o_proj.weight", (C, Q)))
        if qk_norm:
            out.append((p + "self_attn.q_norm.weight", (hd,)))
            out.append((p + "self_attn.k_norm.weight", (hd,)))
        out.append((p + "post_attention_layernorm.weight", (C,)))
        out.append((p + "mlp.gate_proj.weight", (I, C)))
        out.append((p + "mlp.up_proj.weight", (I, C)))
        out.append((p + "mlp.down_proj.weight", (C, I)))
    out.append(("model.norm.weight", (C,)))
    if not cfg["tie_word_embeddings"]:
        out.append(("lm_head.weight", (V, C)))
    return out


def random_params(cfg, gen):
    params = {}
    for name, shape in tensor_names(cfg):
        if name.endswith("norm.weight"):
            t = 1.0 + 0.2 * torch.randn(shape, generator=gen, dtype=torch.float64)
        elif name.endswith(".bias"):
            t = 0.3 * torch.randn(shape, generator=gen, dtype=torch.float64)
        elif name == "model.embed_tokens.weight":
            t = torch.randn(shape, generator=gen, dtype=torch.float64)
        else:  # nn.Linear (out, in): std 1/sqrt(fan_in) keeps activations O(1)
            t = torch.randn(shape, generator=gen, dtype=torch.float64) / math.sqrt(shape[1])
        params[name] = t.to(torch.bfloat16)  # the delivered values
    return params


def rms_norm(x, w, eps):  # LlamaRMSNorm
    variance = x.pow(2).mean(-1, keepdim=True)
    return w * (x * torch.rsqrt(variance + eps))


def inv_freq(cfg):  # _compute_default_rope_parameters + _compute_llama3_parameters, in float64
    dim, base = cfg["head_dim"], cfg["rope_theta"]
    f = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).to(torch.float64) / dim))
    rs = cfg.get("rope_scaling")
    if rs and rs["rope_type"] == "llama3":
        factor, low, high = rs["factor"], rs["low_freq_factor"], rs["high_freq_factor"]
        old = rs["original_max_position_embeddings"]
        low_wl, high_wl = old / low, old / high
        wavelen = 2 * math.pi / f
        f_llama = torch.where(wavelen > low_wl, f / factor, f)
        smooth = (old / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * f_llama / factor + smooth * f_llama
        is_medium = ~(wavelen < high_wl) * ~(wavelen > low_wl)
        f = torch.where(is_medium, smoothed, f_llama)
    return f


def rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def forward_loss(cfg, P, input_ids, targets):
    B, T = input_ids.shape
    H, KV, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    eps = cfg["rms_norm_eps"]
    freqs = torch.outer(torch.arange(T, dtype=torch.float64), inv_freq(cfg))
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos(), emb.sin()  # (T, hd)
    causal = torch.full((T, T), float("-inf"), dtype=torch.float64).triu(1)
    lin = lambda x, name: F.linear(x, P[name + ".weight"], P.get(name + ".bias"))

    h = P["model.embed_tokens.weight"][input_ids]  # (B, T, C)
    for l in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{l}."
        x = rms_norm(h, P[p + "input_layernorm.weight"], eps)
        q = lin(x, p + "self_attn.q_proj").view(B, T, H, hd)
        k = lin(x, p + "self_attn.k_proj").view(B, T, KV, hd)
        v = lin(x, p + "self_attn.v_proj").view(B, T, KV, hd)
        if cfg["model_type"] == "qwen3":
            q = rms_norm(q, P[p + "self_attn.q_norm.weight"], eps)
            k = rms_norm(k, P[p + "self_attn.k_norm.weight"], eps)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # (B, heads, T, hd)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        k = k.repeat_interleave(H // KV, dim=1)  # repeat_kv
        v = v.repeat_interleave(H // KV, dim=1)
        scores = q @ k.transpose(2, 3) * hd ** -0.5 + causal
        o = torch.softmax(scores, dim=-1) @ v  # (B, H, T, hd)
        o = o.transpose(1, 2).reshape(B, T, H * hd)
        h = h + lin(o, p + "self_attn.o_proj")
        x = rms_norm(h, P[p + "post_attention_layernorm.weight"], eps)
        h = h + lin(F.silu(lin(x, p + "mlp.gate_proj")) * lin(x, p + "mlp.up_proj"), p + "mlp.down_proj")
    h = rms_norm(h, P["model.norm.weight"], eps)
    w = P["model.embed_tokens.weight"] if cfg["tie_word_embeddings"] else P["lm_head.weight"]
    logits = h @ w.T  # (B, T, V): fine at this size, which is the point of an unfused reference
    return F.cross_entropy(logits.reshape(-1, w.shape[0]), targets.reshape(-1), ignore_index=IGNORE_INDEX,
                           reduction="sum")


def write_safetensors(path, tensors, metadata):
    dtypes = {torch.bfloat16: "BF16", torch.float64: "F64", torch.int32: "I32"}
    header, blobs, offset = {"__metadata__": metadata}, [], 0
    for name, t in tensors.items():
        t = t.contiguous()
        raw = t.view(torch.int16).numpy().tobytes() if t.dtype == torch.bfloat16 else t.numpy().tobytes()
        header[name] = {"dtype": dtypes[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # the format allows space padding; keeps the data 8-aligned
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for b in blobs:
            f.write(b)


def make(name, cfg, out_dir, seed):
    gen = torch.Generator().manual_seed(seed)
    V = cfg["vocab_size"]
    params_bf16 = random_params(cfg, gen)
    input_ids = torch.randint(0, V, (BATCH, SEQ), generator=gen)
    # targets = next token; the last position of each row has none; a masked "prompt" of 3 tokens
    # in row 0 and one isolated masked position in row 1.
    targets = torch.full((BATCH, SEQ), IGNORE_INDEX, dtype=torch.int64)
    targets[:, :-1] = input_ids[:, 1:]
    targets[0, :3] = IGNORE_INDEX
    targets[1, 6] = IGNORE_INDEX
    num_tokens = int((targets != IGNORE_INDEX).sum())

    P = {n: t.to(torch.float64).requires_grad_(True) for n, t in params_bf16.items()}
    loss_sum = forward_loss(cfg, P, input_ids, targets)
    (loss_sum / num_tokens).backward()  # grad_scale = 1 / unmasked tokens

    tensors = {"params." + n: t for n, t in params_bf16.items()}
    tensors["input_ids"] = input_ids.to(torch.int32)
    tensors["targets"] = targets.to(torch.int32)
    tensors.update({"grad." + n: P[n].grad.detach() for n in params_bf16})
    config_json = json.dumps(dict(cfg, architectures=[cfg["model_type"].capitalize() + "ForCausalLM"]), indent=1)
    metadata = {"config": config_json, "batch": str(BATCH), "seq": str(SEQ), "loss_sum": repr(float(loss_sum)),
                "num_tokens": str(num_tokens), "seed": str(seed),
                "generator": "scripts/golden/make_transformer_goldens.py", "torch": torch.__version__}
    path = Path(out_dir) / f"transformer_{name}.safetensors"
    write_safetensors(path, tensors, metadata)
    print(f"{path}: loss_sum {float(loss_sum):.12f} over {num_tokens} tokens, {path.stat().st_size} bytes")


def main():
    out_dir = sys.argv[1] if len(sys.argv) > 1 else "tests/data/golden"
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    for i, (name, cfg) in enumerate(CONFIGS.items()):
        make(name, cfg, out_dir, seed=1000 + i)


if __name__ == "__main__":
    main()
