"""Prompt templates: rendering and validation."""

from __future__ import annotations

import pytest

from rlvr_core.tasks.prompting import DEFAULT_PROMPT_TEMPLATE, render_prompt, validate_template


def test_default_template():
    assert DEFAULT_PROMPT_TEMPLATE == "{prompt}\nAnswer:"
    assert render_prompt("Calculate 2 + 3.") == "Calculate 2 + 3.\nAnswer:"


def test_braces_in_the_prompt_are_kept():
    assert render_prompt("set {a} and {{b}}", "Q: {prompt} A:") == "Q: set {a} and {{b}} A:"


def test_escaped_literal_braces_are_allowed():
    assert render_prompt("x", "{{json}} {prompt}") == "{json} x"


@pytest.mark.parametrize(
    "template, problem",
    [
        ("no field", "exactly once, found it 0 times"),
        ("{prompt} {prompt}", "exactly once, found it 2 times"),
        ("{prompt} {answer}", "found {answer}"),
        ("{} {prompt}", "found {}"),
        ("{prompt.upper}", "found {prompt.upper}"),
        ("{prompt!r}", "plain '{prompt}'"),
        ("{prompt:>10}", "plain '{prompt}'"),
        ("{prompt", "unbalanced braces"),
        ("{prompt} }", "unbalanced braces"),
    ],
)
def test_invalid_templates_name_the_problem(template, problem):
    with pytest.raises(ValueError, match="prompt template") as caught:
        validate_template(template)
    assert problem in str(caught.value)
    with pytest.raises(ValueError):
        render_prompt("x", template)
