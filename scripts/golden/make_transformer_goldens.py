#!/usr/bin/python3
"""Golden files for the CPU transformer math (tests/kernels/transformer/golden_test.cc).

The loss and gradients of tiny random models under the independent PyTorch implementation of the
Llama / Qwen2 / Qwen3 / Mistral decoder in hf_reference.py (shared with make_step_goldens.py; eager
attention with a full softmax, full logits, torch autograd for every gradient), which follows
transformers' modeling code: LlamaRMSNorm, rotate_half RoPE with _compute_llama3_parameters,
repeat_kv GQA, Qwen2 q/k/v bias, Qwen3 q_norm/k_norm before RoPE, SiLU-gated MLP, tied or untied
lm_head, CrossEntropyLoss(ignore_index=-100).

Parameters are drawn at random, rounded to bf16 (what the executor delivers) and stored as bf16;
everything is then computed in float64 from those exact values, so the golden loss and gradients
are exact up to float64 rounding. Each file is a safetensors file:
  __metadata__: config (the Hugging Face config.json text), batch, seq, loss_sum, num_tokens, ...
  params.<hf name>  BF16   the parameters
  input_ids, targets I32   (B, T); targets already shifted, -100 = masked
  grad.<hf name>    F64    d(loss_sum / num_tokens) / d(param)   (tied: embed_tokens gets both uses)

Run with Debian's interpreter and python3-torch (CI has no torch and only reads the committed files):
  /usr/bin/python3 scripts/golden/make_transformer_goldens.py tests/data/golden
The last bits of the float64 gradients depend on the OpenBLAS kernels: the committed files are those
of its AVX-512 (SkylakeX) kernels, so on an AVX-512 machine where OpenBLAS picks others (Debian's
0.3.21 falls back to Prescott on CPUs it does not recognize) OPENBLAS_CORETYPE=SkylakeX reproduces
them bitwise.
"""
import json
import sys
from pathlib import Path

import torch

from hf_reference import IGNORE_INDEX, loss_sum, random_params, write_safetensors

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
    total = loss_sum(cfg, P, input_ids, targets)
    (total / num_tokens).backward()  # grad_scale = 1 / unmasked tokens

    tensors = {"params." + n: t for n, t in params_bf16.items()}
    tensors["input_ids"] = input_ids.to(torch.int32)
    tensors["targets"] = targets.to(torch.int32)
    tensors.update({"grad." + n: P[n].grad.detach() for n in params_bf16})
    config_json = json.dumps(dict(cfg, architectures=[cfg["model_type"].capitalize() + "ForCausalLM"]), indent=1)
    metadata = {"config": config_json, "batch": str(BATCH), "seq": str(SEQ), "loss_sum": repr(float(total)),
                "num_tokens": str(num_tokens), "seed": str(seed),
                "generator": "scripts/golden/make_transformer_goldens.py", "torch": torch.__version__}
    path = Path(out_dir) / f"transformer_{name}.safetensors"
    write_safetensors(path, tensors, metadata)
    print(f"{path}: loss_sum {float(total):.12f} over {num_tokens} tokens, {path.stat().st_size} bytes")


def main():
    out_dir = sys.argv[1] if len(sys.argv) > 1 else "tests/data/golden"
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    for i, (name, cfg) in enumerate(CONFIGS.items()):
        make(name, cfg, out_dir, seed=1000 + i)


if __name__ == "__main__":
    main()
