"""The verifier interface, the answer-extraction rule every verifier shares, and the registry.

A verifier turns (completion, example) into a score in [0, 1]. Verifiers are registered by
name in `VERIFIERS` (protocol.plugins.Registry); an Example names its verifier in
`example.verifier`, and `score_example` dispatches on it.

To add a verifier:
    @VERIFIERS.register("mine")
    class MyVerifier(Verifier): def score(self, completion, example): ...
in a module listed in `_import_builtin_verifiers`, or, for an organization's own verifier outside
this repository, as an entry point: `[project.entry-points."target_feedback.verifiers"]
mine = "pkg.module:MyVerifier"` (loaded on first lookup, registered under the entry point's name).
rlvr_core/verifiers/README.md documents the interface and what a verifier running on the
owner's held-out rows must respect; tests/rlvr_core/verifier_plugin/ is an example package.
"""

from __future__ import annotations

import logging
import math
import re
from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import Any, ClassVar

from protocol.plugins import Registry, subclass_entries
from rlvr_core.tasks.example import Example
from rlvr_core.verifiers.draws import DrawKey

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
    """Scores a completion against an example. Registering a subclass sets its `name`.

    `info_kind` is how an owner's GetInfo declares this verifier when it scores every row: the
    name of a proto VerifierKind value. The built-ins have their own values; any other
    verifier (an organization's plug-in) is VERIFIER_KIND_NAMED, with its registered name in
    GetInfo.verifier_name.
    """

    name: str = ""
    info_kind: str = "VERIFIER_KIND_NAMED"
    noisy: ClassVar[bool] = False
    """True for a verifier whose draws can differ (rlvr_core/verifiers/noisy.py): an owner's test
    split, the final evaluation, must never use one."""

    def __init__(self, options: Any = None):
        self.options = options  # the registered options model's instance (None for a plain verifier)

    @abstractmethod
    def score(self, completion: str, example: Example) -> float:
        """Return a score in [0, 1] for `completion` (the raw generated text) on `example`."""

    def score_draws(self, completion: str, example: Example, key: DrawKey, draws: int) -> tuple[float, ...]:
        """`draws` independent scores of one response (the several-scores interface, issue 19).

        `key` names the response: (seed, row key, sample index); draw d's randomness may depend
        only on (key, d) (rlvr_core.engines.row_seeds.draw_seed). The default adapter serves
        every verifier that returns one score: it is deterministic, so each draw is that score.
        """
        return (self.score(completion, example),) * draws

    def check_example(self, example: Example) -> None:
        """Raise ValueError when this verifier can never score `example` (a data error).

        Called when data is loaded, so a broken row fails loudly at the edge instead of
        silently scoring 0 at evaluation time. The default accepts everything.
        """


def _import_builtin_verifiers() -> None:
    # On first lookup, not at import: the modules import this one (no cycles). Their heavy
    # libraries (math-verify/sympy, reasoning-gym) load only when a verifier first scores.
    import rlvr_core.verifiers.exact_match  # registers "exact_match"
    import rlvr_core.verifiers.math_verify  # registers "math_verify"
    import rlvr_core.verifiers.noisy  # registers "noisy_flip", "stochastic_grader", "partial_checks"
    import rlvr_core.verifiers.reasoning_gym  # registers "reasoning_gym"
    import rlvr_core.verifiers.rubric  # noqa: F401  (registers "rubric" (exact) and "rubric_grader" (noisy))


VERIFIERS: Registry[type[Verifier]] = Registry(
    "verifiers", _import_builtin_verifiers, noun="verifier", on_add=subclass_entries(Verifier, "verifier")
)
# One shared instance per registered class (verifiers are stateless).
_INSTANCES: dict[type[Verifier], Verifier] = {}


def make_verifier(spec: str | Mapping[str, Any]) -> Verifier:
    """A verifier built from a spec: a registered name, or a table `{ name = "noisy_flip",
    flip_rate = 0.2 }` whose other keys are typed by the verifier's registered options model.
    Raises pydantic.ValidationError located at the bad option (`flip_rate`, `name`, ...)."""
    from rlvr_core.configuration import field_error, validate_options

    raw: dict[str, Any] = {"name": spec} if isinstance(spec, str) else dict(spec)
    name = raw.get("name")
    if not isinstance(name, str) or name not in VERIFIERS:
        raise field_error("VerifierSpec", ("name",), "unknown_entry",
                          f"unknown verifier {name!r}; known: {', '.join(verifier_names())}", name)
    cls = VERIFIERS.get(name)
    model = VERIFIERS.options_model(name)
    if model is None:
        extra = sorted(k for k in raw if k != "name")
        if extra:
            raise field_error("VerifierSpec", (extra[0],), "unknown_option",
                              f"verifier {name!r} takes no options", raw[extra[0]])
        return get_verifier(name)
    return cls(validate_options(model, raw, part=f"verifier {name!r}"))


def verifier_names() -> list[str]:
    """Names of all registered verifiers (built-in and plug-in), sorted."""
    return VERIFIERS.names()


def get_verifier(name: str) -> Verifier:
    """The (shared, stateless) verifier registered under `name`; ValueError listing known names."""
    cls = VERIFIERS.get(name)
    instance = _INSTANCES.get(cls)
    if instance is None:
        model = VERIFIERS.options_model(name)  # a verifier with options gets their defaults
        instance = _INSTANCES[cls] = cls() if model is None else cls(model(name=name))
    return instance


def score_example(completion: str, example: Example) -> float:
    """Score `completion` with the verifier `example.verifier` names, clamped to [0, 1].

    Model output is arbitrary, so any exception raised while scoring gives 0.0 (and a debug log
    naming only the exception type: its message could quote held-out content), SystemExit
    from a plug-in included: on the owner a failure must never depend on which rows were drawn.
    An unknown verifier name is a data error, not a model error, and raises ValueError.
    """
    verifier = get_verifier(example.verifier)
    try:
        value = float(verifier.score(completion, example))
    except KeyboardInterrupt:
        raise
    except BaseException as error:  # noqa: BLE001 - arbitrary model output (and a plug-in's SystemExit) scores 0
        logger.debug("verifier %s raised %s; scored 0", verifier.name, type(error).__name__)
        return 0.0
    return clamp_score(value)


def clamp_score(value: float) -> float:
    """Clamp to [0, 1]; NaN becomes 0."""
    if math.isnan(value):
        return 0.0
    return min(1.0, max(0.0, value))


def score_draws_safely(verifier: Verifier, completion: str, example: Example, key: DrawKey,
                       draws: int) -> tuple[float, ...]:
    """`verifier.score_draws`, each clamped to [0, 1]; any failure scores every draw 0 (the rule
    of `score_example`), a wrong count of draws too."""
    try:
        values = tuple(clamp_score(float(v)) for v in verifier.score_draws(completion, example, key, draws))
    except KeyboardInterrupt:
        raise
    except BaseException as error:  # noqa: BLE001 - arbitrary model output scores 0
        logger.debug("verifier %s raised %s; scored 0", verifier.name, type(error).__name__)
        return (0.0,) * draws
    return values if len(values) == draws else (0.0,) * draws


def check_examples(examples: list[Example]) -> None:
    """Raise ValueError naming the first row (by position) whose verifier cannot score it."""
    for position, example in enumerate(examples):
        try:
            get_verifier(example.verifier).check_example(example)
        except ValueError as error:
            raise ValueError(f"example {position}: {error}") from None
