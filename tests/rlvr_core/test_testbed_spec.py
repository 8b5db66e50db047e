"""Testbed specs: loading built-ins and user files, and errors that name the file and field."""

from __future__ import annotations

import textwrap

import pytest

from rlvr_core.tasks import testbed as tb
from rlvr_core.tasks.example import Example
from rlvr_core.tasks.testbed import (
    build_testbed_data,
    cluster_of,
    load_testbed,
    parse_testbed,
    target_composition,
)

# Imported through the module: pytest would collect names starting with "test"/"Test".
BadTestbed = tb.TestbedError

ADD = 'task = "basic_arithmetic"\nconfig = { operators = ["+"], min_terms = 2, max_terms = 2, allow_parentheses = false }'


def _toml(tmp_path, body: str):
    path = tmp_path / "mine.toml"
    path.write_text(textwrap.dedent(body), encoding="utf-8")
    return path


VALID = f"""
name = "mine"
seed = 1
feedback_fraction = 0.5

[[source]]
{ADD}
domain = "add"
difficulty = "easy"
size = 5

[[target]]
{ADD}
domain = "add"
size = 4
"""


def test_builtin_testbeds_load_and_are_named_after_their_file():
    names = tb.testbed_names()
    assert {"default", "small", "strings"} <= set(names)
    assert tb.DEFAULT_TESTBED in names
    for name in names:
        spec = load_testbed(name)
        assert spec.name == name
        assert spec.description


def test_user_file_loads(tmp_path):
    spec = load_testbed(str(_toml(tmp_path, VALID)))
    assert spec.source[0].difficulty == "easy"
    assert spec.target[0].difficulty == ""
    assert spec.prompt_template == "{prompt}\nAnswer:"


def _error(tmp_path, body: str) -> str:
    path = _toml(tmp_path, body)
    with pytest.raises(BadTestbed) as caught:
        load_testbed(str(path))
    message = str(caught.value)
    assert message.startswith(str(path) + ": "), message
    return message


def test_unknown_task_names_the_field_path(tmp_path):
    body = VALID.replace('[[target]]\ntask = "basic_arithmetic"', '[[target]]\ntask = "basic_arithmetc"')
    message = _error(tmp_path, body)
    assert "target[0].task: unknown reasoning-gym dataset 'basic_arithmetc'; known: " in message
    assert "spell_backward" in message


@pytest.mark.parametrize("task", sorted(tb.HASH_ORDER_DEPENDENT_TASKS))
def test_a_task_whose_rows_depend_on_the_hash_order_is_refused_naming_the_field(tmp_path, task):
    body = VALID.replace('[[target]]\ntask = "basic_arithmetic"', f'[[target]]\ntask = "{task}"')
    message = _error(tmp_path, body)
    assert f"target[0].task: reasoning-gym's {task!r} generator depends on Python's per-process hash order" in message


_ROW_DIGESTS = """
import hashlib, sys, reasoning_gym
for name in sys.argv[1:]:
    rows = "".join(str(x["question"]) + str(x["answer"]) for x in reasoning_gym.create_dataset(name, seed=5, size=20))
    print(name, hashlib.sha256(rows.encode()).hexdigest())
"""


def test_the_refused_tasks_are_the_ones_whose_rows_change_with_the_hash_seed_and_builtins_do_not():
    import os
    import subprocess
    import sys

    builtins = [load_testbed(name) for name in tb.testbed_names()]
    used = sorted({entry.task for spec in builtins for entry in (*spec.source, *spec.target)})
    tasks = [*sorted(tb.HASH_ORDER_DEPENDENT_TASKS), *used]

    def digests(hash_seed: str) -> dict[str, str]:
        done = subprocess.run([sys.executable, "-c", _ROW_DIGESTS, *tasks], capture_output=True, text=True,
                              env={**os.environ, "PYTHONHASHSEED": hash_seed}, timeout=300, check=True)
        return dict(line.split() for line in done.stdout.splitlines())

    first, second = digests("1"), digests("2")
    assert sorted(first) == sorted(tasks)
    assert {task for task in tasks if first[task] != second[task]} == set(tb.HASH_ORDER_DEPENDENT_TASKS)


def test_bad_config_key_names_the_entry(tmp_path):
    message = _error(tmp_path, VALID.replace("min_terms = 2, max_terms", "min_term = 2, max_terms", 1))
    assert "source[0].config: unknown config key(s) 'min_term' for 'basic_arithmetic'" in message


@pytest.mark.parametrize(
    "replace, expected",
    [
        (("allow_parentheses = false }", "allow_parentheses = false, seed = 3 }"), "source[0].config: seed is set by the testbed builder"),
        (("min_terms = 2, max_terms = 2", "min_terms = 3, max_terms = 2"), "source[0].config: invalid config"),
        (('operators = ["+"]', 'operators = ["%"]'), "source[0].config: invalid config"),
        (("size = 5", 'size = "5"'), "source[0].size: "),
        (("size = 5", "size = 0"), "source[0].size: "),
        (("seed = 1", "seed = 1.5"), "seed: "),
        (("feedback_fraction = 0.5", "feedback_fraction = 1.0"), "feedback_fraction: "),
        (("feedback_fraction = 0.5\n", ""), "feedback_fraction: field is missing"),
        (('domain = "add"\ndifficulty', 'domain = "a:b"\ndifficulty'), "source[0].domain: "),
        (("seed = 1", 'seed = 1\nprompt_template = "{question}"'), "prompt_template: prompt template may only"),
        (("seed = 1", "seed = 1\nsed = 2"), "sed: unknown field"),
    ],
)
def test_invalid_fields_are_named(tmp_path, replace, expected):
    old, new = replace
    assert old in VALID
    assert expected in _error(tmp_path, VALID.replace(old, new, 1))


def test_missing_target_and_syntax_errors(tmp_path):
    assert "target: field is missing" in _error(tmp_path, VALID.split("[[target]]")[0])
    assert "TOML syntax error" in _error(tmp_path, VALID + "\nthis is = = not toml\n")


def test_config_that_only_fails_when_drawing_is_caught_at_load(tmp_path):
    body = VALID.replace(
        ADD, 'task = "simple_equations"\nconfig = { operators = ["+"] }', 1
    )  # operators_weights keeps 3 weights for 1 operator: validate() passes, drawing fails
    assert "source[0].config: config for 'simple_equations' fails to generate" in _error(tmp_path, body)


def test_unknown_name_or_missing_file():
    with pytest.raises(BadTestbed, match="neither a built-in"):
        load_testbed("no-such-testbed")


def test_parse_testbed_reports_every_problem():
    with pytest.raises(BadTestbed) as caught:
        parse_testbed({"name": "x", "seed": -1, "source": [], "target": [], "feedback_fraction": 0.5}, "inline")
    lines = str(caught.value).splitlines()
    assert [line.split(":")[1].strip() for line in lines] == ["seed", "source", "target"]


def test_target_composition_and_cluster_of():
    spec = load_testbed("default")
    composition = target_composition(spec)
    assert sum(composition.values()) == pytest.approx(1.0)
    assert set(composition) == {entry.domain for entry in spec.target}
    assert cluster_of(Example("a", "p", "1", domain="add", metadata={"difficulty": "easy"})) == "add:easy"
    assert cluster_of(Example("a", "p", "1", domain="spell", metadata={"difficulty": ""})) == "spell"
    assert cluster_of(Example("a", "p", "1", domain="spell")) == "spell"


def test_tiny_prompt_space_is_reported(tmp_path):
    spec = tb.TestbedSpec(
        name="tiny", seed=0, feedback_fraction=0.5,
        source=[tb.MixtureEntry(task="basic_arithmetic", domain="add", size=50,
                             config={"operators": ["+"], "min_terms": 2, "max_terms": 2, "max_digits": 1,
                                     "allow_parentheses": False})],
        target=[tb.MixtureEntry(task="basic_arithmetic", domain="add", size=200,
                             config={"operators": ["+"], "min_terms": 2, "max_terms": 2, "max_digits": 1,
                                     "allow_parentheses": False})],
    )
    with pytest.raises(BadTestbed, match=r"target\[0\]: only \d+ of 200 prompts are new"):
        build_testbed_data(spec)


def _warmup_spec(fraction):
    return tb.TestbedSpec(
        name="warm", seed=3, feedback_fraction=0.5, warmup_fraction=fraction,
        source=[tb.MixtureEntry(task="basic_arithmetic", domain="add", size=120,
                                config={"operators": ["+"], "min_terms": 2, "max_terms": 2, "max_digits": 1,
                                        "allow_parentheses": False}),
                tb.MixtureEntry(task="letter_counting", domain="count", size=60, config={"min_words": 3, "max_words": 5})],
        target=[tb.MixtureEntry(task="letter_counting", domain="count", size=40, config={"min_words": 3, "max_words": 5})],
    )


def test_warmup_split_is_disjoint_from_the_rl_pool_and_the_target():
    data = build_testbed_data(_warmup_spec(0.5))
    pool = {e.prompt for e in data.source}
    warm = {e.prompt for e in data.warmup}
    target = {e.prompt for e in data.feedback + data.test}
    assert warm and pool
    assert not pool & warm  # every copy of a prompt lands on one side
    assert not target & (pool | warm)  # the owner's data overlaps no training data, warm-up included
    assert len(data.source) + len(data.warmup) == 180
    for domain in ("add", "count"):  # each entry is split, so both sides keep every domain
        assert any(e.domain == domain for e in data.warmup) and any(e.domain == domain for e in data.source)
    assert build_testbed_data(_warmup_spec(0.5)) == data  # deterministic


def test_no_warmup_fraction_keeps_the_pool_whole():
    data = build_testbed_data(_warmup_spec(0.0))
    assert data.warmup == () and len(data.source) == 180


def test_default_testbed_reserves_a_warmup_split():
    data = build_testbed_data(load_testbed("default"))
    assert data.warmup and not {e.prompt for e in data.warmup} & {e.prompt for e in data.source}


@pytest.mark.parametrize("fraction", [-0.1, 1.0])
def test_bad_warmup_fraction_is_rejected(fraction):
    with pytest.raises(BadTestbed, match="warmup_fraction"):
        parse_testbed({"name": "x", "seed": 1, "feedback_fraction": 0.5, "warmup_fraction": fraction,
                       "source": [{"task": "basic_arithmetic", "domain": "add", "size": 5}],
                       "target": [{"task": "basic_arithmetic", "domain": "add", "size": 5}]}, "inline")
