"""Exact match after light normalisation: the default verifier for plain-text answers."""

from __future__ import annotations

from rlvr_core.tasks.example import Example
from rlvr_core.verifiers.base import VERIFIERS, Verifier, extract_answer


def normalise(text: str) -> str:
    """Collapse whitespace runs to one space, strip, and casefold.

    Deliberately light: "Paris" == "paris" and "1  2" == "1 2", but "4" != "4.0" (use
    math_verify for numeric equivalence). The gold answer goes through extract_answer too, so a
    gold "8." and a prediction "8" agree.
    """
    return " ".join(text.split()).casefold()


@VERIFIERS.register("exact_match")
class ExactMatchVerifier(Verifier):
    """1.0 when the extracted answer equals the gold answer after `normalise`, else 0.0."""

    info_kind = "VERIFIER_KIND_EXACT_MATCH"

    def score(self, completion: str, example: Example) -> float:
        predicted = normalise(extract_answer(completion))
        if not predicted:
            return 0.0
        return 1.0 if predicted == normalise(extract_answer(example.answer)) else 0.0

    def check_example(self, example: Example) -> None:
        if "\n" in example.answer.strip():
            # The prediction is read up to its first newline, so it could never match.
            raise ValueError("exact_match: the answer spans several lines; answers must be one line")
        if not normalise(extract_answer(example.answer)):
            raise ValueError("exact_match: the answer is empty after normalisation")
