"""Noisy graders (issue 19): registered verifiers with typed options, several draws per response,
randomness keyed only by (seed, row key, sample index, draw index), and their noise rates."""

from __future__ import annotations

import numpy as np
import pytest
from pydantic import ValidationError

from rlvr_core.tasks import testbed as testbeds
from rlvr_core.tasks.example import Example
from rlvr_core.verifiers.base import get_verifier, make_verifier, score_draws_safely
from rlvr_core.verifiers.draws import DrawKey
from rlvr_core.verifiers.graders import make_grader, repeat_reward

EXAMPLE = Example(id="row-1", prompt="Calculate 9 + 12.", answer="21")
SPECS = [{"name": "noisy_flip", "flip_rate": 0.3}, {"name": "stochastic_grader", "noise_std": 0.4},
         {"name": "partial_checks", "check_fraction": 0.5}]


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s["name"])
def test_draws_are_a_function_of_seed_row_sample_and_draw_only(spec):
    verifier = make_verifier(spec)
    key = DrawKey.of(5, EXAMPLE.id, 3)
    first = verifier.score_draws("27", EXAMPLE, key, 4)
    assert verifier.score_draws("27", EXAMPLE, key, 4) == first          # a replay scores the same
    assert make_verifier(spec).score_draws("27", EXAMPLE, key, 2) == first[:2]  # draw d does not depend on how many
    others = {verifier.score_draws("27", EXAMPLE, DrawKey.of(5, EXAMPLE.id, k), 4) for k in range(40)}
    assert len(others) > 1  # other samples draw otherwise
    # another row scored in between changes nothing (no shared stream)
    verifier.score_draws("5", Example(id="row-2", prompt="p", answer="5"), DrawKey.of(5, "row-2", 3), 4)
    assert verifier.score_draws("27", EXAMPLE, key, 4) == first


def _rate(spec, completion: str, n: int = 4000) -> np.ndarray:
    verifier = make_verifier(spec)
    return np.array([verifier.score_draws(completion, EXAMPLE, DrawKey.of(1, EXAMPLE.id, k), 2) for k in range(n)])


def test_flip_noise_is_calibrated_and_draws_are_independent():
    right, wrong = _rate(SPECS[0], "21"), _rate(SPECS[0], "20")
    assert 1 - right.mean() == pytest.approx(0.3, abs=0.025)   # P(correct scored 0) = flip_rate
    assert wrong.mean() == pytest.approx(0.3, abs=0.025)       # P(wrong scored 1) = flip_rate
    both = ((right[:, 0] == 0) & (right[:, 1] == 0)).mean()
    assert both == pytest.approx(0.09, abs=0.02)               # independent draws: 0.3 * 0.3


def test_stochastic_grader_is_centred_noise_around_the_exact_score():
    draws = _rate(SPECS[1], "20")  # exact 0: half the draws clamp to 0, the rest are |N(0, 0.4)|
    assert (draws == 0).mean() == pytest.approx(0.5, abs=0.03)
    assert draws[draws > 0].mean() == pytest.approx(0.4 * np.sqrt(2 / np.pi), abs=0.03)


def test_partial_checks_pass_wrong_answers_that_fail_only_unsampled_checks():
    assert _rate(SPECS[2], "21").mean() == 1.0              # every check of a right answer passes
    near = _rate(SPECS[2], "27").mean()                     # fails one of 3 checks (the last digit)
    # passes when the failing check is not drawn: (1/2 - 1/8) with some check drawn, + 1/8 * 2/3 with none
    assert near == pytest.approx((0.5 - 1 / 8) + 1 / 8 * 2 / 3, abs=0.04)
    assert _rate(SPECS[2], "").mean() == 0.0
    exact = make_verifier({"name": "partial_checks", "check_fraction": 1.0})
    assert exact.score_draws("27", EXAMPLE, DrawKey.of(0, "x", 0), 3) == (0.0, 0.0, 0.0)


def test_a_one_score_verifier_is_valid_through_the_default_adapter():
    key = DrawKey.of(0, EXAMPLE.id, 0)
    assert get_verifier("exact_match").score_draws("21", EXAMPLE, key, 3) == (1.0, 1.0, 1.0)
    assert make_grader(None)("20", EXAMPLE, key, 2) == (0.0, 0.0)
    assert repeat_reward(lambda text, example: 0.25)("x", EXAMPLE, key, 2) == (0.25, 0.25)
    assert not get_verifier("exact_match").noisy and get_verifier("noisy_flip").noisy


def test_a_failing_draw_scores_zero_like_score_example():
    class Broken:
        name = "broken"

        def score_draws(self, *args):
            raise RuntimeError("quotes the answer 21")

    assert score_draws_safely(Broken(), "21", EXAMPLE, DrawKey.of(0, "a", 0), 2) == (0.0, 0.0)


def test_bad_grader_options_name_the_field():
    with pytest.raises(ValidationError, match=r"flip_rate[\s\S]*less than 0.5"):
        make_verifier({"name": "noisy_flip", "flip_rate": 0.7})
    with pytest.raises(ValidationError, match=r"flip_rat\n[\s\S]*did you mean 'flip_rate'"):
        make_verifier({"name": "noisy_flip", "flip_rat": 0.1})
    with pytest.raises(ValidationError, match=r"base[\s\S]*noisy itself"):
        make_verifier({"name": "noisy_flip", "base": "partial_checks"})
    with pytest.raises(ValidationError, match=r"name[\s\S]*unknown verifier 'nosy'"):
        make_verifier({"name": "nosy"})
    with pytest.raises(ValidationError, match=r"flip_rate[\s\S]*takes no options"):
        make_verifier({"name": "exact_match", "flip_rate": 0.1})


def test_a_testbed_declares_its_source_grader_and_a_bad_one_names_the_field():
    spec = testbeds.load_testbed("noisy")
    assert spec.source_grader is not None
    make_verifier(spec.source_grader)
    data = spec.model_dump()
    data["source_grader"] = {"name": "noisy_flip", "flip_rate": 0.9}
    with pytest.raises(testbeds.TestbedError, match=r"<t>: source_grader: flip_rate: .*less than 0.5"):
        testbeds.parse_testbed(data, origin="<t>")


def test_the_run_config_can_override_the_grader_and_names_the_field():
    from trainer_node.config import DataConfig

    assert DataConfig(grader="exact").grader == "exact"
    with pytest.raises(ValidationError, match=r"grader\.flip_rate"):
        DataConfig(grader={"name": "noisy_flip", "flip_rate": 2.0})
