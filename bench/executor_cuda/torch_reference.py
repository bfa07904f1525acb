#!/usr/bin/env python3
"""PyTorch GPU-resident reference for bench_executor_cuda (the GPU check's outside yardstick).

Trains a Llama-3.2-1B-shaped model (random weights; tied embeddings, GQA, llama3 RoPE scaling,
SwiGLU, RMSNorm) entirely on one GPU with the standard mixed-precision recipe: fp32 parameters,
bf16 autocast, PyTorch's fused AdamW, flash attention through scaled_dot_product_attention, and the
same batch shape as the C++ benchmark (micro-batch x accumulation x sequence length). The model is
written here in plain torch (no transformers dependency), layer for layer as
kernels/cpu/transformer/llama_layer.h describes it. Reports tokens/s, the forward+backward time,
the optimizer time and model TFLOP/s (with the C++ benchmark's FLOPs per token), as JSON.
"""
import argparse
import json
import math
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


def llama3_inv_freq(head_dim, theta, factor, low_freq_factor, high_freq_factor, original_max):
    """transformers' _compute_llama3_parameters, as kernels/cpu/transformer/rope.cc."""
    inv = [1.0 / theta ** (2 * i / head_dim) for i in range(head_dim // 2)]
    low_wavelen = original_max / low_freq_factor
    high_wavelen = original_max / high_freq_factor
    out = []
    for f in inv:
        wavelen = 2 * math.pi / f
        f_llama = f / factor if wavelen > low_wavelen else f
        smooth = (original_max / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
        smoothed = (1 - smooth) * f_llama / factor + smooth * f_llama
        medium = not (wavelen < high_wavelen) and not (wavelen > low_wavelen)
        out.append(smoothed if medium else f_llama)
    return torch.tensor(out, dtype=torch.float64)


def rotate(x, cos, sin):  # x (B, heads, T, hd), rotate_half convention
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


class Block(nn.Module):
    def __init__(self, C, H, KV, hd, I, eps):
        super().__init__()
        self.H, self.KV, self.hd, self.eps = H, KV, hd, eps
        self.ln1 = nn.Parameter(torch.ones(C))
        self.q = nn.Linear(C, H * hd, bias=False)
        self.k = nn.Linear(C, KV * hd, bias=False)
        self.v = nn.Linear(C, KV * hd, bias=False)
        self.o = nn.Linear(H * hd, C, bias=False)
        self.ln2 = nn.Parameter(torch.ones(C))
        self.gate = nn.Linear(C, I, bias=False)
        self.up = nn.Linear(C, I, bias=False)
        self.down = nn.Linear(I, C, bias=False)

    def forward(self, x, cos, sin):
        B, T, C = x.shape
        h = F.rms_norm(x, (C,), self.ln1, self.eps)
        q = self.q(h).view(B, T, self.H, self.hd).transpose(1, 2)
        k = self.k(h).view(B, T, self.KV, self.hd).transpose(1, 2)
        v = self.v(h).view(B, T, self.KV, self.hd).transpose(1, 2)
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        try:
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        except TypeError:  # older torch: expand the kv heads
            rep = self.H // self.KV
            a = F.scaled_dot_product_attention(q, k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1), is_causal=True)
        x = x + self.o(a.transpose(1, 2).reshape(B, T, self.H * self.hd))
        h = F.rms_norm(x, (C,), self.ln2, self.eps)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


class Llama(nn.Module):
    def __init__(self, a):
        super().__init__()
        self.embed = nn.Embedding(a.vocab, a.hidden)
        self.blocks = nn.ModuleList(
            Block(a.hidden, a.heads, a.kv_heads, a.head_dim, a.intermediate, a.eps) for _ in range(a.layers))
        self.norm = nn.Parameter(torch.ones(a.hidden))
        self.eps = a.eps
        inv = llama3_inv_freq(a.head_dim, a.rope_theta, 32.0, 1.0, 4.0, 8192)
        t = torch.arange(a.seq, dtype=torch.float64)
        ang = torch.outer(t, inv)
        self.register_buffer("cos", ang.cos().float(), persistent=False)
        self.register_buffer("sin", ang.sin().float(), persistent=False)
        for p in self.parameters():
            if p.dim() == 2:
                nn.init.normal_(p, std=0.02)

    def forward(self, tokens, targets):
        x = self.embed(tokens)
        cos, sin = self.cos.to(x.dtype), self.sin.to(x.dtype)
        for b in self.blocks:
            x = b(x, cos, sin)
        x = F.rms_norm(x, (x.shape[-1],), self.norm, self.eps)
        logits = F.linear(x, self.embed.weight)  # tied lm_head
        return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seq", type=int, default=2048)
    p.add_argument("--micro-batch", type=int, default=4)
    p.add_argument("--accum", type=int, default=4)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--flops-per-token", type=float, default=0.0, help="model FLOPs per token (from bench.csv)")
    p.add_argument("--out", default="")
    # Llama-3.2-1B (card/presets/models/llama-3.2-1b.yaml)
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--layers", type=int, default=16)
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--kv-heads", dest="kv_heads", type=int, default=8)
    p.add_argument("--head-dim", dest="head_dim", type=int, default=64)
    p.add_argument("--intermediate", type=int, default=8192)
    p.add_argument("--vocab", type=int, default=128256)
    p.add_argument("--rope-theta", dest="rope_theta", type=float, default=500000.0)
    p.add_argument("--eps", type=float, default=1e-5)
    a = p.parse_args()

    torch.manual_seed(0)
    dev = torch.device("cuda")
    torch.backends.cuda.matmul.allow_tf32 = True
    model = Llama(a).to(dev)
    params = sum(x.numel() for x in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01, fused=True)
    B, T = a.micro_batch, a.seq
    data = torch.randint(0, a.vocab, (a.warmup + a.steps, a.accum, B, T + 1), device=dev)

    fwdbwd, optim, steps = [], [], []
    for s in range(a.warmup + a.steps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        e0, e1, e2 = (torch.cuda.Event(enable_timing=True) for _ in range(3))
        e0.record()
        for m in range(a.accum):
            batch = data[s, m]
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = model(batch[:, :-1], batch[:, 1:]) / a.accum
            loss.backward()
        e1.record()
        opt.step()
        opt.zero_grad(set_to_none=True)
        e2.record()
        torch.cuda.synchronize()
        if s >= a.warmup:
            steps.append(time.perf_counter() - t0)
            fwdbwd.append(e0.elapsed_time(e1) / 1e3)
            optim.append(e1.elapsed_time(e2) / 1e3)
        print(f"[torch] step {s + 1} loss {loss.item() * a.accum:.4f} {time.perf_counter() - t0:.3f} s", flush=True)

    tokens = a.accum * B * T
    step_s = sum(steps) / len(steps)
    r = {
        "torch": torch.__version__,
        "gpu": torch.cuda.get_device_name(0),
        "params": params,
        "recipe": "fp32 params, bf16 autocast, fused AdamW, SDPA flash attention",
        "tokens_per_step": tokens,
        "step_s": step_s,
        "fwdbwd_s": sum(fwdbwd) / len(fwdbwd),
        "optimizer_s": sum(optim) / len(optim),
        "tokens_per_s": tokens / step_s,
        "fwdbwd_tokens_per_s": tokens / (sum(fwdbwd) / len(fwdbwd)),
        "model_tflops": a.flops_per_token * tokens / step_s / 1e12 if a.flops_per_token else None,
        "peak_memory_gib": torch.cuda.max_memory_allocated() / 2**30,
    }
    print(json.dumps(r, indent=1))
    if a.out:
        with open(a.out, "w") as f:
            json.dump(r, f, indent=1)


if __name__ == "__main__":
    main()
