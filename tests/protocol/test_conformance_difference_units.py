"""Unit tests of the difference-release conformance parts: the suite's exact model of an owner's
teacher-forced completion probabilities (checked against the project's own engine), fixed-distribution
checkpoints keyed by token id, the known-mean chi-square interval and the option that sizes it."""

from __future__ import annotations

import numpy as np
import pytest

from protocol.conformance.checkpoints import EOS_TOKEN, write_checkpoint
from protocol.conformance.checks.differences import CLIP_ANSWERS, uniform_over
from protocol.conformance.fixed_output_model import (
    EOS_ID,
    _vocab,
    completion_ids,
    completion_probability,
    fixed_distribution_files,
)
from protocol.conformance.noise_stats import known_mean_variance_interval
from protocol.conformance.options import SuiteOptions


def test_eos_id_is_the_suite_tokenizers_and_ids_key_a_fixed_distribution():
    assert _vocab()[EOS_TOKEN] == EOS_ID
    assert completion_ids(" 7")[-1] == EOS_ID
    fixed_distribution_files({EOS_ID: 0.5, "7": 0.5}, 64)  # a text and an id in one distribution
    with pytest.raises(ValueError, match="outside the suite's vocabulary"):
        fixed_distribution_files({10**6: 1.0}, 64)
    assert completion_probability({1: 0.5, 2: 0.25}, [1, 2, 1]) == pytest.approx(0.0625)
    assert completion_probability({1: 0.5}, [1, 3]) == 0.0


def test_the_suites_completion_probabilities_are_what_the_owners_engine_computes(tmp_path):
    """clip_honoured's exact d_i: the project's engine encodes each reference answer as completion_ids
    does, and teacher-forces it to the probability completion_probability predicts."""
    from protocol.validation import validate_checkpoint_dir
    from rlvr_core.engines.registry import build_engine
    from rlvr_core.models.loading import load_policy

    completions = {a: completion_ids(f" {a}") for a in set(CLIP_ANSWERS)}
    distribution = uniform_over(completions["3"])
    path = write_checkpoint(fixed_distribution_files(distribution, 128), tmp_path / "base")
    validate_checkpoint_dir(path)
    model, tokenizer = load_policy(path)
    engine = build_engine("transformers", model, tokenizer, device="cpu", batch_size=4)
    answers = sorted(completions)
    tokens = max(len(ids) for ids in completions.values())
    encoded = engine.encode_completions([f" {a}" for a in answers], tokens)
    assert [list(ids) for ids in encoded] == [completions[a] for a in answers]
    prompts = engine.encode_prompts(["Row 1: say a digit."] * len(answers), tokens)
    logprobs = engine.completion_logprobs(prompts, [[ids] for ids in encoded], 1.0, tokens)
    expected = [completion_probability(distribution, completions[a]) for a in answers]
    assert np.exp(logprobs[:, 0]) == pytest.approx(expected, abs=1e-6)
    assert expected[answers.index("3")] == pytest.approx(1 / 27) and expected[answers.index("7")] == 0.0


def test_known_mean_interval_has_its_false_failure_rate_and_catches_miscalibrated_noise():
    releases, alpha = 32, 0.01
    low, high = known_mean_variance_interval(releases, alpha)
    rng = np.random.default_rng(5)
    ratios = (rng.standard_normal((40_000, releases)) ** 2).mean(axis=1)
    assert abs(((ratios < low) | (ratios > high)).mean() - alpha) < 0.3 * alpha
    strict_low, strict_high = known_mean_variance_interval(releases, 1e-4)
    clip = 0.05  # noise calibrated to 1 has variance 1/clip^2 times the declared; to clip/10, 1/100 of it
    assert 1 / clip**2 > strict_high * 10 and 0.01 < strict_low / 10


def test_difference_noise_releases_option_is_validated(tmp_path):
    with pytest.raises(ValueError, match="difference_noise_releases"):
        SuiteOptions(target="h:1", ca=tmp_path, cert=tmp_path, key=tmp_path, difference_noise_releases=5)
    assert SuiteOptions(target="h:1", ca=tmp_path, cert=tmp_path, key=tmp_path).difference_noise_releases == 32
