"""Accountants: known figures, our own state format, what-if queries, budget arithmetic.

Known figures come from /work/shared/research/privacy-anchors.md (opacus 1.6 / Flower's
dp-accounting agree on them).
"""

from __future__ import annotations

import itertools
import json

import pytest

from protocol.privacy import (
    ACCOUNTANTS,
    Accountant,
    AccountingError,
    SampledGaussianEvent,
    accountant_names,
    build_accountant,
    calibrate_noise_multiplier,
    releases_remaining,
)
from protocol.privacy import accountants as accountants_module
from protocol.privacy.accountants import PrvAccountant, check_accountant_name

DELTA = 1e-6
# Cheap for both accountants (PRV's cost grows with the number of releases).
SMALL = SampledGaussianEvent(noise_multiplier=5.0, sample_rate=0.1, count=20)


def test_registry_names() -> None:
    assert accountant_names() == ("prv", "rdp")
    for name in accountant_names():
        assert build_accountant(name).name == name


def test_unknown_accountant_lists_known_names() -> None:
    with pytest.raises(ValueError, match="unknown accountant 'gdp'; known: prv, rdp"):
        build_accountant("gdp")
    with pytest.raises(ValueError, match="known: prv, rdp"):
        build_accountant(["rdp"])  # type: ignore[arg-type]  (not a name at all)
    with pytest.raises(ValueError, match="known: prv, rdp"):
        check_accountant_name("RDP")
    assert check_accountant_name("prv") == "prv"


def test_duplicate_and_foreign_registrations_are_refused() -> None:
    with pytest.raises(ValueError, match="already registered"):
        ACCOUNTANTS.register("rdp")(type("Other", (Accountant,), {"_epsilon": lambda self, e, d: 0.0}))
    with pytest.raises(TypeError, match="not a subclass of Accountant"):
        ACCOUNTANTS.copy().register("dict")(dict)


@pytest.mark.parametrize("entry", list(ACCOUNTANTS), ids=lambda entry: entry.name)
def test_every_accountant_declares_whether_its_budget_check_is_a_privacy_filter(entry) -> None:
    assert isinstance(entry.value.valid_privacy_filter, bool)
    assert build_accountant(entry.name).state_dict()["accountant"] == entry.name


def test_rdp_is_a_privacy_filter_and_prv_is_not() -> None:
    # docs/PRIVACY.md: the pre-release budget check is a filter for Renyi DP, heuristic for PRV.
    assert ACCOUNTANTS.get("rdp").valid_privacy_filter is True
    assert ACCOUNTANTS.get("prv").valid_privacy_filter is False


def test_rdp_known_figure() -> None:
    accountant = build_accountant("rdp")
    accountant.compose(SampledGaussianEvent(5.0, 0.1, 200))
    assert accountant.get_epsilon(DELTA) == pytest.approx(1.361, abs=1e-3)


def test_one_event_with_count_equals_repeated_compose() -> None:
    once, many = build_accountant("rdp"), build_accountant("rdp")
    once.compose(SampledGaussianEvent(5.0, 0.1, 200))
    for _ in range(200):
        many.compose(SampledGaussianEvent(5.0, 0.1))
    assert many.events == once.events  # merged into one (z, q, 200) entry
    assert many.get_epsilon(DELTA) == once.get_epsilon(DELTA)


def test_prv_is_tighter_than_rdp_on_the_known_figure() -> None:
    prv = build_accountant("prv")
    prv.compose(SampledGaussianEvent(5.0, 0.1, 200))
    epsilon = prv.get_epsilon(DELTA)
    assert 1.0 < epsilon < 1.361  # opacus 1.6 gives about 1.27


@pytest.mark.parametrize("name", accountant_names())
def test_empty_history_spends_nothing(name: str) -> None:
    assert build_accountant(name).get_epsilon(DELTA) == 0.0


@pytest.mark.parametrize("name", accountant_names())
def test_state_dict_round_trip_through_json(name: str) -> None:
    accountant = build_accountant(name)
    accountant.compose(SMALL)
    accountant.compose(SampledGaussianEvent(3.0, 0.1, 5))
    state = json.loads(json.dumps(accountant.state_dict()))
    assert state["events"] == [SMALL.to_dict(), {"noise_multiplier": 3.0, "sample_rate": 0.1, "count": 5}]
    restored = build_accountant(name)
    restored.load_state_dict(state)
    assert restored.events == accountant.events
    assert restored.get_epsilon(DELTA) == accountant.get_epsilon(DELTA)


@pytest.mark.parametrize(
    "state, field",
    [
        ({"format": "opacus", "accountant": "rdp", "events": []}, "format"),
        ({"format": "target-feedback-accountant/v1", "accountant": "prv", "events": []}, "accountant"),
        ({"format": "target-feedback-accountant/v1", "accountant": "rdp", "events": {}}, "events"),
        (
            {
                "format": "target-feedback-accountant/v1",
                "accountant": "rdp",
                "events": [{"noise_multiplier": -1, "sample_rate": 0.1}],
            },
            r"events\[0\]",
        ),
    ],
)
def test_bad_state_is_refused_and_changes_nothing(state: dict, field: str) -> None:
    accountant = build_accountant("rdp")
    accountant.compose(SMALL)
    before = accountant.get_epsilon(DELTA)
    with pytest.raises((TypeError, ValueError), match=field):
        accountant.load_state_dict(state)
    assert accountant.events == (SMALL,) and accountant.get_epsilon(DELTA) == before


@pytest.mark.parametrize("name", accountant_names())
def test_epsilon_after_is_a_what_if(name: str) -> None:
    accountant = build_accountant(name)
    accountant.compose(SMALL)
    before = accountant.get_epsilon(DELTA)
    after = accountant.epsilon_after(SMALL, DELTA)
    assert after > before
    assert accountant.events == (SMALL,) and accountant.get_epsilon(DELTA) == before
    accountant.compose(SMALL)
    assert accountant.get_epsilon(DELTA) == pytest.approx(after)


def test_epsilon_is_monotone_in_releases() -> None:
    accountant = build_accountant("rdp")
    epsilons = []
    for _ in range(8):
        accountant.compose(SampledGaussianEvent(3.0, 0.1, 25))
        epsilons.append(accountant.get_epsilon(DELTA))
    assert all(a < b for a, b in itertools.pairwise(epsilons))
    assert accountant.num_releases == 200


def test_bad_delta_is_refused() -> None:
    for delta in (0.0, 1.0, -1e-6):
        with pytest.raises(ValueError, match="delta"):
            build_accountant("rdp").get_epsilon(delta)


def test_calibration_known_figures() -> None:
    z = calibrate_noise_multiplier(4.0, DELTA, 0.1, 500)
    assert z == pytest.approx(3.003, abs=0.01)
    assert z / (0.1 * 2000) == pytest.approx(0.015, abs=1e-3)  # std on the released mean, N=2000
    assert calibrate_noise_multiplier(4.0, DELTA, 1.0, 500) == pytest.approx(28.36, abs=0.05)


# PRV is run without subsampling and few releases: its cost grows as q and z shrink.
@pytest.mark.parametrize("name, sample_rate, releases", [("rdp", 0.1, 500), ("prv", 1.0, 5)])
def test_calibration_round_trip(name: str, sample_rate: float, releases: int) -> None:
    z = calibrate_noise_multiplier(1.0, DELTA, sample_rate, releases, accountant=name)
    accountant = build_accountant(name)
    accountant.compose(SampledGaussianEvent(z, sample_rate, releases))
    spent = accountant.get_epsilon(DELTA)
    assert spent <= 1.0
    assert spent > 1.0 - 0.05  # the search stops within opacus' 0.01 tolerance (+ slack)


@pytest.mark.filterwarnings("ignore::UserWarning", "ignore::RuntimeWarning")  # opacus' own, at q = 1
@pytest.mark.parametrize("name, sample_rate, releases", [("rdp", 0.1, 500), ("prv", 1.0, 5)])
def test_calibration_equals_opacus_search(name: str, sample_rate: float, releases: int) -> None:
    # The search runs on our accountant; for the opacus-backed ones it lands on opacus' own z.
    from opacus.accountants.utils import get_noise_multiplier

    extra = {"eps_error": PrvAccountant.eps_error} if ACCOUNTANTS.get(name) is PrvAccountant else {}
    expected = get_noise_multiplier(
        target_epsilon=1.0, target_delta=DELTA, sample_rate=sample_rate, steps=releases, accountant=name, **extra
    )
    assert calibrate_noise_multiplier(1.0, DELTA, sample_rate, releases, accountant=name) == expected


class _LinearAccountant(Accountant):
    """A toy third-party accountant: epsilon = releases / z (monotone, closed form)."""

    def _epsilon(self, events, delta):
        return sum(event.count / event.noise_multiplier for event in events)


def test_calibration_works_for_any_registered_accountant(monkeypatch: pytest.MonkeyPatch) -> None:
    registry = ACCOUNTANTS.copy()
    registry.register("linear")(_LinearAccountant)
    monkeypatch.setattr(accountants_module, "ACCOUNTANTS", registry)
    z = calibrate_noise_multiplier(2.0, DELTA, 0.5, 10, accountant="linear")
    assert 10 / z <= 2.0 and 10 / z > 2.0 - 0.01  # z just above 5, within the search tolerance
    assert build_accountant("linear").name == "linear"


def test_calibration_refuses_bad_inputs() -> None:
    with pytest.raises(ValueError, match="target_epsilon"):
        calibrate_noise_multiplier(0.0, DELTA, 0.1, 10)
    with pytest.raises(ValueError, match="releases"):
        calibrate_noise_multiplier(1.0, DELTA, 0.1, 0)
    with pytest.raises(ValueError, match="known"):
        calibrate_noise_multiplier(1.0, DELTA, 0.1, 10, accountant="nope")
    with pytest.raises(ValueError, match="budget is too low"):
        calibrate_noise_multiplier(1e-9, DELTA, 1.0, 10)


def test_releases_remaining_matches_calibration() -> None:
    z = calibrate_noise_multiplier(2.0, DELTA, 0.1, 50)
    event = SampledGaussianEvent(z, 0.1)
    accountant = build_accountant("rdp")
    remaining = releases_remaining(accountant, event, DELTA, 2.0)
    assert remaining >= 50
    assert accountant.epsilon_after(event.repeated(remaining), DELTA) <= 2.0
    assert accountant.epsilon_after(event.repeated(remaining + 1), DELTA) > 2.0
    accountant.compose(event.repeated(10))
    assert releases_remaining(accountant, event, DELTA, 2.0) == remaining - 10
    assert releases_remaining(accountant, event, DELTA, 2.0, limit=7) == 7
    assert accountant.events == (event.repeated(10),)  # nothing composed by the queries


def test_releases_remaining_when_spent_or_too_costly() -> None:
    accountant = build_accountant("rdp")
    accountant.compose(SampledGaussianEvent(1.0, 1.0, 10))
    assert releases_remaining(accountant, SampledGaussianEvent(1.0, 1.0), DELTA, 1.0) == 0
    assert releases_remaining(build_accountant("rdp"), SampledGaussianEvent(0.5, 1.0), DELTA, 0.1) == 0


def test_releases_remaining_with_prv() -> None:
    event = SampledGaussianEvent(2.0, 1.0)
    accountant = build_accountant("prv")
    remaining = releases_remaining(accountant, event, DELTA, 5.0)
    assert remaining >= 1
    assert accountant.epsilon_after(event.repeated(remaining), DELTA) <= 5.0
    assert accountant.epsilon_after(event.repeated(remaining + 1), DELTA) > 5.0


def test_prv_falls_back_to_rdp_bound_far_outside_any_budget() -> None:
    # opacus' PRV runs for minutes (or returns inf) with such tiny noise.
    prv, rdp = build_accountant("prv"), build_accountant("rdp")
    for accountant in (prv, rdp):
        accountant.compose(SampledGaussianEvent(1e-3, 0.1))
    assert prv.get_epsilon(DELTA) == rdp.get_epsilon(DELTA) > PrvAccountant.RDP_FALLBACK_EPSILON


def test_prv_failure_is_an_accounting_error(monkeypatch: pytest.MonkeyPatch) -> None:
    from opacus.accountants import PRVAccountant

    def broken(self, delta, **kwargs):
        raise RuntimeError("domain too small")

    monkeypatch.setattr(PRVAccountant, "get_epsilon", broken)
    accountant = build_accountant("prv")
    accountant.compose(SMALL)
    with pytest.raises(AccountingError, match="PRV accountant failed.*rdp"):
        accountant.get_epsilon(DELTA)


def test_non_finite_epsilon_is_an_accounting_error(monkeypatch: pytest.MonkeyPatch) -> None:
    from opacus.accountants import PRVAccountant

    monkeypatch.setattr(PRVAccountant, "get_epsilon", lambda self, delta, **kwargs: float("inf"))
    accountant = build_accountant("prv")
    accountant.compose(SMALL)
    with pytest.raises(AccountingError, match="inf"):
        accountant.get_epsilon(DELTA)


def test_compose_refuses_other_objects() -> None:
    with pytest.raises(TypeError):
        build_accountant("rdp").compose((1.0, 0.1, 1))  # type: ignore[arg-type]
