"""Answer extraction, the verifier registry (built-ins and entry-point plug-ins), and
score_example's dispatch and clamping."""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys
import textwrap

import pytest

from rlvr_core.tasks.example import Example
from rlvr_core.tasks.io import read_examples, write_examples
from rlvr_core.verifiers import (
    VERIFIERS,
    Verifier,
    base,
    check_examples,
    extract_answer,
    get_verifier,
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


BUILTIN = ["exact_match", "math_verify", "noisy_flip", "partial_checks", "reasoning_gym", "rubric", "rubric_grader",
           "stochastic_grader"]


def test_builtin_verifiers_are_registered():
    assert verifier_names() == BUILTIN
    for name in verifier_names():
        verifier = get_verifier(name)
        assert verifier.name == name
        assert get_verifier(name) is verifier, "verifiers are stateless and shared"


def test_unknown_verifier_lists_known_names():
    with pytest.raises(ValueError, match="unknown verifier 'nope'; known: exact_match, math_verify, noisy_flip, "
                       "partial_checks, reasoning_gym, rubric, rubric_grader, stochastic_grader"):
        get_verifier("nope")
    with pytest.raises(ValueError, match="unknown verifier"):
        score_example("1", Example("a", "p", "1", verifier="nope"))


@pytest.fixture
def scratch_registry(monkeypatch):
    """Register test verifiers in a copy of the registry, so none leaks into other tests."""
    scratch = VERIFIERS.copy()
    monkeypatch.setattr(base, "VERIFIERS", scratch)
    return scratch


def test_duplicate_and_invalid_registrations_are_rejected(scratch_registry):
    class Again(Verifier):
        def score(self, completion, example):
            return 1.0

    with pytest.raises(ValueError, match="verifier 'exact_match' is already registered"):
        scratch_registry.register("exact_match")(Again)

    class Misnamed(Verifier):
        name = "something_else"

        def score(self, completion, example):
            return 1.0

    with pytest.raises(ValueError, match="declares name 'something_else' but is registered as 'mine'"):
        scratch_registry.register("mine")(Misnamed)
    with pytest.raises(TypeError, match="not a subclass of Verifier"):
        scratch_registry.register("object")(object)
    assert verifier_names() == BUILTIN


@pytest.fixture
def acme_plugin(tmp_path, monkeypatch, scratch_registry):
    """An organization's own verifier, installed nowhere: a module on sys.path and a faked
    entry point, exactly what `pip install acme-verifiers` would provide."""
    (tmp_path / "acme_verifiers.py").write_text(textwrap.dedent('''
        from rlvr_core.verifiers import Verifier, extract_answer

        class DigitSumVerifier(Verifier):
            """1.0 when the answer is the sum of the gold answer's digits."""

            def score(self, completion, example):
                digits = [int(c) for c in example.answer if c.isdigit()]
                return 1.0 if extract_answer(completion) == str(sum(digits)) else 0.0

            def check_example(self, example):
                if not any(c.isdigit() for c in example.answer):
                    raise ValueError("acme_digit_sum: the gold answer has no digits")
    '''))
    monkeypatch.syspath_prepend(str(tmp_path))
    point = importlib.metadata.EntryPoint(
        name="acme_digit_sum", value="acme_verifiers:DigitSumVerifier", group="target_feedback.verifiers"
    )
    monkeypatch.setattr(
        importlib.metadata, "entry_points", lambda group: [point] if group == point.group else []
    )
    yield
    sys.modules.pop("acme_verifiers", None)


def test_a_third_party_verifier_arrives_through_its_entry_point(acme_plugin, tmp_path):
    assert verifier_names() == ["acme_digit_sum", *BUILTIN]
    verifier = get_verifier("acme_digit_sum")
    assert verifier.name == "acme_digit_sum" and type(verifier).__module__ == "acme_verifiers"
    assert "entry point acme_verifiers:DigitSumVerifier" in base.VERIFIERS.entry("acme_digit_sum").source
    row = Example("a", "p", "123", verifier="acme_digit_sum")
    assert score_example("Answer: 6", row) == 1.0 and score_example("7", row) == 0.0
    # The data edge accepts rows naming it, and its own check runs there.
    write_examples(tmp_path / "rows.jsonl", [row])
    assert read_examples(tmp_path / "rows.jsonl")[0].verifier == "acme_digit_sum"
    with pytest.raises(ValueError, match="example 0: acme_digit_sum: the gold answer has no digits"):
        check_examples([Example("b", "p", "none", verifier="acme_digit_sum")])


def test_a_broken_verifier_plugin_names_itself(scratch_registry, monkeypatch):
    point = importlib.metadata.EntryPoint(
        name="broken", value="no_such_module_xyz:Verifier", group="target_feedback.verifiers"
    )
    monkeypatch.setattr(importlib.metadata, "entry_points", lambda group: [point])
    with pytest.raises(ImportError, match="verifier plug-in 'broken' .no_such_module_xyz:Verifier"):
        get_verifier("exact_match")


@pytest.mark.parametrize("raw, clamped", [(2.0, 1.0), (-0.5, 0.0), (float("nan"), 0.0), (0.25, 0.25), (True, 1.0)])
def test_score_example_clamps(scratch_registry, raw, clamped):
    @scratch_registry.register("fixed")
    class Fixed(Verifier):
        def score(self, completion, example):
            return raw

    assert score_example("x", Example("a", "p", "1", verifier="fixed")) == clamped


def test_score_example_turns_verifier_errors_into_zero(scratch_registry, caplog):
    @scratch_registry.register("broken")
    class Broken(Verifier):
        def score(self, completion, example):
            raise RuntimeError(f"cannot score {example.answer}")

    @scratch_registry.register("not_a_number")
    class NotANumber(Verifier):
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
