"""Shared by both golden generators (make_transformer_goldens.py, make_step_goldens.py; they import it).

An independent implementation of the Llama / Qwen2 / Qwen3 / Mistral decoder written directly in
PyTorch, following transformers' modeling code: LlamaRMSNorm, rotate_half RoPE with
_compute_llama3_parameters, repeat_kv GQA, Qwen2 q/k/v bias, Qwen3 q_norm/k_norm before RoPE,
SiLU-gated MLP, tied or untied lm_head, CrossEntropyLoss(ignore_index=-100); eager attention with a
full softmax and full logits, in float64 when given float64 parameters. Gemma 4's text model (dense
and mixture of experts) is written from shared/reference/model-families.md section 2.4 (gemma4.py).
Also: what a Hugging Face config.json implies (head_dim default, family switches, parameter names
and shapes in checkpoint order), random bf16 parameters, and safetensors writing and reading.

Needs torch (Debian's python3-torch); not a script of its own.
"""
import json
import math
import struct
from pathlib import Path

import torch
import torch.nn.functional as F

IGNORE_INDEX = -100


# ---- config.json

def head_dim(cfg):
    """config.json's head_dim, or transformers' default hidden_size / num_attention_heads."""
    return cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]


def has_qkv_bias(cfg):  # Qwen2
    return cfg["model_type"] == "qwen2"


def has_qk_norm(cfg):  # Qwen3
    return cfg["model_type"] == "qwen3"


def is_gemma4(cfg):
    return cfg["model_type"] in ("gemma4", "gemma4_text")


def tensor_names(cfg):
    """(name, shape) of every parameter in checkpoint order (card/unit_layout.cc's order)."""
    if is_gemma4(cfg):
        from gemma4 import gemma4_tensor_names  # noqa: E402 (a family of its own file)
        return gemma4_tensor_names(cfg)
    from qwen3_5 import is_qwen3_5, qwen3_5_tensor_names  # noqa: E402
    if is_qwen3_5(cfg):
        return qwen3_5_tensor_names(cfg)
    C, I, V = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    H, KV, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], head_dim(cfg)
    out = [("model.embed_tokens.weight", (V, C))]
    for l in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{l}."
        out.append((p + "input_layernorm.weight", (C,)))
        for proj, rows in (("q_proj", H * hd), ("k_proj", KV * hd), ("v_proj", KV * hd)):
            out.append((p + f"self_attn.{proj}.weight", (rows, C)))
            if has_qkv_bias(cfg):
                out.append((p + f"self_attn.{proj}.bias", (rows,)))
        out.append((p + "self_attn.o_proj.weight", (C, H * hd)))
        if has_qk_norm(cfg):
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


def random_params(cfg, gen, embed_std=1.0):
    """Random weights drawn in float64 from gen (in tensor_names order) and rounded to bf16 (what the
    executor delivers); returned as bf16 tensors."""
    params = {}
    for name, shape in tensor_names(cfg):
        if is_gemma4(cfg):
            from gemma4 import gemma4_random_tensor
            t = gemma4_random_tensor(cfg, name, shape, gen, embed_std)
            if t is not None:
                params[name] = t.to(torch.bfloat16)
                continue
        from qwen3_5 import is_qwen3_5, qwen3_5_random_tensor
        if is_qwen3_5(cfg):
            t = qwen3_5_random_tensor(cfg, name, shape, gen, embed_std)
            if t is not None:
                params[name] = t.to(torch.bfloat16)
                continue
        if name.endswith("norm.weight"):
            t = 1.0 + 0.2 * torch.randn(shape, generator=gen, dtype=torch.float64)
        elif name.endswith(".bias"):
            t = 0.3 * torch.randn(shape, generator=gen, dtype=torch.float64)
        elif name == "model.embed_tokens.weight":
            t = embed_std * torch.randn(shape, generator=gen, dtype=torch.float64)
        else:  # nn.Linear (out, in): std 1/sqrt(fan_in) keeps activations O(1)
            t = torch.randn(shape, generator=gen, dtype=torch.float64) / math.sqrt(shape[1])
        params[name] = t.to(torch.bfloat16)
    return params


# ---- the model

def rms_norm(x, w, eps):  # LlamaRMSNorm
    variance = x.pow(2).mean(-1, keepdim=True)
    return w * (x * torch.rsqrt(variance + eps))


def inv_freq(cfg, hd):  # _compute_default_rope_parameters + _compute_llama3_parameters, in float64
    base = cfg["rope_theta"]
    f = 1.0 / (base ** (torch.arange(0, hd, 2, dtype=torch.int64).to(torch.float64) / hd))
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


def loss_sum(cfg, P, input_ids, targets):
    """Sum of the cross-entropy over the unmasked targets (!= IGNORE_INDEX); P {hf name: tensor},
    input_ids and targets (B, T), targets already shifted."""
    if is_gemma4(cfg):
        from gemma4 import gemma4_loss_sum
        return gemma4_loss_sum(cfg, P, input_ids, targets)
    from qwen3_5 import is_qwen3_5, qwen3_5_loss_sum
    if is_qwen3_5(cfg):
        return qwen3_5_loss_sum(cfg, P, input_ids, targets)
    B, T = input_ids.shape
    H, KV, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], head_dim(cfg)
    eps = cfg["rms_norm_eps"]
    freqs = torch.outer(torch.arange(T, dtype=torch.float64), inv_freq(cfg, hd))
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos(), emb.sin()  # (T, hd)
    causal = torch.full((T, T), float("-inf"), dtype=torch.float64).triu(1)

    def lin(x, name):
        return F.linear(x, P[name + ".weight"], P.get(name + ".bias"))

    h = P["model.embed_tokens.weight"][input_ids]  # (B, T, C)
    for l in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{l}."
        x = rms_norm(h, P[p + "input_layernorm.weight"], eps)
        q = lin(x, p + "self_attn.q_proj").view(B, T, H, hd)
        k = lin(x, p + "self_attn.k_proj").view(B, T, KV, hd)
        v = lin(x, p + "self_attn.v_proj").view(B, T, KV, hd)
        if has_qk_norm(cfg):
            q = rms_norm(q, P[p + "self_attn.q_norm.weight"], eps)
            k = rms_norm(k, P[p + "self_attn.k_norm.weight"], eps)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # (B, heads, T, hd)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        k = k.repeat_interleave(H // KV, dim=1)  # repeat_kv
        v = v.repeat_interleave(H // KV, dim=1)
        o = torch.softmax(q @ k.transpose(2, 3) * hd ** -0.5 + causal, dim=-1) @ v  # (B, H, T, hd)
        h = h + lin(o.transpose(1, 2).reshape(B, T, H * hd), p + "self_attn.o_proj")
        x = rms_norm(h, P[p + "post_attention_layernorm.weight"], eps)
        h = h + lin(F.silu(lin(x, p + "mlp.gate_proj")) * lin(x, p + "mlp.up_proj"), p + "mlp.down_proj")
    h = rms_norm(h, P["model.norm.weight"], eps)
    w = P["model.embed_tokens.weight"] if cfg["tie_word_embeddings"] else P["lm_head.weight"]
    logits = h @ w.T  # (B, T, V): fine at these sizes, which is the point of an unfused reference
    return F.cross_entropy(logits.reshape(-1, w.shape[0]), targets.reshape(-1), ignore_index=IGNORE_INDEX,
                           reduction="sum")


# ---- safetensors

SAFETENSORS_DTYPES = {torch.bfloat16: "BF16", torch.float32: "F32", torch.float64: "F64", torch.int32: "I32"}


def write_safetensors(path, tensors, metadata):
    """tensors {name: tensor} in this order; metadata {str: str}."""
    header, blobs, offset = {"__metadata__": metadata}, [], 0
    for name, t in tensors.items():
        t = t.contiguous()
        raw = t.view(torch.int16).numpy().tobytes() if t.dtype == torch.bfloat16 else t.numpy().tobytes()
        header[name] = {"dtype": SAFETENSORS_DTYPES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # the format allows space padding; keeps the data 8-aligned
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for b in blobs:
            f.write(b)


def read_safetensors(path):
    """(metadata, {name: float64 tensor for F32/F64, raw bytes otherwise}) of a file written by
    write_safetensors."""
    data = Path(path).read_bytes()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    meta = header.pop("__metadata__", {})
    out = {}
    for name, e in header.items():
        raw = data[8 + n + e["data_offsets"][0]:8 + n + e["data_offsets"][1]]
        if e["dtype"] == "F32":
            out[name] = torch.tensor(struct.unpack(f"<{len(raw) // 4}f", raw), dtype=torch.float64)
        elif e["dtype"] == "F64":
            out[name] = torch.tensor(struct.unpack(f"<{len(raw) // 8}d", raw), dtype=torch.float64)
        else:
            out[name] = raw
    return meta, out
