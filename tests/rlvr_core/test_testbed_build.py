"""Building testbed data: determinism, disjoint splits, ids, metadata, and gold answers that
the reasoning_gym verifier scores 1.0."""

from __future__ import annotations

import json
import time
from collections import Counter

import pytest

from rlvr_core.tasks import testbed as testbed_module
from rlvr_core.tasks.testbed import build_testbed_data, cluster_of, load_testbed
from rlvr_core.verifiers import score_example


@pytest.fixture(scope="module")
def small():
    spec = load_testbed("small")
    return spec, build_testbed_data(spec)


def test_small_sizes_and_split(small):
    spec, data = small
    assert len(data.source) == sum(entry.size for entry in spec.source)
    target_size = sum(entry.size for entry in spec.target)
    assert len(data.feedback) + len(data.test) == target_size
    assert len(data.feedback) >= 100, "the owner refuses held-out sets below 100 rows"
    for domain in {entry.domain for entry in spec.target}:
        in_domain = sum(entry.size for entry in spec.target if entry.domain == domain)
        feedback = sum(1 for example in data.feedback if example.domain == domain)
        assert feedback == round(in_domain * spec.feedback_fraction), "split is stratified by domain"


def test_no_overlap_between_source_feedback_and_test(small):
    _, data = small
    source = {e.prompt for e in data.source}
    feedback = {e.prompt for e in data.feedback}
    test = {e.prompt for e in data.test}
    assert not source & feedback and not source & test and not feedback & test
    assert len(feedback) == len(data.feedback) and len(test) == len(data.test)
    ids = [e.id for e in data.source + data.feedback + data.test]
    assert len(set(ids)) == len(ids)


def test_examples_are_well_formed(small):
    spec, data = small
    first = data.source[0]
    assert first.id == f"src-{spec.source[0].task}-0-0"
    assert data.feedback[0].id.startswith("tgt-") or data.test[0].id.startswith("tgt-")
    for example in data.source + data.feedback + data.test:
        assert example.verifier == "reasoning_gym"
        assert set(example.metadata) == {"rg", "difficulty"}
        json.dumps(example.to_json())  # JSON-serialisable, tuples turned into lists
    clusters = Counter(cluster_of(e) for e in data.source)
    expected = Counter()
    for entry in spec.source:
        expected[f"{entry.domain}:{entry.difficulty}" if entry.difficulty else entry.domain] += entry.size
    assert clusters == expected


def test_build_is_deterministic_and_seed_dependent(small, monkeypatch):
    spec, data = small
    monkeypatch.setattr(testbed_module, "_BUILD_CACHE", {})
    again = build_testbed_data(spec)
    assert again is not data
    assert [e.to_json() for e in again.source + again.feedback + again.test] == [
        e.to_json() for e in data.source + data.feedback + data.test
    ]
    other = build_testbed_data(spec.model_copy(update={"seed": spec.seed + 1}))
    assert [e.prompt for e in other.source] != [e.prompt for e in data.source]


def test_build_is_cached(small):
    spec, data = small
    assert build_testbed_data(spec) is data


@pytest.mark.parametrize("name", testbed_module.testbed_names())
def test_every_builtin_builds_quickly_and_gold_answers_score_one(name):
    spec = load_testbed(name)
    started = time.perf_counter()
    data = build_testbed_data(spec)
    elapsed = time.perf_counter() - started
    assert elapsed < 20.0, f"{name} took {elapsed:.1f}s to build"
    assert len(data.feedback) >= 100
    # Every (task, config) pair, scored through a JSON round trip of its metadata.
    seen = set()
    for example in data.source + data.feedback + data.test:
        key = (example.task, example.domain, example.metadata["difficulty"])
        if key in seen:
            continue
        seen.add(key)
        restored = type(example)(**{**example.to_json(), "metadata": json.loads(json.dumps(example.metadata))})
        assert score_example(" " + restored.answer + "\n", restored) == 1.0, key
        assert score_example("", restored) == 0.0
