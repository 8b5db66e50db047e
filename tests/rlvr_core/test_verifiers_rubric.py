"""Rubric graders (issue 43): the exact grader scores the fraction of items met; the noisy grader's
three noise kinds (misjudged items, a random subset checked, score jitter) have the statistics
their options imply, at a fixed seed; bad options and bad rows are refused naming the field."""

from __future__ import annotations

import itertools
import math
import re

import numpy as np
import pytest
from pydantic import ValidationError

from rlvr_core.tasks.example import Example
from rlvr_core.verifiers.base import get_verifier, make_verifier
from rlvr_core.verifiers.draws import DrawKey

ITEMS = [{"name": "correct", "answer": "3"}, {"name": "starts_with", "char": "#"},
         {"name": "ends_with", "char": "!"}, {"name": "max_length", "chars": 4}, {"name": "forbidden", "char": "7"}]
ROW = Example(id="rubric-row", prompt="How many? Rules: ...", answer="#3!", verifier="rubric",
              metadata={"rubric": ITEMS})
K = len(ITEMS)
# completion -> items met (of 5): correct, starts_with, ends_with, max_length, forbidden
MET = {"#3!": 5, "#3": 4, "3": 3, "@4!": 3, "#77777!": 2, "": 0}


@pytest.mark.parametrize("completion,met", MET.items())
def test_exact_grader_scores_the_fraction_of_items_met(completion, met):
    assert get_verifier("rubric").score(completion, ROW) == pytest.approx(met / K)


def test_exact_grader_reads_the_answer_line_and_whole_tokens():
    exact = get_verifier("rubric")
    assert exact.score("Answer: #3!\nand more", ROW) == 1.0      # the line after an echoed "Answer:"
    assert exact.score("#13!", ROW) == pytest.approx(4 / 5)    # "13" does not hold the answer "3"
    assert not exact.noisy and make_verifier("rubric_grader").noisy


def _draws(options: dict, completion: str, n: int = 4000, seed: int = 11) -> np.ndarray:
    grader = make_verifier({"name": "rubric_grader", **options})
    return np.array([grader.score_draws(completion, ROW, DrawKey.of(seed, ROW.id, k), 2) for k in range(n)])


def _misjudge_mae(met: int, rate: float) -> float:
    """E|noisy - exact| when each of K verdicts flips with probability `rate`: (U - M) / K with
    M ~ Bin(met, rate) met items misjudged unmet, U ~ Bin(K - met, rate) the other way."""
    def pmf(n, j):
        return math.comb(n, j) * rate**j * (1 - rate) ** (n - j)
    return sum(pmf(met, m) * pmf(K - met, u) * abs(u - m) / K for m in range(met + 1) for u in range(K - met + 1))


def _subset_mae(verdicts: list[bool], fraction: float) -> float:
    """E|mean over the checked subset - exact|, enumerating the subsets (none kept: one at random)."""
    exact = sum(verdicts) / K
    total = 0.0
    for keep in itertools.product([False, True], repeat=K):
        p = math.prod(fraction if kept else 1 - fraction for kept in keep)
        if not any(keep):
            total += p * sum(abs(v - exact) for v in verdicts) / K
        else:
            seen = [v for v, kept in zip(verdicts, keep) if kept]
            total += p * abs(sum(seen) / len(seen) - exact)
    return total


@pytest.mark.parametrize("rate", [0.1, 0.2])
def test_misjudged_items_give_the_error_their_rate_implies(rate):
    draws = _draws({"misjudge_rate": rate, "check_fraction": 1.0, "jitter_std": 0.0}, "3")  # 3 of 5 met
    exact = 3 / K
    assert np.abs(draws - exact).mean() == pytest.approx(_misjudge_mae(3, rate), abs=0.01)
    # unbiased in the verdicts, so the mean moves towards 1/2: E = s (1 - r) + (1 - s) r
    assert draws.mean() == pytest.approx(exact * (1 - rate) + (1 - exact) * rate, abs=0.01)


@pytest.mark.parametrize("fraction", [0.5, 0.8])
def test_a_random_subset_of_items_is_unbiased_with_the_error_its_fraction_implies(fraction):
    draws = _draws({"misjudge_rate": 0.0, "check_fraction": fraction, "jitter_std": 0.0}, "3")
    verdicts = [True, False, False, True, True]  # "3": correct, max_length, forbidden met
    assert draws.mean() == pytest.approx(3 / K, abs=0.01)
    assert np.abs(draws - 3 / K).mean() == pytest.approx(_subset_mae(verdicts, fraction), abs=0.01)


def test_score_jitter_has_the_half_normal_error_of_its_std():
    draws = _draws({"misjudge_rate": 0.0, "check_fraction": 1.0, "jitter_std": 0.05}, "3")  # exact 0.6
    assert np.abs(draws - 0.6).mean() == pytest.approx(0.05 * math.sqrt(2 / math.pi), abs=0.003)
    assert draws.mean() == pytest.approx(0.6, abs=0.003)
    assert np.corrcoef(draws[:, 0], draws[:, 1])[0, 1] == pytest.approx(0.0, abs=0.05)  # independent draws


def test_the_family_levels_are_ordered_and_draws_are_keyed_by_seed_row_sample_draw():
    from rlvr_core.tasks.testbed import load_testbed

    errors = []
    for name in ("rubric_low", "rubric", "rubric_high"):
        options = {k: v for k, v in load_testbed(name).source_grader.items() if k != "name"}
        errors.append(np.mean([np.abs(_draws(options, c, n=800) - MET[c] / K).mean() for c in MET]))
    assert errors[0] < errors[1] < errors[2]
    grader = make_verifier({"name": "rubric_grader", "misjudge_rate": 0.2, "check_fraction": 0.5})
    key = DrawKey.of(3, ROW.id, 1)
    first = grader.score_draws("3", ROW, key, 4)
    assert grader.score_draws("3", ROW, key, 4) == first and grader.score_draws("3", ROW, key, 2) == first[:2]
    assert grader.score("3", ROW) == grader.score_draws("3", ROW, DrawKey.of(0, ROW.id, 0), 1)[0]


@pytest.mark.parametrize("spec,field", [
    ({"name": "rubric_grader", "misjudge_rate": 0.7}, "misjudge_rate"),
    ({"name": "rubric_grader", "check_fraction": 0.0}, "check_fraction"),
    ({"name": "rubric_grader", "jitter_std": -0.1}, "jitter_std"),
    ({"name": "rubric_grader", "misjudge": 0.1}, "misjudge"),
    ({"name": "rubric_grader", "misjudge_rate": "0.1"}, "misjudge_rate"),
])
def test_a_bad_grader_option_is_refused_naming_it(spec, field):
    with pytest.raises(ValidationError) as error:
        make_verifier(spec)
    assert error.value.errors()[0]["loc"] == (field,)


@pytest.mark.parametrize("metadata,where", [
    ({}, "metadata['rubric']"),
    ({"rubric": []}, "metadata['rubric']"),
    ({"rubric": [{"name": "correct", "answer": "3"}, {"name": "shouting"}]}, "metadata['rubric'][1].name"),
    ({"rubric": [{"name": "max_length", "chars": 0}]}, "metadata['rubric'][0].chars"),
    ({"rubric": [{"name": "starts_with", "char": "#", "secret": 1}]}, "metadata['rubric'][0].secret"),
])
def test_a_row_without_valid_items_is_refused_at_load_naming_the_field(metadata, where):
    row = Example(id="r", prompt="p", answer="#3!", verifier="rubric", metadata=metadata)
    for name in ("rubric", "rubric_grader"):
        with pytest.raises(ValueError, match=re.escape(where)):
            make_verifier(name).check_example(row)
