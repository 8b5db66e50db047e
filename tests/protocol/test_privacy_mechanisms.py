"""The release mechanism: noise calibration, clamping, public denominator, replay."""

from __future__ import annotations

import math

import numpy as np
import pytest

from protocol.privacy import (
    NoiseSource,
    SampledGaussianEvent,
    SecureRandom,
    SeededRandom,
    effective_noise_multiplier,
    noise_std_for_multiplier,
    noisy_mean_release,
    poisson_subsample,
    released_noise_std,
    replay_release,
)


def test_both_sources_implement_the_protocol() -> None:
    assert isinstance(SecureRandom(), NoiseSource)
    assert isinstance(SeededRandom(0), NoiseSource)


def test_released_noise_std_matches_z_over_expected_size() -> None:
    # 20,000 independent releases of the same data (one row per release). The sample std
    # of n normal draws has relative standard error 1/sqrt(2n) = 0.5%; we allow 3% (6 SE).
    z, expected_size, releases = 3.0, 200.0, 20_000
    scores = np.full((releases, 200), 0.5)  # true mean 0.5: far from the clamps
    released, draws = noisy_mean_release(scores, expected_size, z, SeededRandom(1234))
    target_std = z / expected_size
    assert released_noise_std(z, expected_size) == pytest.approx(target_std)
    assert np.std(released) == pytest.approx(target_std, rel=0.03)
    assert np.mean(released) == pytest.approx(0.5, abs=5 * target_std / math.sqrt(releases))
    assert np.std(draws) == pytest.approx(z, rel=0.03)


def test_secure_random_noise_has_the_requested_std() -> None:
    draws = SecureRandom().normal(2.0, 4000)
    assert draws.shape == (4000,) and draws.dtype == np.float64
    # relative SE of the sample std is 1.1%; 6 SE tolerance.
    assert np.std(draws) == pytest.approx(2.0, rel=0.07)
    assert abs(np.mean(draws)) < 6 * 2.0 / math.sqrt(4000)


@pytest.mark.parametrize("source", [SecureRandom(), SeededRandom(7)], ids=["secure", "seeded"])
def test_bernoulli_mask_rate_and_extremes(source: NoiseSource) -> None:
    mask = source.bernoulli_mask(20_000, 0.1)
    assert mask.dtype == bool and mask.shape == (20_000,)
    assert mask.mean() == pytest.approx(0.1, abs=6 * math.sqrt(0.1 * 0.9 / 20_000))
    assert source.bernoulli_mask(100, 1.0).all()
    assert not source.bernoulli_mask(100, 0.0).any()
    with pytest.raises(ValueError):
        source.bernoulli_mask(10, 1.5)


def test_secure_random_aliases() -> None:
    source = SecureRandom()
    assert isinstance(source.gauss(1.0, 0.0), float) and source.gauss(1.0, 0.0) == 1.0
    assert source.poisson_mask(50, 1.0).all()


def test_poisson_subsample_is_fresh_and_has_expected_size() -> None:
    source = SeededRandom(3)
    sizes = [len(poisson_subsample(2000, 0.1, source)) for _ in range(200)]
    assert np.mean(sizes) == pytest.approx(200, abs=6 * math.sqrt(180 / 200))
    first, second = poisson_subsample(2000, 0.1, source), poisson_subsample(2000, 0.1, source)
    assert not np.array_equal(first, second)
    with pytest.raises(ValueError):
        poisson_subsample(10, 0.0, source)


def test_divides_by_public_expected_size_not_true_size() -> None:
    # 50 sampled prompts, all correct, expected size 100: the release is 0.5, not 1.0.
    released, draws = noisy_mean_release(np.ones((1, 50)), 100.0, 0.0, SeededRandom(0))
    assert released.tolist() == [0.5] and draws.tolist() == [0.0]


def test_scores_are_clamped_before_summing() -> None:
    scores = np.array([[5.0, -3.0, 1.0, 0.0]])  # clamped to 1, 0, 1, 0 -> sum 2
    released, _ = noisy_mean_release(scores, 4.0, 0.0, SeededRandom(0))
    assert released.tolist() == [0.5]


def test_released_values_are_clamped_to_unit_interval() -> None:
    released, draws = noisy_mean_release(np.full((400, 10), 0.5), 10.0, 100.0, SeededRandom(5))
    assert released.min() == 0.0 and released.max() == 1.0
    assert np.all((released >= 0) & (released <= 1))
    assert np.abs(draws).max() > 10  # the clamps were actually exercised


def test_replay_reproduces_the_release_exactly() -> None:
    scores = SeededRandom(9).normal(1.0, 3 * 40).reshape(3, 40).clip(0, 1)
    released, draws = noisy_mean_release(scores, 40.0, 2.5, SecureRandom())
    assert np.array_equal(replay_release(scores, 40.0, draws), released)


def test_each_candidate_gets_independent_noise() -> None:
    _, draws = noisy_mean_release(np.zeros((3, 10)), 10.0, 1.0, SeededRandom(2))
    assert len(set(draws.tolist())) == 3


@pytest.mark.parametrize(
    "scores, expected_size, std",
    [
        (np.zeros(5), 10.0, 1.0),  # not 2-D
        (np.zeros((0, 5)), 10.0, 1.0),  # no candidate
        (np.array([[0.5, np.nan]]), 10.0, 1.0),
        (np.zeros((1, 5)), 0.0, 1.0),
        (np.zeros((1, 5)), float("inf"), 1.0),
        (np.zeros((1, 5)), 10.0, -1.0),
    ],
)
def test_bad_release_inputs_are_refused(scores: np.ndarray, expected_size: float, std: float) -> None:
    with pytest.raises(ValueError):
        noisy_mean_release(scores, expected_size, std, SeededRandom(0))


def test_nan_error_message_does_not_echo_scores() -> None:
    with pytest.raises(ValueError) as caught:
        noisy_mean_release(np.array([[0.123456, np.nan]]), 10.0, 1.0, SeededRandom(0))
    assert "0.123456" not in str(caught.value)


def test_replay_refuses_wrong_number_of_draws() -> None:
    with pytest.raises(ValueError, match="shape"):
        replay_release(np.zeros((2, 4)), 4.0, np.zeros(3))


def test_multi_candidate_sensitivity() -> None:
    assert effective_noise_multiplier(6.0, 4) == pytest.approx(3.0)
    assert noise_std_for_multiplier(3.0, 4) == pytest.approx(6.0)
    assert effective_noise_multiplier(noise_std_for_multiplier(2.2, 7), 7) == pytest.approx(2.2)
    with pytest.raises(ValueError):
        effective_noise_multiplier(1.0, 0)
    # The sqrt(k) claim: removing one prompt moves the k-vector of sums by at most sqrt(k).
    rng = np.random.default_rng(0)
    for _ in range(100):
        scores = rng.random((5, 30))
        delta = np.linalg.norm(scores.sum(axis=1) - scores[:, 1:].sum(axis=1))
        assert delta <= math.sqrt(5) + 1e-12


class TestSampledGaussianEvent:
    def test_valid_and_round_trip(self) -> None:
        event = SampledGaussianEvent(2, 1, 3)
        assert event.noise_multiplier == 2.0 and isinstance(event.noise_multiplier, float)
        assert SampledGaussianEvent.from_dict(event.to_dict()) == event
        assert event.repeated(4) == SampledGaussianEvent(2.0, 1.0, 12)

    @pytest.mark.parametrize(
        "args, field",
        [
            ((0.0, 0.1), "noise_multiplier"),
            ((-1.0, 0.1), "noise_multiplier"),
            ((float("nan"), 0.1), "noise_multiplier"),
            ((True, 0.1), "noise_multiplier"),
            ((1.0, 0.0), "sample_rate"),
            ((1.0, 1.01), "sample_rate"),
            ((1.0, 0.1, 0), "count"),
            ((1.0, 0.1, 1.5), "count"),
        ],
    )
    def test_invalid_fields_are_named(self, args: tuple, field: str) -> None:
        with pytest.raises((TypeError, ValueError), match=field):
            SampledGaussianEvent(*args)

    def test_frozen(self) -> None:
        event = SampledGaussianEvent(1.0, 0.5)
        with pytest.raises(AttributeError):
            event.count = 2  # type: ignore[misc]

    def test_from_dict_rejects_unknown_and_missing_fields(self) -> None:
        with pytest.raises(ValueError, match="unknown"):
            SampledGaussianEvent.from_dict({"noise_multiplier": 1, "sample_rate": 1, "sigma": 2})
        with pytest.raises(ValueError, match="missing"):
            SampledGaussianEvent.from_dict({"noise_multiplier": 1})


def test_content_seeded_noise_depends_on_the_request_not_on_the_order_of_releases():
    """Issue 42: a simulated owner's release draws the same subsample and noise whenever it is asked,
    so releases charged in another order (timing) give the same run; a repeat draws afresh."""
    from protocol.privacy.mechanisms import ContentSeededRandom, SecureRandom, release_source

    def draws(source, key):
        keyed = release_source(source, key)
        return keyed.bernoulli_mask(50, 0.5).tolist(), keyed.normal(1.0, 3).tolist()

    first, second = ContentSeededRandom(7), ContentSeededRandom(7)
    a1, b1 = draws(first, "a"), draws(first, "b")
    b2, a2 = draws(second, "b"), draws(second, "a")
    assert (a1, b1) == (a2, b2) and a1 != b1
    assert draws(first, "a") != a1  # the same request again: fresh draws (the second of its kind)
    assert draws(ContentSeededRandom(8), "a") != a1
    secure = SecureRandom()
    assert release_source(secure, "a") is secure
