"""Token selection with common random numbers, drawn per row.

Sampling uses inverse-CDF selection over the probabilities sorted from most to least likely,
driven by one uniform number per (row, sample, step). Row r's uniforms, shape
(num_samples, max_new_tokens), come from a generator of its own seeded by
`row_seed(params.seed, row_keys[r])`, so they depend only on (seed, row key, sample index)
and the public shape of the request: never on how many other prompts were passed, their
order, batching, device, global RNG state or the model. Why per row: the owner evaluates a
secret subsample, and with a single positional stream adding one held-out row would shift
every later row's randomness (issue 11, hole 2): one row could move many scores.

Two models evaluated with the same seed see the same uniforms, and because tokens are
sorted by probability, a uniform near 0 picks each model's favourite token: the comparison
is paired (common random numbers), which lowers its variance.
"""

from __future__ import annotations

import torch

from rlvr_core.engines.base import SamplingParams
from rlvr_core.engines.row_seeds import MAX_ROW_KEY, MAX_SEED, resolve_row_keys, row_key, row_seed

__all__ = [
    "MAX_ROW_KEY",
    "MAX_SEED",
    "resolve_row_keys",
    "row_key",
    "row_seed",
    "row_uniforms",
    "select_tokens",
    "validate_params",
]


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
    if not 0 <= params.seed < MAX_SEED:
        raise ValueError(f"params.seed must be in [0, 2**63), got {params.seed}")


def row_uniforms(seed: int, key: int, num_samples: int, num_steps: int) -> torch.Tensor:
    """Uniforms in [0, 1) for one row, shape (num_samples, num_steps); row s is sample s."""
    generator = torch.Generator(device="cpu").manual_seed(row_seed(seed, key))
    return torch.rand((num_samples, num_steps), generator=generator, dtype=torch.float64)


def select_tokens(logits: torch.Tensor, temperature: float, top_p: float, uniforms: torch.Tensor) -> torch.Tensor:
    """Pick one token per row. logits (R, V), uniforms (R,) in [0, 1) -> token ids (R,).

    temperature 0 is greedy (argmax, lowest id on ties). Otherwise softmax(logits / T),
    restricted to the smallest most-likely set whose mass reaches top_p (the top token is
    always kept), and the token where the cumulative mass first reaches u * kept mass.
    Every operation is row-wise, so a row's pick never depends on the other rows.
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
