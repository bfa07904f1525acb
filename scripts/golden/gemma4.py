"""Gemma 4's text model (Gemma4ForConditionalGeneration's language model) for the golden generators,
written from shared/reference/model-families.md section 2.4, not from SlideDP's C++:

  h  = E[ids] * bf16(sqrt(C))                               scaled embedding, the scale in the weights' dtype
  per layer (sliding: window W, head_dim hd; full: global_head_dim, K=V, proportional RoPE):
    x  = rms(h) * w_in
    q  = rope(rms(x Wq) * q_norm),  k = rope(rms(x Wk) * k_norm),  v = rms(x Wv or x Wk), no weight
    a  = softmax(q k^T * 1.0 + causal/window mask) v          scale 1, GQA by repeat
    h1 = h + rms(a Wo) * post_attention_layernorm
    d  = down(gelu_tanh(z Wg) * z Wu),  z = rms(h1) * pre_feedforward_layernorm
    MoE: d = rms(d) * post_ff_1 + rms(experts(rms(h1) * pre_ff_2)) * post_ff_2, routed by
         r = rms(h1) * router.scale * C^-1/2, p = softmax(r Wr^T), top-k, renormalised, * per_expert_scale
    h  = (h1 + rms(d) * post_feedforward_layernorm) * layer_scalar
  logits = 30 tanh((rms(h) * norm) E^T / 30), tied head.

The experts run densely (every expert on every token, then the chosen ones gathered), so nothing of
the grouped dispatch is shared with the code under test. torch.topk's backward follows the chosen
experts only, as the reference trains. layer_scalar is a buffer (never trained).
"""
import math

import torch
import torch.nn.functional as F

from hf_reference import IGNORE_INDEX, rms_norm, rotate_half
import router_aux

PREFIX = "model.language_model."

# The smallest gap between a token's k-th and (k+1)-th router probability seen by gemma4_loss_sum
# since the last reset: the generator checks that no routing choice is near a tie.
router_min_gap = [math.inf]


def text_config(cfg):
    return cfg["text_config"] if cfg["model_type"] == "gemma4" else cfg


def layer_shape(t, l):
    """(full, head_dim, kv_heads, k_eq_v) of layer l."""
    full = t["layer_types"][l] == "full_attention"
    if not full:
        return False, t["head_dim"], t["num_key_value_heads"], False
    k_eq_v = bool(t.get("attention_k_eq_v", False))
    kv = t["num_global_key_value_heads"] if k_eq_v and t.get("num_global_key_value_heads") else t["num_key_value_heads"]
    return True, t["global_head_dim"], kv, k_eq_v


def moe(t):
    return bool(t.get("enable_moe_block", False))


def gemma4_tensor_names(cfg):
    t = text_config(cfg)
    C, I, V, H = t["hidden_size"], t["intermediate_size"], t["vocab_size"], t["num_attention_heads"]
    out = [(PREFIX + "embed_tokens.weight", (V, C))]
    for l in range(t["num_hidden_layers"]):
        full, hd, kv, k_eq_v = layer_shape(t, l)
        p = f"{PREFIX}layers.{l}."
        out.append((p + "input_layernorm.weight", (C,)))
        out.append((p + "self_attn.q_proj.weight", (H * hd, C)))
        out.append((p + "self_attn.k_proj.weight", (kv * hd, C)))
        if not k_eq_v:
            out.append((p + "self_attn.v_proj.weight", (kv * hd, C)))
        out.append((p + "self_attn.o_proj.weight", (C, H * hd)))
        out.append((p + "self_attn.q_norm.weight", (hd,)))
        out.append((p + "self_attn.k_norm.weight", (hd,)))
        out.append((p + "post_attention_layernorm.weight", (C,)))
        out.append((p + "pre_feedforward_layernorm.weight", (C,)))
        out.append((p + "mlp.gate_proj.weight", (I, C)))
        out.append((p + "mlp.up_proj.weight", (I, C)))
        out.append((p + "mlp.down_proj.weight", (C, I)))
        if moe(t):
            E, Ie = t["num_experts"], t["moe_intermediate_size"]
            out.append((p + "post_feedforward_layernorm_1.weight", (C,)))
            out.append((p + "router.proj.weight", (E, C)))
            out.append((p + "router.scale", (C,)))
            out.append((p + "router.per_expert_scale", (E,)))
            out.append((p + "pre_feedforward_layernorm_2.weight", (C,)))
            out.append((p + "experts.gate_up_proj", (E, 2 * Ie, C)))
            out.append((p + "experts.down_proj", (E, C, Ie)))
            out.append((p + "post_feedforward_layernorm_2.weight", (C,)))
        out.append((p + "post_feedforward_layernorm.weight", (C,)))
        out.append((p + "layer_scalar", (1,)))
    out.append((PREFIX + "norm.weight", (C,)))
    return out


def gemma4_random_tensor(cfg, name, shape, gen, embed_std):
    """The tensors whose draw differs from the Llama family's (None: draw as there). The router is made
    confident (scale ~4: logits of O(1)), as trained routers are, so its top-k choices sit far from ties."""
    def randn(*s):
        return torch.randn(s, generator=gen, dtype=torch.float64)
    if "norm" in name and len(shape) == 1:  # every norm weight, post_feedforward_layernorm_1 and _2 too
        return 1.0 + 0.2 * randn(*shape)
    if name.endswith("layer_scalar"):
        return 0.5 + 0.5 * torch.rand(shape, generator=gen, dtype=torch.float64)
    if name.endswith("router.scale"):
        return 4.0 + 0.5 * randn(*shape)
    if name.endswith("router.per_expert_scale"):
        return 1.0 + 0.2 * randn(*shape)
    if name.endswith("experts.gate_up_proj") or name.endswith("experts.down_proj"):
        return randn(*shape) / math.sqrt(shape[-1])  # fan-in is the last dimension
    return None


def inv_freq(t, full, hd):
    """Sliding layers: theta^(-2j/hd) for every pair. Full layers: proportional RoPE, the first
    int(partial * hd // 2) pairs at theta_g^(-2j/hd) (denominator the whole head_dim), the rest 0."""
    rp = t.get("rope_parameters") or {}
    j = torch.arange(0, hd, 2, dtype=torch.int64).to(torch.float64)
    if not full:
        theta = rp.get("sliding_attention", {}).get("rope_theta", 10000.0)
        return 1.0 / theta ** (j / hd)
    fa = rp.get("full_attention", {})
    theta, partial = fa.get("rope_theta", 1e6), fa.get("partial_rotary_factor", 1.0)
    angles = int(partial * hd // 2)
    f = 1.0 / theta ** (j / hd)
    f[angles:] = 0.0
    return f


def experts(t, P, p, z, x_router):
    """The routed branch's output before its post-norm, and the routing's smallest top-k gap."""
    C, E, K, Ie = t["hidden_size"], t["num_experts"], t["top_k_experts"], t["moe_intermediate_size"]
    eps = t["rms_norm_eps"]
    r = rms_norm(x_router, 1.0, eps) * P[p + "router.scale"] * C ** -0.5
    probs = torch.softmax(F.linear(r, P[p + "router.proj.weight"]), dim=-1)  # (B, T, E)
    w, idx = torch.topk(probs, K, dim=-1)
    router_aux.record(probs, idx)
    ordered = probs.detach().sort(dim=-1, descending=True).values
    gap = float((ordered[..., K - 1] - ordered[..., K]).min()) if K < E else math.inf
    w = w / w.sum(dim=-1, keepdim=True)
    w = w * P[p + "router.per_expert_scale"][idx]
    gu = torch.einsum("btc,eoc->bteo", z, P[p + "experts.gate_up_proj"])  # every expert on every token
    gate, up = gu[..., :Ie], gu[..., Ie:]
    m = F.gelu(gate, approximate="tanh") * up
    out = torch.einsum("btei,eci->btec", m, P[p + "experts.down_proj"])  # (B, T, E, C)
    chosen = torch.gather(out, 2, idx.unsqueeze(-1).expand(*idx.shape, C))  # (B, T, K, C)
    return (w.unsqueeze(-1) * chosen).sum(dim=2), gap


def gemma4_loss_sum(cfg, P, input_ids, targets):
    t = text_config(cfg)
    B, T = input_ids.shape
    C, H, eps = t["hidden_size"], t["num_attention_heads"], t["rms_norm_eps"]
    E = P[PREFIX + "embed_tokens.weight"]

    def lin(x, name):
        return F.linear(x, P[name + ".weight"])

    scale = torch.tensor(math.sqrt(C), dtype=torch.bfloat16).to(torch.float64)
    h = E[input_ids] * scale
    i = torch.arange(T).view(T, 1)
    j = torch.arange(T).view(1, T)
    for l in range(t["num_hidden_layers"]):
        full, hd, kv, k_eq_v = layer_shape(t, l)
        p = f"{PREFIX}layers.{l}."
        allowed = (j <= i) if full else (j <= i) & (j > i - t["sliding_window"])
        mask = torch.zeros(T, T, dtype=torch.float64).masked_fill(~allowed, float("-inf"))
        freqs = torch.outer(torch.arange(T, dtype=torch.float64), inv_freq(t, full, hd))
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos(), emb.sin()

        x = rms_norm(h, P[p + "input_layernorm.weight"], eps)
        q = lin(x, p + "self_attn.q_proj").view(B, T, H, hd)
        k_raw = lin(x, p + "self_attn.k_proj").view(B, T, kv, hd)
        v_raw = k_raw if k_eq_v else lin(x, p + "self_attn.v_proj").view(B, T, kv, hd)
        q = rms_norm(q, P[p + "self_attn.q_norm.weight"], eps)
        k = rms_norm(k_raw, P[p + "self_attn.k_norm.weight"], eps)
        v = rms_norm(v_raw, 1.0, eps)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        k = k.repeat_interleave(H // kv, dim=1)
        v = v.repeat_interleave(H // kv, dim=1)
        o = torch.softmax(q @ k.transpose(2, 3) + mask, dim=-1) @ v  # scale 1.0
        a = lin(o.transpose(1, 2).reshape(B, T, H * hd), p + "self_attn.o_proj")
        h1 = h + rms_norm(a, P[p + "post_attention_layernorm.weight"], eps)
        z = rms_norm(h1, P[p + "pre_feedforward_layernorm.weight"], eps)
        d = lin(F.gelu(lin(z, p + "mlp.gate_proj"), approximate="tanh") * lin(z, p + "mlp.up_proj"), p + "mlp.down_proj")
        if moe(t):
            d = rms_norm(d, P[p + "post_feedforward_layernorm_1.weight"], eps)
            routed, gap = experts(t, P, p, rms_norm(h1, P[p + "pre_feedforward_layernorm_2.weight"], eps), h1)
            router_min_gap[0] = min(router_min_gap[0], gap)
            d = d + rms_norm(routed, P[p + "post_feedforward_layernorm_2.weight"], eps)
        h = (h1 + rms_norm(d, P[p + "post_feedforward_layernorm.weight"], eps)) * P[p + "layer_scalar"]
    h = rms_norm(h, P[PREFIX + "norm.weight"], eps)
    cap = t["final_logit_softcapping"]
    logits = h @ E.T
    logits = cap * torch.tanh(logits / cap)
    return F.cross_entropy(logits.reshape(-1, E.shape[0]), targets.reshape(-1), ignore_index=IGNORE_INDEX,
                           reduction="sum")
