"""Privacy accountants: compose release events, answer "how much epsilon so far?".

Every accountant implements the small `Accountant` interface and is created by name from the
`ACCOUNTANTS` registry (`build_accountant("rdp")`). The epsilon arithmetic is delegated to
opacus; the STATE is ours: `state_dict()` is the list of composed events as JSON, so a ledger
written today can be read by any later opacus version (opacus' own state format has changed
between releases).

To add an accountant:
    @ACCOUNTANTS.register("mine")
    class MyAccountant(Accountant): def _epsilon(self, events, delta): ...   # + valid_privacy_filter
(a plug-in: entry point `target_feedback.accountants`). Code never compares accountant names: what
differs between accountants is a capability on the class (`valid_privacy_filter`).
"""

from __future__ import annotations

import abc
import contextlib
import functools
import logging
import math
import warnings
from collections.abc import Iterator, Sequence
from typing import Any, ClassVar

import numpy as np

from protocol.plugins import Registry, subclass_entries
from protocol.privacy.events import SampledGaussianEvent

logger = logging.getLogger(__name__)

STATE_FORMAT = "target-feedback-accountant/v1"

# opacus is imported inside the functions that need it: importing it pulls in torch
# (seconds of start-up), and most users of protocol.privacy only need the mechanisms.


class AccountingError(RuntimeError):
    """The accountant could not compute a trustworthy epsilon. Release nothing."""


def _check_delta(delta: float) -> None:
    if not (isinstance(delta, (int, float)) and 0.0 < delta < 1.0):
        raise ValueError(f"delta must be in (0, 1), got {delta!r}")


class Accountant(abc.ABC):
    """Composes `SampledGaussianEvent`s and converts them to (epsilon, delta)-DP."""

    name: ClassVar[str] = ""  # set by registration
    valid_privacy_filter: ClassVar[bool] = False
    """True when checking `epsilon_after(event) <= budget` before each release is a valid privacy
    filter under fully adaptive composition (the trainer picks each query's candidates from
    earlier answers): proven for Renyi DP (Feldman & Zrnic 2021), heuristic otherwise."""

    def __init__(self) -> None:
        self._events: list[SampledGaussianEvent] = []

    @property
    def events(self) -> tuple[SampledGaussianEvent, ...]:
        return tuple(self._events)

    @property
    def num_releases(self) -> int:
        return sum(event.count for event in self._events)

    def compose(self, event: SampledGaussianEvent) -> None:
        """Record `event` (consecutive identical releases are merged into one count)."""
        if not isinstance(event, SampledGaussianEvent):
            raise TypeError(f"expected SampledGaussianEvent, got {type(event).__name__}")
        self._events = _merged([*self._events, event])

    def get_epsilon(self, delta: float) -> float:
        """Epsilon spent by every composed event, at this delta."""
        _check_delta(delta)
        return self._checked_epsilon(self._events, delta)

    def epsilon_after(self, event: SampledGaussianEvent, delta: float) -> float:
        """What epsilon WOULD be after composing `event`. Changes nothing."""
        if not isinstance(event, SampledGaussianEvent):
            raise TypeError(f"expected SampledGaussianEvent, got {type(event).__name__}")
        _check_delta(delta)
        return self._checked_epsilon(_merged([*self._events, event]), delta)

    def state_dict(self) -> dict[str, Any]:
        """JSON-serialisable state in our own format (not opacus')."""
        return {
            "format": STATE_FORMAT,
            "accountant": self.name,
            "events": [event.to_dict() for event in self._events],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Replace the history with `state` (validated fully before anything changes)."""
        if not isinstance(state, dict):
            raise TypeError(f"accountant state must be a JSON object, got {type(state).__name__}")
        if state.get("format") != STATE_FORMAT:
            raise ValueError(
                f"accountant state field 'format' must be {STATE_FORMAT!r}, got {state.get('format')!r}"
            )
        if state.get("accountant") != self.name:
            raise ValueError(
                f"accountant state field 'accountant' is {state.get('accountant')!r}, but this is {self.name!r}"
            )
        raw_events = state.get("events")
        if not isinstance(raw_events, list):
            raise TypeError("accountant state field 'events' must be a list")
        events = []
        for index, raw in enumerate(raw_events):
            try:
                events.append(SampledGaussianEvent.from_dict(raw))
            except (TypeError, ValueError) as error:
                raise ValueError(f"accountant state field 'events[{index}]': {error}") from None
        self._events = _merged(events)

    def _checked_epsilon(self, events: Sequence[SampledGaussianEvent], delta: float) -> float:
        if not events:
            return 0.0
        epsilon = self._epsilon(events, delta)
        if not math.isfinite(epsilon) or epsilon < 0:
            raise AccountingError(
                f"{self.name} accountant returned epsilon={epsilon!r} for {_describe(events)}"
            )
        return float(epsilon)

    @abc.abstractmethod
    def _epsilon(self, events: Sequence[SampledGaussianEvent], delta: float) -> float:
        """Epsilon of a non-empty, merged event list."""


def _merged(events: Sequence[SampledGaussianEvent]) -> list[SampledGaussianEvent]:
    """Merge consecutive events with equal parameters (composition is order-free)."""
    merged: list[SampledGaussianEvent] = []
    for event in events:
        last = merged[-1] if merged else None
        if last and (last.noise_multiplier, last.sample_rate) == (event.noise_multiplier, event.sample_rate):
            merged[-1] = SampledGaussianEvent(
                last.noise_multiplier, last.sample_rate, last.count + event.count
            )
        else:
            merged.append(event)
    return merged


def _describe(events: Sequence[SampledGaussianEvent]) -> str:
    shown = ", ".join(f"(z={e.noise_multiplier:g}, q={e.sample_rate:g}, n={e.count})" for e in events[:3])
    return f"events [{shown}{', ...' if len(events) > 3 else ''}]"


@contextlib.contextmanager
def _quiet_opacus() -> Iterator[None]:
    """Silence opacus' "Optimal order is the largest/smallest alpha" warning (the bound
    is valid, only loose; PRV also uses RDP internally to size its domain) and numpy's
    log(0) warnings at q=1, which opacus handles."""
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.filterwarnings("ignore", message="Optimal order is the")
        yield


def _opacus_history(events: Sequence[SampledGaussianEvent]) -> list[tuple[float, float, int]]:
    # opacus' accountants read `history` as (noise_multiplier, sample_rate, steps) tuples;
    # opacus' own get_noise_multiplier sets it the same way.
    return [(e.noise_multiplier, e.sample_rate, e.count) for e in events]


ACCOUNTANTS: Registry[type[Accountant]] = Registry(
    "accountants", noun="accountant", on_add=subclass_entries(Accountant, "accountant")
)


def accountant_names() -> tuple[str, ...]:
    return tuple(ACCOUNTANTS.names())


def check_accountant_name(name: str) -> str:
    """`name` when it is a registered accountant; ValueError listing the known ones otherwise
    (a config validator)."""
    ACCOUNTANTS.entry(name)
    return name


def build_accountant(name: str) -> Accountant:
    """A fresh accountant by registered name (see accountant_names())."""
    return ACCOUNTANTS.get(name)()


@ACCOUNTANTS.register("rdp")
class RdpAccountant(Accountant):
    """Renyi-DP accounting of the subsampled Gaussian (Mironov et al. 2019), via opacus.

    Same arithmetic as opacus' RDPAccountant.get_epsilon, with one speed-up: the RDP curve of
    one (sample_rate, noise_multiplier) step is cached, because RDP composes linearly in the
    number of steps. A ledger replays the same few event kinds thousands of times, and the
    uncached curve costs ~0.1-1 s per evaluation on a small CPU.
    """

    valid_privacy_filter = True  # RDP composes fully adaptively (Feldman & Zrnic 2021)

    def _epsilon(self, events: Sequence[SampledGaussianEvent], delta: float) -> float:
        import numpy as np
        from opacus.accountants import RDPAccountant
        from opacus.accountants.analysis import rdp as privacy_analysis

        orders = RDPAccountant.DEFAULT_ALPHAS
        total = np.zeros(len(orders))
        for noise_multiplier, sample_rate, steps in _opacus_history(events):
            total = total + steps * _one_step_rdp(sample_rate, noise_multiplier)
        with _quiet_opacus():
            eps, _ = privacy_analysis.get_privacy_spent(orders=orders, rdp=total, delta=delta)
        return float(eps)


@functools.lru_cache(maxsize=256)
def _one_step_rdp(sample_rate: float, noise_multiplier: float):
    from opacus.accountants import RDPAccountant
    from opacus.accountants.analysis import rdp as privacy_analysis

    curve = privacy_analysis.compute_rdp(
        q=sample_rate, noise_multiplier=noise_multiplier, steps=1, orders=RDPAccountant.DEFAULT_ALPHAS
    )
    curve.setflags(write=False)
    return curve


@ACCOUNTANTS.register("prv")
class PrvAccountant(Accountant):
    """Numerical composition of privacy loss random variables (Gopi et al. 2021), via opacus.

    Tighter than RDP. Its cost grows with the total number of releases (about 1 s for
    5,000 on one CPU core) and it breaks down (infinite result or a very long run) when
    the noise is tiny. So: when the RDP bound already exceeds `RDP_FALLBACK_EPSILON` —
    far beyond any meaningful budget — the (valid, looser) RDP bound is returned instead;
    any other PRV failure raises AccountingError.
    """

    valid_privacy_filter = False  # no adaptive-composition filter is proven for PRV: heuristic
    eps_error: ClassVar[float] = 0.01
    RDP_FALLBACK_EPSILON: ClassVar[float] = 100.0

    def _epsilon(self, events: Sequence[SampledGaussianEvent], delta: float) -> float:
        rdp_bound = RdpAccountant()._epsilon(events, delta)
        if rdp_bound > self.RDP_FALLBACK_EPSILON:
            logger.warning(
                "PRV skipped: RDP bound %.1f already exceeds %.0f", rdp_bound, self.RDP_FALLBACK_EPSILON
            )
            return rdp_bound
        from opacus.accountants import PRVAccountant

        accountant = PRVAccountant()
        accountant.history = _opacus_history(events)
        try:
            with _quiet_opacus():
                return accountant.get_epsilon(delta=delta, eps_error=self.eps_error)
        except Exception as error:  # opacus raises assorted errors outside its range
            raise AccountingError(
                f"PRV accountant failed for {_describe(events)}, delta={delta:g}: "
                f"{type(error).__name__}: {error}; the 'rdp' accountant covers this range"
            ) from error


CALIBRATION_TOLERANCE = 0.01  # epsilon; opacus' get_noise_multiplier default
MAX_NOISE_MULTIPLIER = 1e6  # opacus' MAX_SIGMA: beyond it the budget is called too low


def calibrate_noise_multiplier(
    target_epsilon: float, delta: float, sample_rate: float, releases: int, accountant: str = "rdp"
) -> float:
    """Smallest noise multiplier z (to a 0.01-epsilon search tolerance) such that `releases`
    subsampled Gaussian releases at rate q cost at most target_epsilon under `accountant`.

    The search is opacus' get_noise_multiplier (double z from 20 until within budget, then
    bisect), run on the registered accountant itself, so any accountant can be calibrated and
    the promise eps(releases) <= target is checked by the accountant that will charge.
    """
    if not (math.isfinite(target_epsilon) and target_epsilon > 0):
        raise ValueError(f"target_epsilon must be finite and > 0, got {target_epsilon!r}")
    _check_delta(delta)
    if not (0.0 < sample_rate <= 1.0):
        raise ValueError(f"sample_rate must be in (0, 1], got {sample_rate!r}")
    if isinstance(releases, bool) or not isinstance(releases, int) or releases < 1:
        raise ValueError(f"releases must be an int >= 1, got {releases!r}")
    checker = build_accountant(accountant)  # validates the name

    def spent(z: float) -> float:
        return checker.epsilon_after(SampledGaussianEvent(z, sample_rate, releases), delta)

    z_low, z_high, eps_high = 0.0, 10.0, math.inf
    while eps_high > target_epsilon:
        z_high *= 2
        eps_high = spent(z_high)
        if z_high > MAX_NOISE_MULTIPLIER:
            raise ValueError(
                f"cannot reach epsilon={target_epsilon:g} at delta={delta:g} with {releases} releases "
                f"at q={sample_rate:g}: the privacy budget is too low"
            )
    while target_epsilon - eps_high > CALIBRATION_TOLERANCE:
        z = (z_low + z_high) / 2
        eps = spent(z)
        if eps < target_epsilon:
            z_high, eps_high = z, eps
        else:
            z_low = z
    return float(z_high)


def releases_remaining(
    accountant: Accountant,
    event: SampledGaussianEvent,
    delta: float,
    epsilon_budget: float,
    limit: int = 100_000,
) -> int:
    """How many more `event`s fit within epsilon_budget (at most `limit`).

    Epsilon is monotone in the number of releases, so: doubling search, then bisection;
    each probe is `epsilon_after(history + n events)` on a what-if copy.
    """
    _check_delta(delta)
    if not math.isfinite(epsilon_budget) or epsilon_budget < 0:
        raise ValueError(f"epsilon_budget must be finite and >= 0, got {epsilon_budget!r}")
    if limit < 0:
        raise ValueError(f"limit must be >= 0, got {limit!r}")

    def fits(n: int) -> bool:
        return accountant.epsilon_after(event.repeated(n), delta) <= epsilon_budget

    if limit == 0 or accountant.get_epsilon(delta) > epsilon_budget or not fits(1):
        return 0
    fitting, probe = 1, 2
    while probe <= limit and fits(probe):
        fitting, probe = probe, probe * 2
    not_fitting = min(probe, limit + 1)  # limit + 1 stands for "beyond the limit"
    while not_fitting - fitting > 1:
        middle = (fitting + not_fitting) // 2
        if fits(middle):
            fitting = middle
        else:
            not_fitting = middle
    return fitting
