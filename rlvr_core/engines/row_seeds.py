"""Per-row seeds: how a row's random stream is named, without torch (the owner's server
process imports this to check requests and compute keys before charging).

A row's randomness depends only on (request seed, row key, sample index): `row_seed` hashes
(seed, key) into the seed of the row's own generator (TransformersEngine) or request (vLLM).
`row_key` is the one way to turn an example id into a key. Re-exported by `sampling.py`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

# Seeds and row keys are non-negative 63-bit integers (they fit a signed int64 everywhere).
MAX_SEED = 2**63
MAX_ROW_KEY = 2**63


def _hash63(text: str) -> int:
    digest = hashlib.sha256(text.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") >> 1  # non-negative, < 2**63


def row_key(text_id: str) -> int:
    """The row key of an example id (sha256-based, 63 bits)."""
    if not isinstance(text_id, str):
        raise TypeError(f"row_key takes an id string, got {type(text_id).__name__}")
    return _hash63("row-key:" + text_id)


def row_seed(seed: int, key: int) -> int:
    """The seed of one row's random stream: a hash of (request seed, row key), 63 bits."""
    return _hash63(f"{seed}:{key}")


def draw_seed(seed: int, key: int, sample: int, draw: int) -> int:
    """The seed of one grader draw: a hash of (request seed, row key, sample index, draw index),
    63 bits. A noisy verifier's randomness (rlvr_core/verifiers/noisy.py) comes only from here,
    so a replay scores the same and a row's scores never depend on which other rows are scored."""
    return _hash63(f"draw:{seed}:{key}:{sample}:{draw}")


def resolve_row_keys(row_keys: Sequence[int] | None, num_prompts: int) -> list[int]:
    """The keys to use: `row_keys` checked, or positional keys 0..n-1 when None.

    Raises ValueError naming `row_keys` (length, type or range); never quotes a prompt.
    """
    if row_keys is None:
        return list(range(num_prompts))
    keys = list(row_keys)
    if len(keys) != num_prompts:
        raise ValueError(f"row_keys has {len(keys)} entries for {num_prompts} prompts; pass one key per prompt")
    for index, key in enumerate(keys):
        if isinstance(key, bool) or not isinstance(key, int) or not 0 <= key < MAX_ROW_KEY:
            raise ValueError(f"row_keys[{index}] must be an int in [0, 2**63) (see row_seeds.row_key)")
    return keys
