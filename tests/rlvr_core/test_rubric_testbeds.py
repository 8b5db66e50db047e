"""The rubric testbed family (issue 43): it builds, its splits never share a prompt, every row carries
k >= 4 items its reference meets, the owner's splits are scored by the exact grader, the three
noise levels hold the same data, and bad rubric options are refused naming the field."""

from __future__ import annotations

import copy
import tomllib

import pytest

from rlvr_core.tasks import testbed as testbeds
from rlvr_core.tasks.rubric import RUBRIC_ITEMS, question_of
from rlvr_core.verifiers.base import get_verifier

FAMILY = ("rubric_low", "rubric", "rubric_high")
GRADER_ONLY = ("name", "description", "source_grader")  # what the family's files may differ in


def _raw(name: str) -> dict:
    return tomllib.loads((testbeds.TESTBED_DIR / f"{name}.toml").read_text(encoding="utf-8"))


def test_the_family_differs_only_in_its_source_grader():
    middle = {k: v for k, v in _raw("rubric").items() if k not in GRADER_ONLY}
    graders = set()
    for name in FAMILY:
        raw = _raw(name)
        assert {k: v for k, v in raw.items() if k not in GRADER_ONLY} == middle, name
        assert raw["source_grader"]["name"] == "rubric_grader"
        graders.add(tuple(sorted(raw["source_grader"].items())))
    assert len(graders) == len(FAMILY)


def test_the_testbed_builds_with_disjoint_splits_and_graded_rows():
    data = testbeds.build_testbed_data(testbeds.load_testbed("rubric"))
    splits = {"source": data.source, "warmup": data.warmup, "feedback": data.feedback, "test": data.test}
    assert all(splits.values())
    prompts = {name: {e.prompt for e in rows} for name, rows in splits.items()}
    # the generator's own question (before "Rules:") never crosses a split either
    questions = {name: {question_of(e) for e in rows} for name, rows in splits.items()}
    for first, second in [("source", "warmup"), ("source", "feedback"), ("source", "test"), ("warmup", "feedback"),
                          ("warmup", "test"), ("feedback", "test")]:
        assert not prompts[first] & prompts[second], (first, second)
        assert not questions[first] & questions[second], (first, second)
    exact = get_verifier("rubric")
    for rows in splits.values():
        for row in rows:
            assert row.verifier == "rubric" and not get_verifier(row.verifier).noisy  # the owner's splits: exact
            assert len(row.metadata["rubric"]) >= 4
            assert exact.score(row.answer, row) == 1.0  # the reference meets every item
            exact.check_example(row)
    # the rules are drawn per row: the form varies, so copying it from the prompt is the skill
    assert len({row.answer[0] for row in data.source}) == 3 and len({row.answer[-1] for row in data.source}) == 3


def test_every_level_gives_the_trainer_the_same_rows():
    """Grader noise is the grader's: nothing of it reaches the rows (prompts, answers, metadata)."""
    built = [testbeds.build_testbed_data(testbeds.load_testbed(name)) for name in FAMILY]
    rows = [[e.to_json() for e in data.source + data.warmup] for data in built]
    assert rows[0] == rows[1] == rows[2]
    options = {"misjudge_rate", "check_fraction", "jitter_std", "source_grader", "rubric_grader"}
    for row in rows[0]:
        assert set(row["metadata"]) == {"rg", "difficulty", "rubric"}
        assert {key for item in row["metadata"]["rubric"] for key in item} <= {"name", "answer", "char", "chars"}
        assert not any(option in str(row) for option in options)  # no grader option anywhere in the row
    for item in rows[0][0]["metadata"]["rubric"]:
        assert item["name"] in RUBRIC_ITEMS


def _with_rubric(items: list, **extra) -> dict:
    raw = copy.deepcopy(_raw("rubric"))
    raw["source"][0]["rubric"] = {"items": items}
    raw["source"][0].update(extra)
    return raw


@pytest.mark.parametrize("items,extra,message", [
    ([{"name": "correct"}, {"name": "starts_with", "choices": "# "}], {}, ("source[0].rubric.items: [1].choices: "
     "must hold printable, non-space")),
    ([{"name": "correct"}, {"name": "ends_with", "choices": "!."}], {}, "source[0].rubric.items: [1].choices: holds '.'"),
    ([{"name": "correct"}, {"name": "max_length", "slak": 1}], {}, ("[1].slak: not an option of rubric item "
     "'max_length'; did you mean 'slack'?")),
    ([{"name": "correct"}, {"name": "max_length", "slack": -1}], {}, "[1].slack: "),
    ([{"name": "correct"}, {"name": "shouting"}], {}, "[1].name: unknown rubric item 'shouting'; known: correct"),
    ([{"name": "correct"}], {}, "source[0].rubric.items: "),
    ([{"name": "correct"}, {"name": "forbidden", "choices": "0"}], {"corrupt": {"kind": "shift", "by": 1}},
     "source[0].rubric: cannot be combined with `corrupt`"),
])
def test_a_bad_rubric_option_is_refused_naming_the_field(items, extra, message):
    with pytest.raises(testbeds.TestbedError) as error:
        testbeds.parse_testbed(_with_rubric(items, **extra), origin="t.toml")
    assert message in str(error.value)


def test_an_item_order_no_reference_can_meet_is_refused_at_build_naming_the_item():
    # max_length before starts_with bounds the bare answer, then a character is prepended
    items = [{"name": "correct"}, {"name": "max_length", "slack": 0}, {"name": "starts_with", "choices": "#"}]
    spec = testbeds.parse_testbed(_with_rubric(items), origin="t.toml")
    with pytest.raises(testbeds.TestbedError, match=r"source\[0\]\.rubric\.items\[1\] \(max_length\): the reference"):
        testbeds.build_testbed_data(spec)
    spec = testbeds.parse_testbed(_with_rubric([{"name": "correct"}, {"name": "forbidden", "choices": "1"}]))
    with pytest.raises(testbeds.TestbedError, match=r"source\[0\]\.rubric\.items\[1\] \(forbidden\): every one of choices"):
        testbeds.build_testbed_data(spec)
