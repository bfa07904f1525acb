"""The MoE router's load-balancing loss for the golden generators (gemma4.py and qwen3_5.py record
their routers here while a forward runs).

transformers' load_balancing_loss_func (qwen3_5_moe modeling; shared/reference/model-families.md
section 3.4 item 8) concatenates every MoE layer's router rows and computes, over those R rows,
    tokens_per_expert = mean over rows of one_hot(top-k experts)      (K, E)
    router_prob       = mean over rows of softmax(router logits)      (E)
    aux = E * sum(tokens_per_expert * router_prob)
SlideDP pools the rows of each sequence separately (every MoE layer, its T tokens) and averages the
sequences' aux, so that the objective does not depend on how a plan splits the step into
micro-batches (docs/TRANSFORMER_MATH.md); with one sequence per forward it is the reference's number.
The top-k choice is not differentiated (one_hot of indices), as in the reference.
"""
import torch
import torch.nn.functional as F

# (probs (B, T, E), idx (B, T, K)) of each MoE layer of the forward being run, in layer order.
ROUTERS = []


def record(probs, idx):
    ROUTERS.append((probs, idx))


def take_loss(num_experts):
    """Mean over the batch's sequences of aux, from the routers recorded since the last call (then
    forgotten); 0 for a dense model."""
    if not ROUTERS:
        return 0.0
    probs = torch.cat([p for p, _ in ROUTERS], dim=1)  # (B, layers * T, E)
    idx = torch.cat([i for _, i in ROUTERS], dim=1)    # (B, layers * T, K)
    ROUTERS.clear()
    total = 0.0
    for b in range(probs.shape[0]):
        tokens_per_expert = F.one_hot(idx[b], num_experts).to(probs.dtype).mean(dim=0)  # (K, E)
        router_prob = probs[b].mean(dim=0)                                               # (E)
        total = total + num_experts * (tokens_per_expert * router_prob.unsqueeze(0)).sum()
    return total / probs.shape[0]
