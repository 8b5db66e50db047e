"""Per-row seeds: row_key, row_seed, row_uniforms (a row's randomness depends on nothing else)."""

from __future__ import annotations

import hashlib
import subprocess
import sys

import pytest
import torch

from rlvr_core.engines.row_seeds import MAX_ROW_KEY, MAX_SEED, resolve_row_keys, row_key, row_seed
from rlvr_core.engines.sampling import row_uniforms


def test_row_key_is_pinned_and_63_bits() -> None:
    """Pinned: the owner's scores depend on it, so a change must be deliberate."""
    assert row_key("abc") == 8033637060916979726
    keys = {row_key(f"id-{i}") for i in range(1000)}
    assert len(keys) == 1000 and all(0 <= key < MAX_ROW_KEY for key in keys)
    with pytest.raises(TypeError, match="id string"):
        row_key(17)  # type: ignore[arg-type]


def test_row_seed_is_the_legacy_vllm_request_seed() -> None:
    for seed, key in [(0, 0), (7, 3), (MAX_SEED - 1, MAX_ROW_KEY - 1)]:
        legacy = int.from_bytes(hashlib.sha256(f"{seed}:{key}".encode()).digest()[:8], "big") >> 1
        assert row_seed(seed, key) == legacy
    assert row_seed(1, 2) != row_seed(2, 1)


def test_row_uniforms_depend_only_on_seed_and_key() -> None:
    torch.manual_seed(123)  # global RNG state is irrelevant
    first = row_uniforms(5, 42, 3, 7)
    torch.rand(10)
    assert first.shape == (3, 7) and first.dtype == torch.float64
    assert torch.equal(first, row_uniforms(5, 42, 3, 7))
    assert not torch.equal(first, row_uniforms(5, 43, 3, 7))
    assert not torch.equal(first, row_uniforms(6, 42, 3, 7))
    assert ((first >= 0) & (first < 1)).all()


def test_positional_keys_and_validation() -> None:
    assert resolve_row_keys(None, 3) == [0, 1, 2]
    assert resolve_row_keys((4, 5), 2) == [4, 5]
    with pytest.raises(ValueError, match=r"row_keys has 1 entries for 2"):
        resolve_row_keys([1], 2)
    with pytest.raises(ValueError, match=r"row_keys\[1\]"):
        resolve_row_keys([1, 1.5], 2)  # type: ignore[list-item]


def test_seed_helpers_and_scorer_import_without_torch() -> None:
    """The owner's server process checks requests with them and never loads torch."""
    code = (
        "import sys, rlvr_core.engines.row_seeds, rlvr_core.scoring, rlvr_core.engines.base;"
        "assert 'torch' not in sys.modules and 'transformers' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
