"""One renderer for both parties (rlvr_core/tasks/rendering.py): plain templates, built-in chat formats,
template files and tokenizer templates, all Jinja in the sandbox; and score_rows renders with it."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from rlvr_core.scoring import Decoding, score_rows
from rlvr_core.tasks.example import Example
from rlvr_core.tasks.rendering import (
    CHAT_FORMATS,
    Rendering,
    RenderingError,
    as_rendering,
    parse_chat_turns,
    read_chat_template,
)


def test_a_plain_template_renders_as_before():
    assert Rendering("{prompt}\nAnswer:").render("2+2?") == "2+2?\nAnswer:"
    assert as_rendering("Q: {prompt}").render("x") == "Q: x"
    assert not Rendering().is_chat


@pytest.mark.parametrize("name", sorted(CHAT_FORMATS))
def test_every_built_in_chat_format_wraps_the_templated_prompt_as_the_user_turn(name):
    text = Rendering.chat(name, "{prompt} (answer briefly)").render("What is 2+3?")
    assert "What is 2+3? (answer briefly)" in text
    assert Rendering.chat(name).chat_format == name


def test_chatml_is_exact_and_takes_earlier_turns():
    rendering = Rendering.chat("chatml", "{prompt}")
    assert rendering.render("hi", history=(("system", "be terse"),)) == (
        "<|im_start|>system\nbe terse<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    )


def test_a_plain_template_refuses_earlier_chat_turns():
    with pytest.raises(RenderingError, match="earlier chat turn"):
        Rendering("{prompt}").render("hi", history=(("system", "x"),))


def test_a_template_file_is_read_and_checked(tmp_path):
    good = tmp_path / "chat.jinja"
    good.write_text("{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}[assistant]")
    assert Rendering.from_file(good, "{prompt}").render("q") == "[user] q\n[assistant]"
    bad = tmp_path / "bad.jinja"
    bad.write_text("{% for m in messages %}\n{{ m['content'] }")
    with pytest.raises(RenderingError, match=r"bad.jinja: chat template line \d"):
        read_chat_template(bad)
    with pytest.raises(RenderingError, match="not found"):
        read_chat_template(tmp_path / "missing.jinja")


def test_templates_run_sandboxed():
    escape = "{{ messages.__class__.__mro__[1].__subclasses__() }}"
    with pytest.raises(RenderingError, match="failed to render"):
        Rendering("{prompt}", escape).render("x")
    mutate = "{% set _ = messages.append({'role': 'user', 'content': 'injected'}) %}{{ messages|length }}"
    with pytest.raises(RenderingError):
        Rendering("{prompt}", mutate).render("x")


def test_a_tokenizer_template_gets_its_special_tokens_and_the_owner_template_gets_none():
    tokenizer = SimpleNamespace(chat_template="{{ bos_token }}{{ messages[0]['content'] }}{{ eos_token }}",
                                bos_token="<s>", eos_token="</s>", pad_token=None, unk_token=None)
    assert Rendering.from_tokenizer(tokenizer, "{prompt}").render("x") == "<s>x</s>"
    assert Rendering.from_tokenizer(SimpleNamespace(chat_template=None), "{prompt}") is None
    assert Rendering("{prompt}", "{{ bos_token }}|{{ messages[0]['content'] }}").render("x") == "|x"


def test_the_published_rendering_round_trips_through_get_info():
    from protocol.generated.target_feedback.v1 import target_feedback_pb2 as pb

    rendering = Rendering.chat("llama3", "{prompt}\nAnswer:")
    info = pb.GetInfoResponse(prompt_template=rendering.prompt_template, chat_template=rendering.chat_template,
                              chat_format=rendering.chat_format)
    assert Rendering.from_info(info) == rendering


def test_chat_messages_split_into_history_and_prompt():
    history, prompt = parse_chat_turns([{"role": "system", "content": "s"}, {"role": "user", "content": "u"}], "col")
    assert history == (("system", "s"),) and prompt == "u"
    for bad, message in (([], "non-empty list"), ([{"role": "assistant", "content": "a"}], "last message"),
                         ([{"role": "robot", "content": "a"}], r"col\[0\].role"), ("text", "list")):
        with pytest.raises(ValueError, match=message):
            parse_chat_turns(bad, "col")


class RecordingEngine:
    def __init__(self) -> None:
        self.prompts: list[str] = []

    def generate(self, prompts, num_samples, params, row_keys=None, shape=None):
        self.prompts = list(prompts)
        # As the real engines do, an empty prompt is a placeholder row whose samples are not encoded.
        return [[SimpleNamespace(text="4", encoded=bool(prompt))] * num_samples for prompt in prompts]


def test_score_rows_renders_each_row_with_the_rendering():
    engine = RecordingEngine()
    examples = [Example(id="a", prompt="2+2", answer="4"), Example(id="b", prompt="1+3", answer="4",
                                                                   history=(("system", "add"),))]
    decoding = Decoding(max_new_tokens=2, samples_per_prompt=1, temperature=0.0, seed=0)
    scores = score_rows(engine, examples, Rendering.chat("chatml", "{prompt}"), decoding, [1, 2])
    assert engine.prompts[0] == "<|im_start|>user\n2+2<|im_end|>\n<|im_start|>assistant\n"
    assert engine.prompts[1].startswith("<|im_start|>system\nadd<|im_end|>")
    np.testing.assert_array_equal(scores, [1.0, 1.0])
    # A row a plain template cannot render scores 0 (the engine's placeholder), the others are kept.
    scores = score_rows(engine, examples, "{prompt}", decoding, [1, 2])
    assert engine.prompts[1] == "" and scores.tolist() == [1.0, 0.0]
