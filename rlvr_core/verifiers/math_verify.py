"""Mathematical equivalence via the math-verify library ("4" == "4.0" == "$\\frac{8}{2}$").

Time limits. math-verify's own timeouts use signal.alarm, which only works on the main thread
(elsewhere it raises). So:
  * on the main thread, the library's timeouts are used (MAIN_THREAD_TIMEOUT_S per step);
  * off the main thread they are disabled (parsing_timeout=None, timeout_seconds=None) and time
    is bounded by what we let in instead: the extracted answer is capped at MAX_ANSWER_CHARS
    characters, and the parsed expressions must pass `_is_cheap` (at most MAX_NODES nodes, no
    numeric exponent towers such as 9^9^9^9, no exponent beyond MAX_EXPONENT, no factorial of
    an argument beyond MAX_FACTORIAL_ARG). Those are the inputs that made sympy run for minutes
    in our tests; a short parsed expression without them compares in milliseconds.
The cap and the check apply on every thread, so a score never depends on which thread ran it.

Privacy: math-verify logs the offending text when parsing times out. Its loggers are raised to
ERROR here so held-out answers and generations never reach a log.
"""

from __future__ import annotations

import functools
import logging
import threading
from typing import Any

from rlvr_core.tasks.example import Example
from rlvr_core.verifiers.base import VERIFIERS, Verifier, extract_answer

MAX_ANSWER_CHARS = 256
MAX_NODES = 200
MAX_EXPONENT = 1000
MAX_FACTORIAL_ARG = 1000
MAIN_THREAD_TIMEOUT_S = 5

logging.getLogger("math_verify").setLevel(logging.ERROR)


def _timeout_s() -> int | None:
    """The library timeout usable on this thread (None where signal.alarm is unavailable)."""
    return MAIN_THREAD_TIMEOUT_S if threading.current_thread() is threading.main_thread() else None


def _parse(text: str) -> list[Any]:
    from math_verify import parse
    from math_verify.errors import TimeoutException

    try:
        return parse(text, parsing_timeout=_timeout_s())
    except TimeoutException:  # a BaseException subclass: not caught by `except Exception`
        return []


@functools.lru_cache(maxsize=4096)
def _parse_gold(answer: str) -> tuple[Any, ...]:
    """Gold answers repeat across samples of one prompt; parse each once (results are immutable)."""
    if len(answer) > MAX_ANSWER_CHARS:
        return ()
    parsed = _parse(answer)
    return tuple(parsed) if _is_cheap(parsed) else ()


def _is_cheap(parsed: list[Any] | tuple[Any, ...]) -> bool:
    """True when every parsed expression is small and free of pathological powers/factorials."""
    from sympy import Basic, Pow, factorial, preorder_traversal
    from sympy.matrices import MatrixBase

    for item in parsed:
        if isinstance(item, str):
            continue
        elements = list(item) if isinstance(item, MatrixBase) else [item]
        nodes = 0
        for element in elements:
            if not isinstance(element, Basic):
                continue
            for node in preorder_traversal(element):
                nodes += 1
                if nodes > MAX_NODES:
                    return False
                if isinstance(node, Pow) and not _bounded_number(node.exp, MAX_EXPONENT, symbolic_ok=True):
                    return False
                if isinstance(node, factorial) and not _bounded_number(node.args[0], MAX_FACTORIAL_ARG):
                    return False
    return True


def _bounded_number(expr: Any, limit: int, symbolic_ok: bool = False) -> bool:
    """`expr` is a number with |expr| <= limit, or (if symbolic_ok) contains a free symbol.

    A symbol-free non-number (e.g. the unevaluated 9**9 in 9**(9**9)) is rejected: evaluating
    it is exactly what never finishes.
    """
    if expr.is_Number:
        return bool(abs(expr) <= limit)
    return symbolic_ok and bool(expr.free_symbols)


@VERIFIERS.register("math_verify")
class MathVerifyVerifier(Verifier):
    """1.0 when math-verify finds the extracted answer equivalent to the gold answer, else 0.0."""

    info_kind = "VERIFIER_KIND_MATH_VERIFY"

    def score(self, completion: str, example: Example) -> float:
        from math_verify import verify
        from math_verify.errors import TimeoutException

        predicted_text = extract_answer(completion)
        if not predicted_text or len(predicted_text) > MAX_ANSWER_CHARS:
            return 0.0
        gold = _parse_gold(example.answer.strip())
        if not gold:
            return 0.0
        predicted = _parse(predicted_text)
        if not predicted or not _is_cheap(predicted):
            return 0.0
        try:
            # Gold first: verify() is asymmetric (assignments and intervals are read from gold).
            return 1.0 if verify(list(gold), predicted, timeout_seconds=_timeout_s()) else 0.0
        except TimeoutException:
            return 0.0

    def check_example(self, example: Example) -> None:
        if len(example.answer.strip()) > MAX_ANSWER_CHARS:
            raise ValueError(f"math_verify: the answer is longer than {MAX_ANSWER_CHARS} characters")
        if not _parse_gold(example.answer.strip()):
            raise ValueError(
                "math_verify: the answer could not be parsed as math (or is too complex to compare "
                "safely); use exact_match for non-mathematical answers"
            )
