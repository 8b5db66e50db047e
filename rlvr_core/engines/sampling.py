"""Token selection with common random numbers.

Sampling uses inverse-CDF selection over the probabilities sorted from most to least likely,
driven by one uniform number per (prompt, sample, step) drawn up front from a dedicated
generator seeded with params.seed. So the random numbers depend only on
(seed, number of prompts, num_samples, max_new_tokens): never on batching, device, global
RNG state or the model. Two models evaluated with the same seed see the same uniforms, and
because tokens are sorted by probability, a uniform near 0 picks each model's favourite
token: the comparison is paired (common random numbers), which lowers its variance.
"""

from __future__ import annotations

import torch

from rlvr_core.engines.base import SamplingParams


def validate_params(params: SamplingParams, num_samples: int) -> None:
    """Raise ValueError naming the first invalid field."""
    if num_samples < 1:
        raise ValueError(f"num_samples must be >= 1, got {num_samples}")
    if params.max_new_tokens < 1:
        raise ValueError(f"params.max_new_tokens must be >= 1, got {params.max_new_tokens}")
    if not params.temperature >= 0:
        raise ValueError(f"params.temperature must be >= 0 (0 = greedy), got {params.temperature}")
    if not 0 < params.top_p <= 1:
        raise ValueError(f"params.top_p must be in (0, 1], got {params.top_p}")
    if not 0 <= params.seed < 2**63:
        raise ValueError(f"params.seed must be in [0, 2**63), got {params.seed}")


def sampling_uniforms(seed: int, num_prompts: int, num_samples: int, num_steps: int) -> torch.Tensor:
    """Uniforms in [0, 1), shape (num_prompts, num_samples, num_steps), from a generator of its own."""
    generator = torch.Generator(device="cpu").manual_seed(seed)
    return torch.rand((num_prompts, num_samples, num_steps), generator=generator, dtype=torch.float64)


def select_tokens(logits: torch.Tensor, temperature: float, top_p: float, uniforms: torch.Tensor) -> torch.Tensor:
    """Pick one token per row. logits (R, V), uniforms (R,) in [0, 1) -> token ids (R,).

    temperature 0 is greedy (argmax, lowest id on ties). Otherwise softmax(logits / T),
    restricted to the smallest most-likely set whose mass reaches top_p (the top token is
    always kept), and the token where the cumulative mass first reaches u * kept mass.
    """
    if temperature == 0:
        return logits.argmax(dim=-1)
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    sorted_probs, sorted_ids = probs.sort(dim=-1, descending=True, stable=True)
    if top_p < 1:
        mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
        sorted_probs = sorted_probs.masked_fill(mass_before >= top_p, 0.0)
    cdf = sorted_probs.cumsum(dim=-1)
    targets = uniforms.to(device=cdf.device, dtype=cdf.dtype) * cdf[:, -1]
    # First position whose cumulative mass reaches the target; zero-mass tokens are skipped.
    positions = (cdf < targets[:, None]).sum(dim=-1).clamp(max=cdf.shape[-1] - 1)
    return sorted_ids.gather(-1, positions[:, None]).squeeze(-1)
