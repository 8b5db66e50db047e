"""Verifiers: score a completion against an Example, by name.

Importing this package registers the built-in verifiers (exact_match, math_verify,
reasoning_gym). Their heavy libraries (math-verify/sympy, reasoning-gym) load on first use,
and nothing here imports torch.
"""

from rlvr_core.verifiers import exact_match as _exact_match  # noqa: F401  (registers)
from rlvr_core.verifiers import math_verify as _math_verify  # noqa: F401  (registers)
from rlvr_core.verifiers import reasoning_gym as _reasoning_gym  # noqa: F401  (registers)
from rlvr_core.verifiers.base import (
    Verifier,
    check_examples,
    clamp_score,
    extract_answer,
    get_verifier,
    register_verifier,
    score_example,
    verifier_names,
)

__all__ = [
    "Verifier",
    "check_examples",
    "clamp_score",
    "extract_answer",
    "get_verifier",
    "register_verifier",
    "score_example",
    "verifier_names",
]
