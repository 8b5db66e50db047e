"""The local update geometry SetGRPO reads (seed 002, module b): per-response policy-gradient
features, restricted to the LM head and computed in one batched no-grad forward pass.

For a response y with completion tokens t (predicted from hidden state h_{t-1}), the gradient of
its mean token log-probability with respect to the output projection W (V x H) is

    g(y) = 1/(L T_s) sum_t (onehot(y_t) - p_t) h_{t-1}^T        (p_t = softmax(W h_{t-1} / T_s))

so <g(y), g(y')> is the inner product of the two responses' head updates, and a group's Gram
matrix G = F F^T gives <u(a), u(c)> = a^T G c for the group updates u(a) = sum_k a_k g(y_k).
Our choices (docs/SETGRPO.md): the head only (cheap, and the layer every response's update
passes through); the mean over tokens (the seq-mean geometry); above `max_dim` = V*H entries,
a seeded Gaussian sketch of each side (r_v x r_h, unbiased for inner products) replaces the
exact V x H features, so the cost stays O(B T (V r_v + H r_h)) for a large vocabulary.
"""

from __future__ import annotations

import math

import torch

from trainer_node.grpo.batch import PolicyBatch

DEFAULT_MAX_DIM = 1 << 16
SKETCH_SIDE = 64


def head_features(model: torch.nn.Module, batch: PolicyBatch, temperature: float = 1.0,
                  max_dim: int = DEFAULT_MAX_DIM, sketch_seed: int = 0) -> torch.Tensor:
    """(B, D) float64 features, one row per response (0 for an empty completion)."""
    head = model.get_output_embeddings()
    if head is None:
        raise ValueError("SetGRPO's geometry needs a model with an output projection (get_output_embeddings())")
    captured: dict[str, torch.Tensor] = {}

    def hook(_module: torch.nn.Module, args: tuple[torch.Tensor, ...], output: torch.Tensor) -> None:
        captured["hidden"], captured["logits"] = args[0], output

    handle = head.register_forward_hook(hook)
    try:
        with torch.no_grad():
            model(input_ids=batch.input_ids, attention_mask=batch.attention_mask)
    finally:
        handle.remove()
    hidden = captured["hidden"][:, :-1].to(torch.float64)               # (B, T-1, H): h_{t-1}
    probs = torch.softmax(captured["logits"][:, :-1].to(torch.float64) / temperature, dim=-1)  # (B, T-1, V)
    targets = batch.input_ids[:, 1:]
    mask = batch.completion_mask[:, 1:].to(torch.float64)
    residual = -probs
    residual.scatter_add_(-1, targets.unsqueeze(-1), torch.ones_like(targets, dtype=torch.float64).unsqueeze(-1))
    scale = mask / (mask.sum(dim=1, keepdim=True).clamp(min=1.0) * temperature)   # (B, T-1)
    vocab, width = residual.shape[-1], hidden.shape[-1]
    if vocab * width > max_dim:
        gen = torch.Generator().manual_seed(sketch_seed)
        side_v = torch.randn(vocab, SKETCH_SIDE, generator=gen, dtype=torch.float64) / math.sqrt(SKETCH_SIDE)
        side_h = torch.randn(width, SKETCH_SIDE, generator=gen, dtype=torch.float64) / math.sqrt(SKETCH_SIDE)
        residual, hidden = residual @ side_v.to(residual.device), hidden @ side_h.to(hidden.device)
    features = torch.einsum("btv,bth->bvh", residual * scale.unsqueeze(-1), hidden)
    return features.reshape(features.shape[0], -1)
