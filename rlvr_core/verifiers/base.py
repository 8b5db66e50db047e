"""The verifier interface, the answer-extraction rule every verifier shares, and the registry.

A verifier turns (completion, example) into a score in [0, 1]. Verifiers are registered by
name; an Example names its verifier in `example.verifier`, and `score_example` dispatches on it.
"""

from __future__ import annotations

import logging
import math
import re
from abc import ABC, abstractmethod
from typing import TypeVar

from rlvr_core.tasks.example import Example

logger = logging.getLogger(__name__)

_ANSWER_ECHO = re.compile(r"^answer\s*:", re.IGNORECASE)
# Sentence punctuation a model may put after a short answer ("8."); "?" and "!" are kept
# because some answers legitimately end with them.
_TRAILING_PUNCTUATION = ".,;:"


def extract_answer(completion: str) -> str:
    """The model's answer inside a completion.

    The prompt ends with "Answer:" and the model is expected to answer directly, so the rule is:
      1. leading whitespace (including newlines) is dropped;
      2. an echoed "Answer:" prefix (any case) is dropped, once;
      3. the answer is the text up to the first newline, with surrounding whitespace stripped;
      4. trailing ".", ",", ";" and ":" are stripped (a model writing "8." means 8).
    Anything after the first newline is ignored, so rambling after the answer costs nothing
    and cannot earn anything either.
    """
    if not isinstance(completion, str):
        return ""
    text = completion.lstrip()
    echo = _ANSWER_ECHO.match(text)
    if echo:
        text = text[echo.end() :].lstrip(" \t")
    first_line = text.split("\n", 1)[0].strip()
    return first_line.rstrip(_TRAILING_PUNCTUATION).rstrip()


class Verifier(ABC):
    """Scores a completion against an example. Subclasses set `name` and register themselves."""

    name: str = ""

    @abstractmethod
    def score(self, completion: str, example: Example) -> float:
        """Return a score in [0, 1] for `completion` (the raw generated text) on `example`."""

    def check_example(self, example: Example) -> None:
        """Raise ValueError when this verifier can never score `example` (a data error).

        Called when data is loaded, so a broken row fails loudly at the edge instead of
        silently scoring 0 at evaluation time. The default accepts everything.
        """


VerifierT = TypeVar("VerifierT", bound=type[Verifier])
_REGISTRY: dict[str, type[Verifier]] = {}
_INSTANCES: dict[str, Verifier] = {}


def register_verifier(cls: VerifierT) -> VerifierT:
    """Class decorator: make `cls` available under `cls.name`.

    To add a verifier: subclass Verifier in a module under rlvr_core/verifiers/, set `name`,
    decorate it, and import the module in rlvr_core/verifiers/__init__.py.
    """
    if not (isinstance(cls, type) and issubclass(cls, Verifier)):
        raise TypeError(f"register_verifier expects a Verifier subclass, got {cls!r}")
    name = cls.name
    if not isinstance(name, str) or not name:
        raise ValueError(f"{cls.__name__} must set a non-empty class attribute `name`")
    if name in _REGISTRY:
        raise ValueError(f"verifier {name!r} is already registered (by {_REGISTRY[name].__name__})")
    _REGISTRY[name] = cls
    return cls


def verifier_names() -> list[str]:
    """Names of all registered verifiers, sorted."""
    return sorted(_REGISTRY)


def get_verifier(name: str) -> Verifier:
    """The (shared, stateless) verifier registered under `name`; ValueError listing known names."""
    if name not in _REGISTRY:
        raise ValueError(f"unknown verifier {name!r}; known: {', '.join(verifier_names())}")
    instance = _INSTANCES.get(name)
    if instance is None or type(instance) is not _REGISTRY[name]:
        instance = _REGISTRY[name]()
        _INSTANCES[name] = instance
    return instance


def score_example(completion: str, example: Example) -> float:
    """Score `completion` with the verifier `example.verifier` names, clamped to [0, 1].

    Model output is arbitrary, so any exception raised while scoring gives 0.0 (and a debug log
    naming only the exception type: its message could quote held-out content). An unknown
    verifier name is a data error, not a model error, and raises ValueError.
    """
    verifier = get_verifier(example.verifier)
    try:
        value = float(verifier.score(completion, example))
    except Exception as error:  # noqa: BLE001 - arbitrary model output must never crash scoring
        logger.debug("verifier %s raised %s; scored 0", verifier.name, type(error).__name__)
        return 0.0
    return clamp_score(value)


def clamp_score(value: float) -> float:
    """Clamp to [0, 1]; NaN becomes 0."""
    if math.isnan(value):
        return 0.0
    return min(1.0, max(0.0, value))


def check_examples(examples: list[Example]) -> None:
    """Raise ValueError naming the first row (by position) whose verifier cannot score it."""
    for position, example in enumerate(examples):
        try:
            get_verifier(example.verifier).check_example(example)
        except ValueError as error:
            raise ValueError(f"example {position}: {error}") from None
