#!/usr/bin/python3
"""Golden files for whole training steps (tests/executor/step_reference_test.cc).

Writes tiny random Hugging Face model folders, token files in SlideDP's format, and what an
independent float64 PyTorch implementation of the model (hf_reference.py, shared with
make_transformer_goldens.py), trained with torch.optim.AdamW and
torch.nn.utils.clip_grad_norm_, gives for 3 optimizer steps with slidedp-run's hyper-parameters:
the loss of every step, and the master weights and AdamW moments after steps 1 and 3.

Conventions (those of slidedp-run; executor/updater.cc, kernels/cpu/optim/adamw.h,
executor/lr_schedule.h, docs/EXECUTOR.md):
  loss      token mean over the global batch: sum of the masked cross-entropy over all sequences of
            the step / number of unmasked targets of the step; the gradient is that of this mean.
  clipping  torch.nn.utils.clip_grad_norm_ over all parameters (coefficient max / (norm + 1e-6),
            capped at 1), before the update.
  AdamW     torch.optim.AdamW: betas (0.9, 0.999), eps 1e-8, decoupled weight decay on every tensor
            (unless a case names no-decay groups), bias correction with the 1-based step.
  lr        lr_at(step), 1-based: warm-up lr * step / W for step <= W; cosine
            min + (lr - min) * (1 + cos(pi * (step - W) / (N - W))) / 2 for W < step <= N, with
            N = --steps (slidedp-run's total for a run that is not resumed).

Data order: each token file holds exactly S = G sequences of T tokens (N = G*T + 1 tokens), G the
global batch in sequences. io/sequence_sampler.h gives each epoch floor(S / G) = 1 step and skips the
S mod G = 0 last positions, so every step takes all G sequences (in a seeded order that differs per
step); any split over ranks, micro-batches and accumulation then sums the same terms, and the
reference needs no sampler: each step is the whole data set.

The model parameters are drawn in float64 and rounded to bf16 (stored as bf16: the folder is what a
user would download), so the float64 reference starts from exactly the weights slidedp-run loads.

Files (under OUT, default tests/data/step_golden):
  models/<model>/config.json, model.safetensors   the initial model (bf16)
  data/<data>.tok                                 token file (io/token_dataset.h, docs/FORMATS.md)
  <case>.safetensors                              expected results of one case:
     __metadata__: model, data, run_flags (the slidedp-run optimizer flags of the case), steps,
                   loss (JSON list, per step), lr (per step), grad_norm (per step, before clipping),
                   clip_coef (per step), targets (unmasked targets per step), betas, eps,
                   weight_decay, no_decay, seq, global_batch, generator, torch
     step1.master.<hf name>, step1.exp_avg.<..>, step1.exp_avg_sq.<..>   F32, after step 1
     step3.master.<hf name>, step3.exp_avg.<..>, step3.exp_avg_sq.<..>   F32, after step 3
     (the float64 results rounded to nearest fp32)

Run with Debian's interpreter and python3-torch:
  /usr/bin/python3 scripts/golden/make_step_goldens.py tests/data/step_golden
  /usr/bin/python3 scripts/golden/make_step_goldens.py /tmp/x --compare tests/data/step_golden
The second form regenerates into /tmp/x (emptied first) and checks that the committed files are what
this script makes (ctest StepGoldens.Regenerate; exit code 77, "skipped", without torch). Models and
token files must be bitwise equal, so a torch whose random generator differs (another Debian release)
fails it: regenerate then.
"""
import argparse
import json
import math
import shutil
import struct
import sys
from pathlib import Path

try:
    import torch
except ImportError:  # ctest reports the regeneration check as skipped, not failed, without torch
    print("make_step_goldens.py needs Debian's python3-torch (apt-get install python3-torch)")
    sys.exit(77)

import gemma4
import qwen3_5
import router_aux
from hf_reference import IGNORE_INDEX, loss_sum, random_params, read_safetensors, write_safetensors

# Buffers: loaded from the checkpoint, never trained (Gemma 4's layer_scalar). The reference keeps them
# out of the optimizer; their expected state is the loaded value with zero moments, which is what an
# AdamW that never sees a gradient for them holds.
def is_buffer(name):
    return name.endswith("layer_scalar")

SEQ = 12           # T
GLOBAL_BATCH = 6   # G: 1x6, 2x3, 3x2, 3x1 accum 2, 1x3 accum 2, 2x1 accum 3 are all the same batch
STEPS = 3

# Tiny models. Every family's switches are on: llama: tied embeddings + llama3 RoPE scaling whose
# bands (original context 64, factors 1 and 4) put the 4 frequencies of head_dim 8 at wavelengths
# 6.3 (kept), 63 (interpolated), 628 and 6283 (divided); qwen2: q/k/v biases, 2:1 GQA, untied;
# qwen3: q/k norms, head_dim 12 != hidden / heads = 8 (written explicitly: transformers' default
# would be 128), tied; mistral: a single kv head, untied.
BASE = dict(hidden_size=16, intermediate_size=20, vocab_size=48, max_position_embeddings=128,
            hidden_act="silu", torch_dtype="bfloat16", bos_token_id=1, eos_token_id=2)
MODELS = {
    "llama": dict(BASE, architectures=["LlamaForCausalLM"], model_type="llama", num_hidden_layers=3,
                  num_attention_heads=2, num_key_value_heads=2, head_dim=8, rope_theta=10000.0,
                  rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                "high_freq_factor": 4.0, "original_max_position_embeddings": 64},
                  rms_norm_eps=1e-5, tie_word_embeddings=True, attention_bias=False, mlp_bias=False),
    "qwen2": dict(BASE, architectures=["Qwen2ForCausalLM"], model_type="qwen2", num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, rope_theta=1000000.0, rope_scaling=None,
                  rms_norm_eps=1e-6, tie_word_embeddings=False, use_sliding_window=False),
    "qwen3": dict(BASE, architectures=["Qwen3ForCausalLM"], model_type="qwen3", num_hidden_layers=2,
                  num_attention_heads=2, num_key_value_heads=1, head_dim=12, rope_theta=1000000.0,
                  rope_scaling=None, rms_norm_eps=1e-6, tie_word_embeddings=True, attention_bias=False),
    "mistral": dict(BASE, architectures=["MistralForCausalLM"], model_type="mistral", num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=1, head_dim=4, rope_theta=1000000.0,
                    rope_scaling=None, rms_norm_eps=1e-5, tie_word_embeddings=False, sliding_window=None),
}
# Gemma 4 as released (Gemma4ForConditionalGeneration: the text model under text_config, tensors under
# model.language_model.): two sliding layers (window 5 < SEQ) and a global one with its own head_dim,
# one KV head, K=V and proportional RoPE (2 of 8 pairs rotate); scaled embedding, softcapped tied head.
# gemma4_moe adds the 26B-A4B block in miniature: 8 experts, top 2, intermediate size 6.
GEMMA4_TEXT = dict(model_type="gemma4_text", hidden_size=16, intermediate_size=20, vocab_size=48,
                   num_hidden_layers=3, num_attention_heads=2, num_key_value_heads=2, head_dim=8,
                   global_head_dim=16, num_global_key_value_heads=1, attention_k_eq_v=True,
                   layer_types=["sliding_attention", "sliding_attention", "full_attention"], sliding_window=5,
                   rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                                    "full_attention": {"rope_type": "proportional", "rope_theta": 1000000.0,
                                                       "partial_rotary_factor": 0.25}},
                   rms_norm_eps=1e-6, final_logit_softcapping=30.0, hidden_activation="gelu_pytorch_tanh",
                   hidden_size_per_layer_input=0, num_kv_shared_layers=0, max_position_embeddings=128,
                   tie_word_embeddings=True, enable_moe_block=False)
MODELS["gemma4"] = dict(architectures=["Gemma4ForConditionalGeneration"], model_type="gemma4",
                        text_config=GEMMA4_TEXT, vision_config=None, tie_word_embeddings=True,
                        torch_dtype="bfloat16")
MODELS["gemma4_moe"] = dict(MODELS["gemma4"], text_config=dict(GEMMA4_TEXT, enable_moe_block=True, num_experts=8,
                                                                 top_k_experts=2, moe_intermediate_size=6))
# Qwen3.6 as released (Qwen3_5ForConditionalGeneration: text_config, model.language_model.): the 3:1
# schedule in miniature (two Gated DeltaNet layers, then a gated full-attention layer), grouped value
# heads (2 key heads, 4 value heads), partial RoPE on 2 of 8 channels, zero-centred norms, untied head.
# qwen3_5_moe adds the 35B-A3B block in miniature: 8 experts, top 2, intermediate size 6, a shared expert of 8.
QWEN3_5_TEXT = dict(model_type="qwen3_5_text", hidden_size=16, intermediate_size=20, vocab_size=48,
                    num_hidden_layers=3, num_attention_heads=2, num_key_value_heads=1, head_dim=8,
                    layer_types=["linear_attention", "linear_attention", "full_attention"],
                    linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=4, linear_value_head_dim=4,
                    linear_conv_kernel_dim=4, rope_parameters={"rope_type": "default", "rope_theta": 10000000.0,
                                                               "partial_rotary_factor": 0.25},
                    attn_output_gate=True, hidden_act="silu", rms_norm_eps=1e-6, max_position_embeddings=128,
                    tie_word_embeddings=False)
MODELS["qwen3_5"] = dict(architectures=["Qwen3_5ForConditionalGeneration"], model_type="qwen3_5",
                         text_config=QWEN3_5_TEXT, tie_word_embeddings=False, torch_dtype="bfloat16")
QWEN3_5_MOE_TEXT = {k: v for k, v in QWEN3_5_TEXT.items() if k != "intermediate_size"}
QWEN3_5_MOE_TEXT.update(model_type="qwen3_5_moe_text", num_experts=8, num_experts_per_tok=2, moe_intermediate_size=6,
                        shared_expert_intermediate_size=8)
MODELS["qwen3_5_moe"] = dict(architectures=["Qwen3_5MoeForConditionalGeneration"], model_type="qwen3_5_moe",
                             text_config=QWEN3_5_MOE_TEXT, tie_word_embeddings=False, torch_dtype="bfloat16")

# Token files: G*T + 1 tokens. "masked": runs of masked tokens like prompts (39 of the 72 targets
# count), and sequence 4 has no target at all, so with micro-batch 1 some rank
# has a micro-batch that contributes nothing to the loss but still runs.
DATA = {
    "plain": dict(seed=7, mask=False),
    "masked": dict(seed=8, mask=True),
}

# Cases: a model, a token file and slidedp-run's optimizer settings. Each (mask, clip) pair appears
# once; two cases use warm-up + cosine (W=2: rates lr/2, lr, min; W=1: lr, (lr+min)/2, min). The
# qwen2 case also takes non-default AdamW settings (--adam-betas, --adam-eps, --no-decay-on: no weight
# decay on norms, biases and the embedding; qwen2 is the family with biases) and weight decay 0.1.
# clip "auto": half the step-1 gradient norm, so clipping is active at least at step 1.
# The Gemma 4 cases: the dense model with clipping, the MoE model with the mask and warm-up + cosine;
# Qwen3.6's: the dense model with clipping, the MoE model with warm-up + cosine, both on the plain data.
# With the masked data both Qwen3.6 models have a few elements whose step-1 gradient is ~1e-7 of their
# tensor's scale (e.g. a row of in_proj_b, a gate row of q_proj): AdamW turns the fp32 rounding of
# such a gradient into weight differences of up to 5e-4 after one step, and the later steps' bound
# assumes weights exact to fp32 rounding (step_reference_test.cc, tolerance note (1)). The loss mask
# is the head's code, the same for every family; the Llama and Gemma 4 cases cover it.
DEFAULT_OPT = dict(lr=1e-2, schedule="constant", warmup=0, min_lr=0.0, weight_decay=0.01, clip=0.0,
                   betas=(0.9, 0.999), eps=1e-8, no_decay=(), router_aux=0.0)
CASES = {
    "llama_masked_clip_cosine": dict(model="llama", data="masked",
                                     opt=dict(schedule="cosine", warmup=2, min_lr=2e-3, clip="auto")),
    "qwen2_plain_clip_adam_flags": dict(model="qwen2", data="plain",
                                        opt=dict(clip="auto", weight_decay=0.1, betas=(0.8, 0.95), eps=1e-6,
                                                 no_decay=("norms", "biases", "embeddings"))),
    "qwen3_plain_cosine": dict(model="qwen3", data="plain", opt=dict(schedule="cosine", warmup=1, min_lr=1e-3)),
    "mistral_masked_constant": dict(model="mistral", data="masked", opt=dict(lr=5e-3)),
    "gemma4_plain_clip": dict(model="gemma4", data="plain", opt=dict(clip="auto")),
    "gemma4_moe_masked_cosine": dict(model="gemma4_moe", data="masked",
                                     opt=dict(schedule="cosine", warmup=1, min_lr=1e-3)),
    "qwen3_5_plain_clip": dict(model="qwen3_5", data="plain", opt=dict(clip="auto")),
    "qwen3_5_moe_plain_cosine": dict(model="qwen3_5_moe", data="plain",
                                     opt=dict(schedule="cosine", warmup=2, min_lr=2e-3)),
    # The routers' load-balancing loss (--router-aux-loss-coef), far above the references' 0.001 so
    # that its share of every router gradient is well above the bounds (a run without it fails). The
    # Qwen3.6 case decays the rate as the MoE case above does: at a constant 1e-2 its step-3 moments
    # leave the bounds (which assume weights exact to fp32 rounding; tolerance note (1) of the test) by
    # 1.3-1.4x, the two plans as far from each other as from the reference, or a router choice comes
    # within 1e-4 of a tie.
    "gemma4_moe_masked_router_aux": dict(model="gemma4_moe", data="masked", opt=dict(router_aux=0.5)),
    "qwen3_5_moe_plain_router_aux": dict(model="qwen3_5_moe", data="plain",
                                         opt=dict(router_aux=0.5, schedule="cosine", warmup=1, min_lr=1e-3)),
}


# ---- data

def make_tokens(spec, vocab):
    """G*T + 1 token ids and the mask (None without one)."""
    gen = torch.Generator().manual_seed(spec["seed"])
    n = GLOBAL_BATCH * SEQ + 1
    tokens = torch.randint(0, vocab, (n,), generator=gen)
    if not spec["mask"]:
        return tokens, None
    mask = torch.ones(n, dtype=torch.uint8)
    i = 0
    while i < n:  # alternate runs: masked 1..3 tokens, then counted 1..6 tokens
        r = int(torch.randint(1, 4, (1,), generator=gen))
        mask[i:i + r] = 0
        i += r + int(torch.randint(1, 7, (1,), generator=gen))
    s = 4  # sequence 4: its targets are tokens [4T + 1, 5T]; none counts
    mask[s * SEQ + 1:(s + 1) * SEQ + 1] = 0
    return tokens, mask


def pack(tokens, mask):
    """docs/FORMATS.md 'Training sequences': sequence k is tokens [kT, kT + T + 1); inputs the first T,
    targets the last T, -100 where the target token's mask byte is 0. Returns (G, T) inputs, targets."""
    S = (len(tokens) - 1) // SEQ
    assert S == GLOBAL_BATCH
    inputs = torch.stack([tokens[k * SEQ:k * SEQ + SEQ] for k in range(S)])
    targets = torch.stack([tokens[k * SEQ + 1:k * SEQ + SEQ + 1] for k in range(S)]).clone()
    if mask is not None:
        m = torch.stack([mask[k * SEQ + 1:k * SEQ + SEQ + 1] for k in range(S)])
        targets[m == 0] = IGNORE_INDEX
    return inputs, targets


def write_token_file(path, tokens, mask, vocab):
    """docs/FORMATS.md 'Token files': 64-byte header, uint16 tokens, optional mask bytes."""
    header = b"SDPTOKNS" + struct.pack("<IIQQI", 1, 2, len(tokens), vocab, 1 if mask is not None else 0)
    header += b"\0" * (64 - len(header))
    body = struct.pack(f"<{len(tokens)}H", *[int(t) for t in tokens])
    if mask is not None:
        body += bytes(int(m) for m in mask)
    Path(path).write_bytes(header + body)


# ---- training

def lr_at(opt, step):
    """executor/lr_schedule.h: 1-based step; cosine total = STEPS (slidedp-run: --steps)."""
    W = opt["warmup"]
    if step <= W:
        return opt["lr"] * step / W
    if opt["schedule"] == "constant":
        return opt["lr"]
    N = max(STEPS, W + 1)
    if step > N:
        return opt["min_lr"]
    return opt["min_lr"] + (opt["lr"] - opt["min_lr"]) * (1 + math.cos(math.pi * (step - W) / (N - W))) / 2


def no_decay_group(name, groups):
    """--no-decay-on groups: norms = every *norm.weight (q_norm/k_norm too), biases = every *.bias,
    embeddings = model.embed_tokens.weight."""
    return (("norms" in groups and name.endswith("norm.weight")) or
            ("biases" in groups and name.endswith(".bias")) or
            ("embeddings" in groups and name == "model.embed_tokens.weight"))


def run_flags(opt):
    """The slidedp-run flags that select these optimizer settings (the test appends them)."""
    f = [f"--lr {opt['lr']!r}", f"--weight-decay {opt['weight_decay']!r}"]
    if opt["schedule"] == "cosine":
        f += ["--schedule cosine", f"--min-lr {opt['min_lr']!r}"]
    if opt["warmup"]:
        f.append(f"--warmup {opt['warmup']}")
    if opt["clip"]:
        f.append(f"--clip-grad-norm {opt['clip']!r}")
    if tuple(opt["betas"]) != DEFAULT_OPT["betas"]:
        f.append(f"--adam-betas {opt['betas'][0]!r},{opt['betas'][1]!r}")
    if opt["eps"] != DEFAULT_OPT["eps"]:
        f.append(f"--adam-eps {opt['eps']!r}")
    if opt["no_decay"]:
        f.append("--no-decay-on " + ",".join(opt["no_decay"]))
    if opt["router_aux"]:
        f.append(f"--router-aux-loss-coef {opt['router_aux']!r}")
    return " ".join(f)


def train(cfg, params_bf16, inputs, targets, opt):
    """STEPS steps of AdamW on the whole data set. Returns per-step records and the state after steps
    1 and 3 as {name: float64 tensor} dicts."""
    P = {n: torch.nn.Parameter(t.to(torch.float64), requires_grad=not is_buffer(n)) for n, t in params_bf16.items()}
    trained = {n: p for n, p in P.items() if not is_buffer(n)}
    num_targets = int((targets != IGNORE_INDEX).sum())
    num_experts = cfg.get("text_config", cfg).get("num_experts") or 0

    def grads_at():
        for p in trained.values():
            p.grad = None
        loss = loss_sum(cfg, P, inputs, targets) / num_targets
        aux = router_aux.take_loss(num_experts)
        if opt["router_aux"]:
            loss = loss + opt["router_aux"] * aux
        loss.backward()
        return float(loss)

    if opt["clip"] == "auto":  # half the step-1 norm, 3 significant digits
        grads_at()
        norm = math.sqrt(sum(float((p.grad ** 2).sum()) for p in trained.values()))
        opt = dict(opt, clip=float(f"{0.5 * norm:.3g}"))
    groups = [{"params": [P[n] for n in trained if not no_decay_group(n, opt["no_decay"])],
               "weight_decay": opt["weight_decay"]},
              {"params": [P[n] for n in trained if no_decay_group(n, opt["no_decay"])], "weight_decay": 0.0}]
    adamw = torch.optim.AdamW(groups, lr=opt["lr"], betas=tuple(opt["betas"]), eps=opt["eps"])
    records, states = [], {}
    for step in range(1, STEPS + 1):
        loss = grads_at()
        norm = torch.nn.utils.clip_grad_norm_(list(trained.values()), opt["clip"] if opt["clip"] else float("inf"))
        coef = min(1.0, opt["clip"] / (float(norm) + 1e-6)) if opt["clip"] else 1.0
        lr = lr_at(opt, step)
        for g in adamw.param_groups:
            g["lr"] = lr
        adamw.step()
        records.append(dict(loss=loss, lr=lr, grad_norm=float(norm), clip_coef=coef, targets=num_targets))
        if step in (1, 3):
            st = {}
            for n, p in P.items():
                st[f"step{step}.master.{n}"] = p.detach().clone()
                if is_buffer(n):
                    st[f"step{step}.exp_avg.{n}"] = torch.zeros_like(p.detach())
                    st[f"step{step}.exp_avg_sq.{n}"] = torch.zeros_like(p.detach())
                    continue
                s = adamw.state[p]
                st[f"step{step}.exp_avg.{n}"] = s["exp_avg"].clone()
                st[f"step{step}.exp_avg_sq.{n}"] = s["exp_avg_sq"].clone()
                assert int(s["step"]) == step
            states.update(st)
    if opt["clip"]:
        assert records[0]["clip_coef"] < 1, "clipping must be active at step 1"
    return records, states, opt


def generate(out_dir):
    out = Path(out_dir)
    (out / "models").mkdir(parents=True, exist_ok=True)
    (out / "data").mkdir(parents=True, exist_ok=True)
    params = {}
    for i, (name, cfg) in enumerate(MODELS.items()):
        gen = torch.Generator().manual_seed(2000 + i)
        params[name] = random_params(cfg, gen, embed_std=0.5)  # tied logits stay O(1)-O(10)
        d = out / "models" / name
        d.mkdir(parents=True, exist_ok=True)
        (d / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
        write_safetensors(d / "model.safetensors", params[name], {"format": "pt"})
    vocab = {cfg.get("text_config", cfg)["vocab_size"] for cfg in MODELS.values()}
    assert len(vocab) == 1
    vocab = vocab.pop()
    data = {}
    for name, spec in DATA.items():
        tokens, mask = make_tokens(spec, vocab)
        write_token_file(out / "data" / f"{name}.tok", tokens, mask, vocab)
        data[name] = pack(tokens, mask)
    for name, case in CASES.items():
        cfg = MODELS[case["model"]]
        opt = dict(DEFAULT_OPT, **case["opt"])
        gemma4.router_min_gap[0] = qwen3_5.router_min_gap[0] = math.inf
        records, states, opt = train(cfg, params[case["model"]], *data[case["data"]], opt)
        # fp32 and float64 routes agree only where no top-k choice is near a tie (the executor's
        # weights differ from these by ~1e-7 after a step)
        gap = min(gemma4.router_min_gap[0], qwen3_5.router_min_gap[0])
        assert gap > 1e-4, f"{name}: a router choice is near a tie ({gap:.2g})"
        meta = {
            "model": f"models/{case['model']}", "data": f"data/{case['data']}.tok", "run_flags": run_flags(opt),
            "steps": str(STEPS), "seq": str(SEQ), "global_batch": str(GLOBAL_BATCH),
            "betas": json.dumps(list(opt["betas"])), "eps": repr(opt["eps"]),
            "weight_decay": repr(opt["weight_decay"]), "no_decay": ",".join(opt["no_decay"]),
            "generator": "scripts/golden/make_step_goldens.py", "torch": torch.__version__,
        }
        for k in ("loss", "lr", "grad_norm", "clip_coef", "targets"):
            meta[k] = json.dumps([r[k] for r in records])
        path = out / f"{name}.safetensors"
        write_safetensors(path, {k: v.to(torch.float32) for k, v in states.items()}, meta)
        print(f"{path}: loss {[round(r['loss'], 6) for r in records]} lr {[r['lr'] for r in records]} "
              f"clip {[round(r['clip_coef'], 4) for r in records]} targets {records[0]['targets']}, "
              f"{path.stat().st_size} bytes")


def compare(new_dir, committed_dir):
    """True when the committed goldens are what generate() made in new_dir: models and token files
    bitwise equal; expected values within one fp32 rounding (the float64 results may differ in the last
    bits across BLAS builds, which moves the fp32 rounding by at most one ulp) plus 1e-12 of the
    tensor's scale; metadata equal, per-step numbers within 1e-12 relative."""
    new, old = Path(new_dir), Path(committed_dir)
    ok = True
    files = sorted(p.relative_to(new) for p in new.rglob("*") if p.is_file())
    old_files = sorted(p.relative_to(old) for p in old.rglob("*") if p.is_file())
    if files != old_files:
        print(f"file lists differ: generated {files}, committed {old_files}")
        return False
    for rel in files:
        a, b = (new / rel).read_bytes(), (old / rel).read_bytes()
        if a == b:
            continue
        if rel.parent != Path(".") or rel.suffix != ".safetensors":
            print(f"{rel}: differs (must be bitwise equal)")
            ok = False
            continue
        ma, ta = read_safetensors(new / rel)
        mb, tb = read_safetensors(old / rel)
        for k in sorted(set(ma) | set(mb)):
            va, vb = ma.get(k), mb.get(k)
            if va == vb:
                continue
            try:
                xa, xb = json.loads(va), json.loads(vb)
                close = len(xa) == len(xb) and all(abs(x - y) <= 1e-12 * max(abs(x), abs(y)) for x, y in zip(xa, xb))
            except (TypeError, ValueError):
                close = False
            if k == "torch" or close:
                continue
            print(f"{rel}: metadata {k}: generated {va}, committed {vb}")
            ok = False
        if set(ta) != set(tb):
            print(f"{rel}: tensor names differ")
            ok = False
            continue
        for k in ta:
            x, y = ta[k], tb[k]
            tol = 2.0 ** -23 * x.abs() + 1e-12 * float(x.abs().max())
            bad = ((x - y).abs() > tol).sum()
            if x.shape != y.shape or bad:
                print(f"{rel}: {k}: {int(bad)} elements beyond one fp32 ulp, max diff {float((x - y).abs().max()):.3g}")
                ok = False
    return ok


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out", nargs="?", default="tests/data/step_golden")
    ap.add_argument("--compare", metavar="COMMITTED", help="after generating, compare OUT with this folder")
    args = ap.parse_args()
    torch.set_num_threads(1)  # deterministic float64 sums
    if args.compare:
        shutil.rmtree(args.out, ignore_errors=True)  # no stale files in the comparison
    generate(args.out)
    if args.compare:
        if not compare(args.out, args.compare):
            sys.exit(1)
        print(f"{args.compare}: every file matches the regenerated one")


if __name__ == "__main__":
    main()
