"""Which response a grader draw belongs to: the key of the several-scores interface.

A noisy verifier (rlvr_core/verifiers/noisy.py) may return different scores for the same
response; its randomness must follow the per-row rule of docs/PRIVACY.md: draw d of sample k of
row r under request seed s depends only on (s, r, k, d). `DrawKey` carries (s, r, k); `draw_rng`
turns it and d into the draw's own generator (rlvr_core.engines.row_seeds.draw_seed). No torch.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rlvr_core.engines.row_seeds import draw_seed, row_key


@dataclass(frozen=True)
class DrawKey:
    """One response: the request seed, its row's key and its sample index within the row."""

    seed: int
    row: int
    sample: int

    @classmethod
    def of(cls, seed: int, example_id: str, sample: int) -> DrawKey:
        return cls(seed=int(seed), row=row_key(example_id), sample=int(sample))


def draw_rng(key: DrawKey, draw: int) -> np.random.Generator:
    """The generator of draw `draw` of the response `key` (independent across draws)."""
    return np.random.default_rng(draw_seed(key.seed, key.row, key.sample, draw))
