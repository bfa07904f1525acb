"""Qwen3.6 / Qwen3.5's text model (Qwen3_5ForConditionalGeneration's language model) for the golden
generators, written from shared/reference/model-families.md section 3.4, not from SlideDP's C++:

  h = E[ids]                                                       plain embedding, untied head
  per layer (layer_types: linear_attention | full_attention):
    x   = rms(h) * (1 + w_in)                                      zero-centred RMSNorm
    Gated DeltaNet:  [q|k|v] = silu(causal depthwise conv1d(x Wqkv)),  z = x Wz,  b = sigmoid(x Wb),
                     g = -exp(A_log) softplus(x Wa + dt_bias);  q, k l2-normalised (eps 1e-6), q / sqrt(dk);
                     the TOKEN-BY-TOKEN recurrence S <- exp(g) S; d = b (v - S^T k); S <- S + k d^T;
                     o = S^T q per value head (key head h / (nv / nk));  mix = (w * rms(o) * silu(z)) Wout
    gated attention: [q | gate] per head = x Wq;  q = rope(rms(q) (1 + q_norm)), k = rope(rms(x Wk) (1 + k_norm)),
                     RoPE on the first rotary_dim channels; softmax(q k^T / sqrt(hd), causal) v * sigmoid(gate), Wo
    h1  = h + mix;  u = rms(h1) * (1 + w_post)
    ffn = down(silu(u Wg) * u Wu)  or  sum_k w_k expert_k(u) + sigmoid(u w_sg) shared(u)   (softmax top-k renormalised)
    h   = h1 + ffn
  logits = (rms(h) * (1 + norm)) lm_head^T.

The recurrence runs token by token (no chunks: the executor's chunked form is what this checks); the
experts run densely (every expert on every token, the chosen ones gathered).
"""
import math

import torch
import torch.nn.functional as F

from hf_reference import IGNORE_INDEX, rms_norm, rotate_half
import router_aux

PREFIX = "model.language_model."

# The smallest gap between a token's k-th and (k+1)-th router probability since the last reset.
router_min_gap = [math.inf]


def is_qwen3_5(cfg):
    return cfg["model_type"] in ("qwen3_5", "qwen3_5_moe", "qwen3_5_text", "qwen3_5_moe_text")


def text_config(cfg):
    return cfg.get("text_config", cfg)


def moe(t):
    return t.get("num_experts", 0) > 0


def qwen3_5_tensor_names(cfg):
    t = text_config(cfg)
    C, V, H, KV, hd = t["hidden_size"], t["vocab_size"], t["num_attention_heads"], t["num_key_value_heads"], t["head_dim"]
    nk, nv, dk, dv = t["linear_num_key_heads"], t["linear_num_value_heads"], t["linear_key_head_dim"], t["linear_value_head_dim"]
    D, Vd, K = 2 * nk * dk + nv * dv, nv * dv, t["linear_conv_kernel_dim"]
    out = [(PREFIX + "embed_tokens.weight", (V, C))]
    for l in range(t["num_hidden_layers"]):
        p = f"{PREFIX}layers.{l}."
        out.append((p + "input_layernorm.weight", (C,)))
        if t["layer_types"][l] == "linear_attention":
            out += [(p + "linear_attn.in_proj_qkv.weight", (D, C)), (p + "linear_attn.in_proj_z.weight", (Vd, C)),
                    (p + "linear_attn.in_proj_b.weight", (nv, C)), (p + "linear_attn.in_proj_a.weight", (nv, C)),
                    (p + "linear_attn.conv1d.weight", (D, 1, K)), (p + "linear_attn.dt_bias", (nv,)),
                    (p + "linear_attn.A_log", (nv,)), (p + "linear_attn.norm.weight", (dv,)),
                    (p + "linear_attn.out_proj.weight", (C, Vd))]
        else:
            out += [(p + "self_attn.q_proj.weight", (2 * H * hd, C)), (p + "self_attn.k_proj.weight", (KV * hd, C)),
                    (p + "self_attn.v_proj.weight", (KV * hd, C)), (p + "self_attn.o_proj.weight", (C, H * hd)),
                    (p + "self_attn.q_norm.weight", (hd,)), (p + "self_attn.k_norm.weight", (hd,))]
        out.append((p + "post_attention_layernorm.weight", (C,)))
        if moe(t):
            E, Ie, Is = t["num_experts"], t["moe_intermediate_size"], t["shared_expert_intermediate_size"]
            out += [(p + "mlp.gate.weight", (E, C)), (p + "mlp.experts.gate_up_proj", (E, 2 * Ie, C)),
                    (p + "mlp.experts.down_proj", (E, C, Ie)), (p + "mlp.shared_expert.gate_proj.weight", (Is, C)),
                    (p + "mlp.shared_expert.up_proj.weight", (Is, C)), (p + "mlp.shared_expert.down_proj.weight", (C, Is)),
                    (p + "mlp.shared_expert_gate.weight", (1, C))]
        else:
            I = t["intermediate_size"]
            out += [(p + "mlp.gate_proj.weight", (I, C)), (p + "mlp.up_proj.weight", (I, C)),
                    (p + "mlp.down_proj.weight", (C, I))]
    out.append((PREFIX + "norm.weight", (C,)))
    if not t.get("tie_word_embeddings", False):
        out.append(("lm_head.weight", (V, C)))
    return out


def qwen3_5_random_tensor(cfg, name, shape, gen, embed_std):
    """The tensors whose draw differs from the Llama family's (None: draw as there). Zero-centred norm
    weights near 0 (scale 1 + w near 1); the DeltaNet's decay parameters as transformers initialises
    them (A in (0, 16], dt_bias near 1); a confident router (logits of O(1)) whose top-k choices sit
    far from ties."""
    def randn(*s):
        return torch.randn(s, generator=gen, dtype=torch.float64)
    if name.endswith("linear_attn.norm.weight"):  # the one plain `w` norm
        return 1.0 + 0.2 * randn(*shape)
    if "norm" in name and len(shape) == 1:
        return 0.2 * randn(*shape)
    if name.endswith("linear_attn.A_log"):
        return torch.log(1.0 + 15.0 * torch.rand(shape, generator=gen, dtype=torch.float64))
    if name.endswith("linear_attn.dt_bias"):
        return 1.0 + 0.2 * randn(*shape)
    if name.endswith("linear_attn.conv1d.weight"):
        return randn(*shape) / math.sqrt(shape[-1])
    if name.endswith("mlp.gate.weight"):
        return 2.0 * randn(*shape) / math.sqrt(shape[1])
    if name.endswith("experts.gate_up_proj") or name.endswith("experts.down_proj"):
        return randn(*shape) / math.sqrt(shape[-1])  # fan-in is the last dimension
    if name == PREFIX + "embed_tokens.weight":
        return embed_std * randn(*shape)
    return None


def zc_norm(x, w, eps):
    return rms_norm(x, 1.0 + w, eps)


def gated_deltanet(t, P, p, x):
    B, T, _ = x.shape
    nk, nv, dk, dv = t["linear_num_key_heads"], t["linear_num_value_heads"], t["linear_key_head_dim"], t["linear_value_head_dim"]
    Kd, Vd, K = nk * dk, nv * dv, t["linear_conv_kernel_dim"]
    mixed = F.linear(x, P[p + "linear_attn.in_proj_qkv.weight"])  # (B, T, D)
    w = P[p + "linear_attn.conv1d.weight"]
    conv = F.conv1d(mixed.transpose(1, 2), w, padding=K - 1, groups=w.shape[0])[..., :T]  # causal: left context only
    a = F.silu(conv).transpose(1, 2)
    q = a[..., :Kd].reshape(B, T, nk, dk)
    k = a[..., Kd:2 * Kd].reshape(B, T, nk, dk)
    v = a[..., 2 * Kd:].reshape(B, T, nv, dv)
    z = F.linear(x, P[p + "linear_attn.in_proj_z.weight"]).reshape(B, T, nv, dv)
    beta = torch.sigmoid(F.linear(x, P[p + "linear_attn.in_proj_b.weight"]))  # (B, T, nv)
    g = -torch.exp(P[p + "linear_attn.A_log"]) * F.softplus(F.linear(x, P[p + "linear_attn.in_proj_a.weight"]) +
                                                            P[p + "linear_attn.dt_bias"])
    q = q * torch.rsqrt((q * q).sum(-1, keepdim=True) + 1e-6) / math.sqrt(dk)
    k = k * torch.rsqrt((k * k).sum(-1, keepdim=True) + 1e-6)
    q = q.repeat_interleave(nv // nk, dim=2)  # value head h reads key head h // (nv / nk)
    k = k.repeat_interleave(nv // nk, dim=2)
    S = torch.zeros(B, nv, dk, dv, dtype=x.dtype)
    outs = []
    for i in range(T):
        S = S * torch.exp(g[:, i])[..., None, None]
        kt = k[:, i]
        delta = beta[:, i, :, None] * (v[:, i] - torch.einsum("bhkv,bhk->bhv", S, kt))
        S = S + torch.einsum("bhk,bhv->bhkv", kt, delta)
        outs.append(torch.einsum("bhkv,bhk->bhv", S, q[:, i]))
    o = torch.stack(outs, dim=1)  # (B, T, nv, dv)
    n = rms_norm(o, P[p + "linear_attn.norm.weight"], t["rms_norm_eps"]) * F.silu(z)
    return F.linear(n.reshape(B, T, Vd), P[p + "linear_attn.out_proj.weight"])


def gated_attention(t, P, p, x):
    B, T, _ = x.shape
    H, KV, hd, eps = t["num_attention_heads"], t["num_key_value_heads"], t["head_dim"], t["rms_norm_eps"]
    rp = t.get("rope_parameters") or {}
    rd = int(hd * rp.get("partial_rotary_factor", 0.25))
    qp = F.linear(x, P[p + "self_attn.q_proj.weight"]).reshape(B, T, H, 2 * hd)
    q, gate = qp[..., :hd], qp[..., hd:]
    q = zc_norm(q, P[p + "self_attn.q_norm.weight"], eps)
    k = zc_norm(F.linear(x, P[p + "self_attn.k_proj.weight"]).reshape(B, T, KV, hd), P[p + "self_attn.k_norm.weight"], eps)
    v = F.linear(x, P[p + "self_attn.v_proj.weight"]).reshape(B, T, KV, hd)
    q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    inv = 1.0 / rp.get("rope_theta", 1e7) ** (torch.arange(0, rd, 2, dtype=torch.int64).to(torch.float64) / rd)
    freqs = torch.outer(torch.arange(T, dtype=torch.float64), inv)
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos(), emb.sin()

    def rope(y):  # the first rd channels rotate (pairs j, j + rd/2), the rest pass through
        r, rest = y[..., :rd], y[..., rd:]
        return torch.cat((r * cos + rotate_half(r) * sin, rest), dim=-1)
    q, k = rope(q), rope(k)
    k = k.repeat_interleave(H // KV, dim=1)
    v = v.repeat_interleave(H // KV, dim=1)
    causal = torch.full((T, T), float("-inf"), dtype=torch.float64).triu(1)
    o = torch.softmax(q @ k.transpose(2, 3) * hd ** -0.5 + causal, dim=-1) @ v  # (B, H, T, hd)
    o = o.transpose(1, 2).reshape(B, T, H * hd) * torch.sigmoid(gate.reshape(B, T, H * hd))
    return F.linear(o, P[p + "self_attn.o_proj.weight"])


def swiglu(P, u, gate, up, down):
    return F.linear(F.silu(F.linear(u, P[gate])) * F.linear(u, P[up]), P[down])


def moe_block(t, P, p, u):
    C, E, K, Ie = t["hidden_size"], t["num_experts"], t["num_experts_per_tok"], t["moe_intermediate_size"]
    probs = torch.softmax(F.linear(u, P[p + "mlp.gate.weight"]), dim=-1)  # (B, T, E)
    w, idx = torch.topk(probs, K, dim=-1)
    router_aux.record(probs, idx)
    ordered = probs.detach().sort(dim=-1, descending=True).values
    router_min_gap[0] = min(router_min_gap[0], float((ordered[..., K - 1] - ordered[..., K]).min()) if K < E else math.inf)
    w = w / w.sum(dim=-1, keepdim=True)
    gu = torch.einsum("btc,eoc->bteo", u, P[p + "mlp.experts.gate_up_proj"])  # every expert on every token
    m = F.silu(gu[..., :Ie]) * gu[..., Ie:]
    out = torch.einsum("btei,eci->btec", m, P[p + "mlp.experts.down_proj"])  # (B, T, E, C)
    chosen = torch.gather(out, 2, idx.unsqueeze(-1).expand(*idx.shape, C))
    routed = (w.unsqueeze(-1) * chosen).sum(dim=2)
    shared = swiglu(P, u, p + "mlp.shared_expert.gate_proj.weight", p + "mlp.shared_expert.up_proj.weight",
                    p + "mlp.shared_expert.down_proj.weight")
    return routed + torch.sigmoid(F.linear(u, P[p + "mlp.shared_expert_gate.weight"])) * shared


def qwen3_5_loss_sum(cfg, P, input_ids, targets):
    t = text_config(cfg)
    eps = t["rms_norm_eps"]
    E = P[PREFIX + "embed_tokens.weight"]
    h = E[input_ids]
    for l in range(t["num_hidden_layers"]):
        p = f"{PREFIX}layers.{l}."
        x = zc_norm(h, P[p + "input_layernorm.weight"], eps)
        h1 = h + (gated_deltanet(t, P, p, x) if t["layer_types"][l] == "linear_attention" else gated_attention(t, P, p, x))
        u = zc_norm(h1, P[p + "post_attention_layernorm.weight"], eps)
        ffn = moe_block(t, P, p, u) if moe(t) else swiglu(P, u, p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight",
                                                           p + "mlp.down_proj.weight")
        h = h1 + ffn
    h = zc_norm(h, P[PREFIX + "norm.weight"], eps)
    w = E if t.get("tie_word_embeddings", False) else P["lm_head.weight"]
    logits = h @ w.T
    return F.cross_entropy(logits.reshape(-1, w.shape[0]), targets.reshape(-1), ignore_index=IGNORE_INDEX,
                           reduction="sum")
