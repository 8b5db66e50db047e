"""Turning a task prompt into the text the model sees.

Both parties render prompts with the same template (it travels in the testbed spec), so an
owner evaluating a checkpoint asks the questions in the format the trainer trained on.
"""

from __future__ import annotations

import functools
import string

# The model answers directly after "Answer:" (no chain of thought): the verifiers read the
# completion up to its first newline.
DEFAULT_PROMPT_TEMPLATE = "{prompt}\nAnswer:"


@functools.lru_cache(maxsize=64)
def validate_template(template: str) -> str:
    """Check that `template` has exactly one "{prompt}" field and no other fields.

    Literal braces must be doubled ("{{" / "}}"), as in str.format. Returns the template;
    raises ValueError naming the problem.
    """
    if not isinstance(template, str):
        raise ValueError(f"prompt template must be a string, got {type(template).__name__}")
    try:
        fields = [
            (name, spec, conversion)
            for _, name, spec, conversion in string.Formatter().parse(template)
            if name is not None
        ]
    except ValueError as error:
        raise ValueError(
            f"prompt template has unbalanced braces ({error}); write literal braces as '{{{{' and '}}}}'"
        ) from None
    others = sorted({name for name, _, _ in fields if name != "prompt"})
    if others:
        shown = ", ".join("{" + name + "}" for name in others)
        raise ValueError(f"prompt template may only use the field {{prompt}}; found {shown}")
    if len(fields) != 1:
        raise ValueError(f"prompt template must contain '{{prompt}}' exactly once, found it {len(fields)} times")
    _, spec, conversion = fields[0]
    if spec or conversion:
        raise ValueError("prompt template must use a plain '{prompt}' (no format spec or !conversion)")
    return template


def render_prompt(prompt: str, template: str = DEFAULT_PROMPT_TEMPLATE) -> str:
    """Insert `prompt` into `template` (validated first; braces inside `prompt` are kept as is)."""
    return validate_template(template).format(prompt=prompt)
