"""How a task prompt becomes the model's input: the one renderer both parties use.

A `Rendering` is a plain prompt template (exactly one "{prompt}", rlvr_core.tasks.prompting)
and, optionally, a chat template. The prompt template fills the user turn; with a chat
template that turn (after any earlier chat turns of the example, e.g. a system message) is
then rendered as a conversation, with `add_generation_prompt` = true. Without one, the text of
the prompt template is the model input, as before.

Who chooses the chat template:
- the target owner renders its held-out prompts with the rendering ITS config declares (a
  built-in format from CHAT_FORMATS or a template file in the owner's own folder) and
  publishes it in GetInfo. It never executes a template that came with an upload: a chat
  template is code (Jinja), and an uploaded one could branch on a secret string (issue 11,
  hole 1);
- the trainer renders its prompts with the owner's published rendering when it trains
  against an owner (both parties then score the same text), or with its tokenizer's own chat
  template, or with a plain template (trainer_node/training.py decides).

Jinja runs in jinja2's ImmutableSandboxedEnvironment, as transformers runs chat templates:
no attribute access to Python internals, no mutation of the values passed in. A template
gets `messages` (a list of {"role", "content"}) and `add_generation_prompt`; a template that
came with a tokenizer also gets that tokenizer's special-token strings (bos_token, eos_token,
...), the owner's templates get none (write special tokens literally).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlvr_core.tasks.prompting import DEFAULT_PROMPT_TEMPLATE, render_prompt, validate_template

CHAT_ROLES = ("system", "user", "assistant")
MAX_CHAT_TEMPLATE_CHARS = 64 * 1024  # real chat templates are a few KiB; a template is published in GetInfo
# Special tokens a tokenizer's own chat template may refer to (transformers passes the same names).
TOKENIZER_TEMPLATE_TOKENS = ("bos_token", "eos_token", "pad_token", "unk_token")

# Built-in chat formats an owner may choose by name (`data.chat_format`). Special tokens are
# written literally: the template never sees the (untrusted) uploaded tokenizer.
CHAT_FORMATS: dict[str, str] = {
    # Qwen2/Qwen3, many others: <|im_start|>role\ncontent<|im_end|>\n
    "chatml": (
        "{% for message in messages %}"
        "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
        "{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
    ),
    # Llama 3.x instruct (without the date header of 3.1+).
    "llama3": (
        "{{ '<|begin_of_text|>' }}"
        "{% for message in messages %}"
        "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' + message['content'] + '<|eot_id|>' }}"
        "{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
    ),
    # A readable, tokenizer-neutral format: "User: ...\nAssistant:" (system text first, if any).
    "plain": (
        "{% for message in messages %}"
        "{% if message['role'] == 'system' %}{{ message['content'] + '\n\n' }}"
        "{% elif message['role'] == 'user' %}{{ 'User: ' + message['content'] + '\n' }}"
        "{% else %}{{ 'Assistant: ' + message['content'] + '\n' }}{% endif %}"
        "{% endfor %}"
        "{% if add_generation_prompt %}{{ 'Assistant:' }}{% endif %}"
    ),
}


class RenderingError(ValueError):
    """A rendering that cannot be used, or an example it cannot render (the message says why)."""


Turn = tuple[str, str]  # (role, content)


@dataclass(frozen=True)
class Rendering:
    """How prompts become model input; see the module docstring.

    `chat_template` is Jinja source ("" = none); `chat_format` names the built-in it came from
    ("" = a file or a tokenizer's); `template_tokens` are the special-token variables a
    tokenizer's own template is given (empty for the owner's templates).
    """

    prompt_template: str = DEFAULT_PROMPT_TEMPLATE
    chat_template: str = ""
    chat_format: str = ""
    template_tokens: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        try:
            validate_template(self.prompt_template)
        except ValueError as error:
            raise RenderingError(f"prompt_template: {error}") from None
        if self.chat_format and self.chat_format not in CHAT_FORMATS:
            raise RenderingError(
                f"chat_format: unknown built-in chat format {self.chat_format!r}; known: {', '.join(CHAT_FORMATS)}"
            )
        if self.chat_format and not self.chat_template:
            raise RenderingError("chat_format names a built-in but chat_template is empty; use Rendering.chat()")
        if self.chat_template:
            compile_chat_template(self.chat_template)

    # -- building ---------------------------------------------------------------------------
    @classmethod
    def chat(cls, chat_format: str, prompt_template: str = DEFAULT_PROMPT_TEMPLATE) -> Rendering:
        """A built-in chat format by name (CHAT_FORMATS)."""
        if chat_format not in CHAT_FORMATS:
            raise RenderingError(
                f"chat_format: unknown built-in chat format {chat_format!r}; known: {', '.join(CHAT_FORMATS)}"
            )
        return cls(prompt_template, CHAT_FORMATS[chat_format], chat_format)

    @classmethod
    def from_file(cls, path: str | Path, prompt_template: str = DEFAULT_PROMPT_TEMPLATE) -> Rendering:
        """A Jinja chat template from a file (the owner's own folder, never an upload)."""
        return cls(prompt_template, read_chat_template(path))

    @classmethod
    def from_tokenizer(cls, tokenizer: Any, prompt_template: str = DEFAULT_PROMPT_TEMPLATE) -> Rendering | None:
        """The tokenizer's own chat template (trainer side only), or None when it has none."""
        template = getattr(tokenizer, "chat_template", None)
        if isinstance(template, Mapping):  # several named templates: transformers uses "default"
            template = template.get("default")
        if not isinstance(template, str) or not template.strip():
            return None
        tokens = []
        for name in TOKENIZER_TEMPLATE_TOKENS:
            value = getattr(tokenizer, name, None)
            if isinstance(value, str):
                tokens.append((name, value))
        return cls(prompt_template, template, "", tuple(tokens))

    @classmethod
    def from_info(cls, info: Any) -> Rendering:
        """The rendering an owner publishes in GetInfo (prompt_template, chat_template, chat_format)."""
        return cls(info.prompt_template, info.chat_template, info.chat_format)

    # -- using ------------------------------------------------------------------------------
    @property
    def is_chat(self) -> bool:
        return bool(self.chat_template)

    def render(self, prompt: str, history: Sequence[Turn] = ()) -> str:
        """The model input for `prompt` (the last user turn) after the chat turns `history`."""
        text = render_prompt(prompt, self.prompt_template)
        if not self.is_chat:
            if history:
                raise RenderingError(
                    f"the prompt has {len(history)} earlier chat turn(s) (e.g. a system message) but the rendering is "
                    "a plain prompt_template, which renders the prompt alone; configure a chat rendering"
                )
            return text
        messages = [{"role": role, "content": content} for role, content in history]
        messages.append({"role": "user", "content": text})
        template = compile_chat_template(self.chat_template)
        try:
            return template.render(messages=messages, add_generation_prompt=True, **dict(self.template_tokens))
        except Exception as error:  # noqa: BLE001 - a template error; the prompt text is never quoted
            raise RenderingError(f"the chat template failed to render a prompt ({type(error).__name__})") from None

    def render_example(self, example: Any) -> str:
        """render(example.prompt, example.history)."""
        return self.render(example.prompt, getattr(example, "history", ()))

    def check_example(self, example: Any) -> None:
        """Raise RenderingError when this rendering cannot render `example` (checked at load)."""
        self.render_example(example)

    def describe(self) -> str:
        if not self.is_chat:
            return f"prompt template {self.prompt_template!r}"
        source = f"chat format {self.chat_format!r}" if self.chat_format else "a chat template"
        return f"{source} around prompt template {self.prompt_template!r}"


def as_rendering(value: str | Rendering) -> Rendering:
    """A Rendering from a Rendering or a plain prompt template string."""
    return value if isinstance(value, Rendering) else Rendering(value)


def read_chat_template(path: str | Path) -> str:
    """The text of a Jinja chat template file; RenderingError naming the file and the problem."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise RenderingError(f"{path}: chat template file not found") from None
    except OSError as error:
        raise RenderingError(f"{path}: cannot read the chat template ({error.strerror})") from None
    if len(data) > MAX_CHAT_TEMPLATE_CHARS:
        raise RenderingError(f"{path}: larger than {MAX_CHAT_TEMPLATE_CHARS} bytes; a chat template is a few KiB")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise RenderingError(f"{path}: not UTF-8 text") from None
    try:
        compile_chat_template(text)
    except RenderingError as error:
        raise RenderingError(f"{path}: {error}") from None
    return text


@functools.lru_cache(maxsize=1)
def _environment():
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> None:
        raise RenderingError(f"the chat template raised: {message}")

    def tojson(value: Any, indent: int | None = None) -> str:
        import json

        return json.dumps(value, ensure_ascii=False, indent=indent)

    # trim_blocks/lstrip_blocks and these helpers are what transformers gives chat templates.
    environment = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    environment.filters["tojson"] = tojson
    environment.globals["raise_exception"] = raise_exception
    return environment


@functools.lru_cache(maxsize=32)
def compile_chat_template(source: str):
    """The compiled (sandboxed) template; RenderingError with the line of a syntax error."""
    from jinja2 import TemplateSyntaxError

    if not isinstance(source, str) or not source.strip():
        raise RenderingError("chat template is empty")
    if len(source) > MAX_CHAT_TEMPLATE_CHARS:
        raise RenderingError(f"chat template is longer than {MAX_CHAT_TEMPLATE_CHARS} characters")
    try:
        return _environment().from_string(source)
    except TemplateSyntaxError as error:
        raise RenderingError(f"chat template line {error.lineno}: {error.message}") from None


def parse_chat_turns(value: Any, where: str) -> tuple[tuple[Turn, ...], str]:
    """Split chat messages (a list of {"role", "content"}) into (earlier turns, last user prompt).

    The last message must be the user's: it is the prompt the model answers. Raises ValueError
    naming `where` and the message index; never quotes content."""
    if not isinstance(value, Sequence) or isinstance(value, (str, bytes)) or not value:
        raise ValueError(f"{where} must be a non-empty list of chat messages ({{'role', 'content'}})")
    turns: list[Turn] = []
    for index, message in enumerate(value):
        if not isinstance(message, Mapping):
            raise ValueError(f"{where}[{index}] must be an object with 'role' and 'content'")  # noqa: TRY004
        role, content = message.get("role"), message.get("content")
        if role not in CHAT_ROLES:
            raise ValueError(f"{where}[{index}].role must be one of {', '.join(CHAT_ROLES)}")
        if not isinstance(content, str):
            raise ValueError(f"{where}[{index}].content must be a string")  # noqa: TRY004
        turns.append((role, content))
    role, prompt = turns[-1]
    if role != "user":
        raise ValueError(f"{where}: the last message must be the user's (the prompt to answer); it is {role!r}")
    if not prompt.strip():
        raise ValueError(f"{where}[{len(turns) - 1}].content is empty")
    return tuple(turns[:-1]), prompt
