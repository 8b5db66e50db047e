"""Multi-domain testbeds in DataFlex-RL's shape (seed 001): target benchmarks grouped into
families, named summaries, and the built-in `dataflex` testbed."""

from __future__ import annotations

from collections import Counter

import pytest

from rlvr_core.tasks import testbed as tb
from rlvr_core.tasks.testbed import benchmark_families, build_testbed_data, load_testbed, parse_testbed, target_composition

ADD = {"task": "basic_arithmetic", "config": {"operators": ["+"], "min_terms": 2, "max_terms": 2,
                                              "allow_parentheses": False}}


def spec(targets, summaries=None):
    raw = {"name": "mine", "seed": 1, "feedback_fraction": 0.5,
           "source": [{**ADD, "domain": "math", "size": 5}],
           "target": [{**ADD, "size": 4, **t} for t in targets]}
    if summaries is not None:
        raw["summaries"] = summaries
    return parse_testbed(raw, origin="mine.toml")


def test_families_group_benchmarks_and_default_to_the_domain():
    two = spec([{"domain": "math_a", "family": "math"}, {"domain": "math_b", "family": "math"},
                {"domain": "logic_a", "family": "logic"}], summaries={"heavy": ["math_a", "math_b"]})
    assert benchmark_families(two) == {"logic_a": "logic", "math_a": "math", "math_b": "math"}
    assert target_composition(two) == pytest.approx({"logic": 1 / 3, "math": 2 / 3})
    assert two.summaries == {"heavy": ["math_a", "math_b"]}
    plain = load_testbed("default")
    assert benchmark_families(plain) == {"count": "count"} and plain.summaries == {}


@pytest.mark.parametrize(("targets", "summaries", "message"), [
    ([{"domain": "a"}], {"heavy": ["b"]}, "summaries: .*summary 'heavy' names \\['b'\\], which are not target domains"),
    ([{"domain": "a"}], {"heavy": []}, "summary 'heavy' lists no benchmark"),
    ([{"domain": "a"}], {"heavy": ["a", "a"]}, "lists a benchmark twice"),
    ([{"domain": "a"}], {"bad name": ["a"]}, "summary name 'bad name'"),
    ([{"domain": "a", "family": "x"}, {"domain": "a", "family": "y"}], None,
     "target: .*target domain 'a' is in family 'x' in an earlier entry and 'y' here"),
    ([{"domain": "a", "family": "not ok"}], None, "target\\[0\\]\\.family"),
])
def test_bad_families_and_summaries_name_the_field(targets, summaries, message):
    with pytest.raises(tb.TestbedError, match=message):
        spec(targets, summaries)


def test_the_dataflex_testbed_has_three_equal_source_domains_and_several_benchmarks_each():
    dataflex = load_testbed("dataflex")
    sizes = Counter()
    for entry in dataflex.source:
        sizes[entry.domain] += entry.size
    assert sizes == {"math": 1200, "logic": 1200, "text": 1200}
    families = benchmark_families(dataflex)
    per_family = Counter(families.values())
    assert per_family == {"math": 4, "logic": 3, "text": 2}
    assert set(dataflex.summaries["math_heavy"]) == {b for b, f in families.items() if f == "math"} | {"text_count"}
    data = build_testbed_data(dataflex)
    assert {e.domain for e in data.test} == set(families) and {e.domain for e in data.source} == set(sizes)
    assert {e.domain for e in data.feedback} == set(families)  # L2RR's feedback spans every benchmark
    assert "stands in" in dataflex.description.lower()
