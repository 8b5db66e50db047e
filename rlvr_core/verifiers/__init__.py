"""Verifiers: score a completion against an Example, by name.

The registry (`VERIFIERS`, base.py) imports the built-in verifiers (exact_match, math_verify,
reasoning_gym) and any `target_feedback.verifiers` entry-point plug-ins on first lookup. Their
heavy libraries (math-verify/sympy, reasoning-gym) load on first use, and nothing here imports
torch.
"""

from rlvr_core.verifiers.base import (
    VERIFIERS,
    Verifier,
    check_examples,
    clamp_score,
    extract_answer,
    get_verifier,
    score_example,
    verifier_names,
)

__all__ = [
    "VERIFIERS",
    "Verifier",
    "check_examples",
    "clamp_score",
    "extract_answer",
    "get_verifier",
    "score_example",
    "verifier_names",
]
