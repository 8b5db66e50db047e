"""Answer extraction, the verifier registry, and score_example's dispatch and clamping."""

from __future__ import annotations

import subprocess
import sys

import pytest

from rlvr_core.tasks.example import Example
from rlvr_core.verifiers import (
    Verifier,
    base,
    check_examples,
    extract_answer,
    get_verifier,
    register_verifier,
    score_example,
    verifier_names,
)


@pytest.mark.parametrize(
    "completion, expected",
    [
        (" 42", "42"),
        ("42\nbecause reasons", "42"),
        ("\n\n  42  \n", "42"),
        ("Answer: 42", "42"),
        ("answer:42.", "42"),
        (" 42.", "42"),
        ("42,", "42"),
        ("-3.5", "-3.5"),
        ("yes!", "yes!"),
        ("what?", "what?"),
        ("  a  b ", "a  b"),
        ("", ""),
        ("   \n", ""),
        ("...", ""),
    ],
)
def test_extract_answer(completion, expected):
    assert extract_answer(completion) == expected


def test_extract_answer_tolerates_non_strings():
    assert extract_answer(None) == ""  # type: ignore[arg-type]


def test_builtin_verifiers_are_registered():
    assert verifier_names() == ["exact_match", "math_verify", "reasoning_gym"]
    for name in verifier_names():
        verifier = get_verifier(name)
        assert verifier.name == name
        assert get_verifier(name) is verifier, "verifiers are stateless and shared"


def test_unknown_verifier_lists_known_names():
    with pytest.raises(ValueError, match="unknown verifier 'nope'; known: exact_match, math_verify, reasoning_gym"):
        get_verifier("nope")
    with pytest.raises(ValueError, match="unknown verifier"):
        score_example("1", Example("a", "p", "1", verifier="nope"))


@pytest.fixture
def scratch_registry(monkeypatch):
    """Register test verifiers without leaking them into other tests."""
    monkeypatch.setattr(base, "_REGISTRY", dict(base._REGISTRY))
    monkeypatch.setattr(base, "_INSTANCES", dict(base._INSTANCES))


def test_duplicate_and_invalid_registrations_are_rejected(scratch_registry):
    class Again(Verifier):
        name = "exact_match"

        def score(self, completion, example):
            return 1.0

    with pytest.raises(ValueError, match="already registered"):
        register_verifier(Again)

    class Nameless(Verifier):
        def score(self, completion, example):
            return 1.0

    with pytest.raises(ValueError, match="non-empty class attribute `name`"):
        register_verifier(Nameless)
    with pytest.raises(TypeError):
        register_verifier(object)  # type: ignore[arg-type]
    assert verifier_names() == ["exact_match", "math_verify", "reasoning_gym"]


@pytest.mark.parametrize("raw, clamped", [(2.0, 1.0), (-0.5, 0.0), (float("nan"), 0.0), (0.25, 0.25), (True, 1.0)])
def test_score_example_clamps(scratch_registry, raw, clamped):
    @register_verifier
    class Fixed(Verifier):
        name = "fixed"

        def score(self, completion, example):
            return raw

    assert score_example("x", Example("a", "p", "1", verifier="fixed")) == clamped


def test_score_example_turns_verifier_errors_into_zero(scratch_registry, caplog):
    @register_verifier
    class Broken(Verifier):
        name = "broken"

        def score(self, completion, example):
            raise RuntimeError(f"cannot score {example.answer}")

    @register_verifier
    class NotANumber(Verifier):
        name = "not_a_number"

        def score(self, completion, example):
            return "high"

    caplog.set_level("DEBUG")
    assert score_example("x", Example("a", "p", "SECRET-GOLD", verifier="broken")) == 0.0
    assert score_example("x", Example("a", "p", "1", verifier="not_a_number")) == 0.0
    assert "SECRET-GOLD" not in caplog.text


def test_check_examples_names_the_position_only():
    good = Example("a", "p", "4", verifier="math_verify")
    bad = Example("b", "p", "SECRET line one\nline two", verifier="exact_match")
    check_examples([good])
    with pytest.raises(ValueError) as caught:
        check_examples([good, bad])
    assert str(caught.value).startswith("example 1: exact_match:")
    assert "SECRET" not in str(caught.value)


def test_importing_verifiers_and_tasks_does_not_import_torch_or_heavy_libraries():
    code = (
        "import sys; import rlvr_core.verifiers, rlvr_core.tasks.io, rlvr_core.tasks.prompting; "
        "heavy = [m for m in ('torch', 'reasoning_gym', 'math_verify', 'sympy') if m in sys.modules]; "
        "print(','.join(heavy))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert result.stdout.strip() == ""
