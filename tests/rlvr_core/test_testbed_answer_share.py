"""`max_answer_share` on a target entry: no reference answer holds more than its share of the
entry's rows, in the whole entry and (stratified by answer) in each split; the build stays a pure
function of the spec; bad values and unreachable shares are refused naming the field."""

from __future__ import annotations

import copy
from collections import Counter

import pytest

from rlvr_core.tasks import testbed as tb
from rlvr_core.tasks.testbed import parse_testbed

BadTestbed = tb.TestbedError  # through the module: pytest would collect a name starting with "Test"

COUNT = {"task": "letter_counting", "config": {"min_words": 3, "max_words": 5}}


def _data(share=0.25, size=80, **target):
    return {
        "name": "share", "seed": 3, "feedback_fraction": 0.5,
        "source": [{**COUNT, "domain": "count", "size": 20}],
        "target": [{**COUNT, "domain": "count", "size": size, "max_answer_share": share, **target}],
    }


def _counts(examples):
    return Counter(example.answer.strip() for example in examples)


def test_no_answer_exceeds_its_share_in_the_entry_or_either_split():
    spec = parse_testbed(_data())
    data = tb._build(spec)  # not the cached build: this test is about what one build makes
    target = data.feedback + data.test
    assert len(target) == 80 and max(_counts(target).values()) <= 20
    assert max(_counts(data.feedback).values()) <= 10 and max(_counts(data.test).values()) <= 10
    ids = [example.id for example in target]
    assert len(set(ids)) == 80
    assert sorted(ids, key=lambda i: int(i.rsplit("-", 1)[1])) == [f"tgt-letter_counting-0-{i}" for i in range(80)]
    assert not {e.prompt for e in target} & {e.prompt for e in data.source}
    # without the cap the same generator's commonest answer ("1") holds far more than a quarter
    uncapped = copy.deepcopy(_data())
    del uncapped["target"][0]["max_answer_share"]
    plain = tb._build(parse_testbed(uncapped))
    assert max(_counts(plain.feedback + plain.test).values()) > 30


def test_the_capped_build_is_deterministic_and_leaves_the_source_alone():
    spec = parse_testbed(_data())
    first, second = tb._build(spec), tb._build(parse_testbed(_data()))
    assert first == second
    uncapped = copy.deepcopy(_data())
    del uncapped["target"][0]["max_answer_share"]
    assert tb._build(parse_testbed(uncapped)).source == first.source


@pytest.mark.parametrize(("edit", "message"), [
    (lambda d: d["target"][0].update(max_answer_share=0.0), r"target\[0\]\.max_answer_share: .*greater than 0"),
    (lambda d: d["target"][0].update(max_answer_share=1.5), r"target\[0\]\.max_answer_share: .*less than or equal"),
    (lambda d: d["target"][0].update(max_answer_share="0.25"), r"target\[0\]\.max_answer_share"),
    (lambda d: d["target"][0].update(max_answer_share=0.01), r"target\[0\]\.max_answer_share: .*less than one row"),
    (lambda d: d["source"][0].update(max_answer_share=0.5), r"source: \[0\]: max_answer_share applies to target"),
])
def test_bad_shares_name_the_field(edit, message):
    data = _data()
    edit(data)
    with pytest.raises(BadTestbed, match=message):
        parse_testbed(data)


def test_a_share_of_one_is_no_cap():
    spec = parse_testbed(_data(share=1))
    uncapped = copy.deepcopy(_data())
    del uncapped["target"][0]["max_answer_share"]
    assert spec.target[0].answer_cap == 80
    capped, plain = tb._build(spec), tb._build(parse_testbed(uncapped))
    # the same rows (the split is stratified by answer on a capped entry, so it may differ)
    assert sorted(capped.feedback + capped.test, key=lambda e: e.id) == sorted(plain.feedback + plain.test,
                                                                                key=lambda e: e.id)


def test_an_unreachable_share_is_refused_naming_the_entry_and_the_share_reached():
    # one- or two-word texts: the counts are 1, 2, 3 and a few 4s, so no 40 rows spread over 10 answers
    data = _data(share=0.1, size=40, config={"min_words": 1, "max_words": 2})
    with pytest.raises(BadTestbed, match=r"target\[0\]\.max_answer_share: 0\.1 is not reachable: after 800 draws "
                                         r"the lowest commonest-answer share 40 rows could have is 0\.\d+"):
        tb._build(parse_testbed(data))
