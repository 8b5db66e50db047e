"""ACME's verifiers: an example of an organization's own verifier package.

A verifier subclasses rlvr_core.verifiers.Verifier and implements `score(completion, example)`
-> a float in [0, 1]; `check_example(example)` may refuse rows it can never score (called when
data is loaded). The entry point's name is the verifier's registered name; the class does not
register itself (this module never imports the registry's `register`).
"""

from __future__ import annotations

import re

from rlvr_core.verifiers import Verifier

_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


class LastNumberVerifier(Verifier):
    """1.0 when the last number in the completion equals the answer (a number), else 0.0.

    Reads the whole completion (a chain of thought may precede the result), unlike exact_match,
    which reads the first line."""

    def score(self, completion: str, example) -> float:
        numbers = _NUMBER.findall(completion)
        if not numbers:
            return 0.0
        return 1.0 if float(numbers[-1]) == float(example.answer) else 0.0

    def check_example(self, example) -> None:
        if not _NUMBER.fullmatch(example.answer.strip()):
            raise ValueError("acme_last_number: the answer must be a number")


class FragileVerifier(Verifier):
    """A buggy verifier: raises on every completion, with the held-out answer in its message.

    It stands for any plug-in bug. On the owner, scoring confines it to the row (score 0) and
    nothing it raises, its text included, leaves the node (rlvr_core/scoring.py)."""

    def score(self, completion: str, example) -> float:
        if "exit" in completion:
            raise SystemExit(f"giving up on {example.answer}")
        raise RuntimeError(f"cannot compare with the answer {example.answer}")
