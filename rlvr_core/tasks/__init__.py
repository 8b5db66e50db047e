"""Tasks: the Example type, example files, prompt rendering, and testbeds.

Kept light on import: testbeds (pydantic + reasoning-gym) live in rlvr_core.tasks.testbed,
a trainer's own prompt sets in rlvr_core.tasks.prompt_data and the one renderer (plain
templates, chat templates in a Jinja sandbox) in rlvr_core.tasks.rendering; import them from
there. reasoning-gym itself loads only when a testbed is validated or built.
"""

from rlvr_core.tasks.example import Example
from rlvr_core.tasks.io import ExampleFileError, read_examples, write_examples
from rlvr_core.tasks.prompting import DEFAULT_PROMPT_TEMPLATE, render_prompt, validate_template

__all__ = [
    "DEFAULT_PROMPT_TEMPLATE",
    "Example",
    "ExampleFileError",
    "read_examples",
    "render_prompt",
    "validate_template",
    "write_examples",
]
