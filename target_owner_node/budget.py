"""The privacy budget: accountants rebuilt from the ledger, and an atomic check-and-charge.

Noise convention (documented in GetInfo): every candidate's score SUM gets Gaussian noise
with the same std z (the calibrated noise multiplier; the L2 sensitivity of one sum is 1).
A query comparing k candidates releases k sums at once, whose joint L2 sensitivity is
sqrt(k), so it is charged as ONE sampled-Gaussian event with effective multiplier
z / sqrt(k). Users see a constant noise std per released accuracy; comparing more
candidates in one query costs more epsilon (about k single releases under RDP), never less.

`charge` holds one lock across "would this exceed the budget?" and the durable writes, so
concurrent clients cannot together overspend. Under that lock, in this order: the ledger's
pending entry, the audit entry "release_charged" (public facts only), then the state marker's
high-water mark (target_owner_node/state_marker.py). A crash can therefore leave at most the last
ledger charge unaudited, which is what the start-up cross-check (`ledger_audit`) allows, and the
mark at most one charge behind, never ahead.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import grpc

from protocol import errors
from protocol.errors import ProtocolError
from protocol.privacy.accountants import build_accountant, releases_remaining
from protocol.privacy.events import SampledGaussianEvent
from protocol.privacy.mechanisms import effective_noise_multiplier
from target_owner_node.audit import AuditLog
from target_owner_node.config import PrivacyConfig
from target_owner_node.ledger import DpEventRecord, Ledger, PendingRelease
from target_owner_node.ledger_audit import CHARGE_EVENT, charge_fields
from target_owner_node.logs import log_event
from target_owner_node.state_marker import StateMarker, StateMarkerError, event_key

# Accountants return floats computed by numerical optimisation; a release calibrated to land
# exactly on the budget must not be refused for a rounding error.
_EPSILON_SLACK = 1e-9


@dataclass(frozen=True)
class Charge:
    """What a successful charge spent (global and for the calling client)."""

    epsilon_before: float
    epsilon_after: float
    client_epsilon_after: float


class PrivacyBudget:
    """Global and per-client composition for the feedback split."""

    def __init__(
        self,
        privacy: PrivacyConfig,
        noise_multiplier: float,
        ledger: Ledger,
        audit: AuditLog | None = None,
        marker: StateMarker | None = None,
    ) -> None:
        self.privacy = privacy
        self.noise_multiplier = noise_multiplier
        self.ledger = ledger
        self.audit = audit  # None only in unit tests of the accounting itself
        self.marker = marker  # None when the marker cannot be written (open_node warned)
        self.lock = threading.RLock()
        self._total = build_accountant(privacy.accountant)
        self._clients: dict[str, object] = {}
        self._releases = 0
        self.event_counts: Counter[str] = Counter()  # state_marker.event_key -> count: what the mark records
        for release in ledger.releases():  # composition is rebuilt from events only
            self._compose(release.pending.client, _to_event(release.pending.event))
        # Epsilon is cached: an accountant query can take a second (RDP at large q), and the
        # values only change in `charge`, which computes them anyway.
        self._spent = self._epsilon(self._total)
        self._client_spent = {client: self._epsilon(a) for client, a in self._clients.items()}
        self._remaining_estimate: int | None = None
        if marker is not None and self._releases:  # a folder charged before this mark existed (or upgraded)
            first = ledger.releases()[0].pending.time
            marker.record(self._releases, self.event_counts, self._spent, first_charge_time=first)

    # -- events ----------------------------------------------------------------------------
    def event_for(self, num_candidates: int) -> SampledGaussianEvent:
        """The DP event of one release comparing `num_candidates` checkpoints."""
        multiplier = effective_noise_multiplier(self.noise_multiplier, num_candidates)
        return SampledGaussianEvent(
            noise_multiplier=multiplier, sample_rate=self.privacy.sample_rate, count=1
        )

    # -- state -----------------------------------------------------------------------------
    def spent(self) -> float:
        return self._spent

    def client_spent(self, client: str) -> float:
        return self._client_spent.get(client, 0.0)

    def remaining(self) -> float:
        return max(0.0, self.privacy.epsilon_budget - self.spent())

    @property
    def releases_made(self) -> int:
        return self._releases

    def releases_remaining_estimate(self) -> int:
        """Further single-candidate releases that fit in the remaining global budget."""
        with self.lock:
            if self._remaining_estimate is None:
                self._remaining_estimate = int(
                    releases_remaining(
                        self._total, self.event_for(1), self.privacy.delta, self.privacy.epsilon_budget
                    )
                )
            return self._remaining_estimate

    # -- charging --------------------------------------------------------------------------
    def charge(
        self, client: str, event: SampledGaussianEvent, make_pending: Callable[[Charge], PendingRelease]
    ) -> PendingRelease:
        """Refuse (RESOURCE_EXHAUSTED) or durably charge one release.

        `make_pending` builds the ledger entry from the computed charge; it is written and
        fsynced before the accountants are updated, and audited before this returns. Nothing
        is spent when this raises before the ledger write (the budget checks); a failed audit
        write after it leaves the charge standing (it is audited at the next start).
        """
        delta = self.privacy.delta
        with self.lock:
            before = self._spent
            after = float(self._total.epsilon_after(event, delta))
            budget = self.privacy.epsilon_budget
            if after > budget * (1 + _EPSILON_SLACK):
                raise ProtocolError(
                    grpc.StatusCode.RESOURCE_EXHAUSTED,
                    errors.PRIVACY_BUDGET_EXHAUSTED,
                    f"privacy budget exhausted: this release would bring the node's epsilon to {after:.4f}, "
                    f"above its budget of {budget:.4f} (spent so far {before:.4f}). Do not retry.",
                    {"spent": f"{before:.6g}", "limit": f"{budget:.6g}", "would_be": f"{after:.6g}"},
                )
            client_accountant = self._clients.get(client) or build_accountant(self.privacy.accountant)
            client_before = self.client_spent(client)
            if client_accountant.events == self._total.events:  # the only client so far: same history
                client_after = after
            else:
                client_after = float(client_accountant.epsilon_after(event, delta))
            cap = self.privacy.per_client_epsilon_cap
            if cap > 0 and client_after > cap * (1 + _EPSILON_SLACK):
                raise ProtocolError(
                    grpc.StatusCode.RESOURCE_EXHAUSTED,
                    errors.CLIENT_BUDGET_EXHAUSTED,
                    f"per-client privacy cap reached: this release would bring your epsilon to {client_after:.4f}, "
                    f"above the per-client cap of {cap:.4f} (you have spent {client_before:.4f}). Do not retry.",
                    {
                        "spent": f"{client_before:.6g}",
                        "limit": f"{cap:.6g}",
                        "would_be": f"{client_after:.6g}",
                    },
                )
            pending = make_pending(Charge(before, after, client_after))
            self.ledger.append_pending(pending)  # durable before anything else happens
            self._compose(client, event)
            self._spent, self._client_spent[client] = after, client_after
            self._remaining_estimate = None
            if self.audit is not None:
                self.audit.append(CHARGE_EVENT, **charge_fields(pending))
            if self.marker is not None:
                self._record_marker()
            return pending

    def _record_marker(self) -> None:
        """The spend's high-water mark, recorded outside the storage folder. A failure here must not fail
        the release (the charge is made): it is retried at the next charge and at the next start."""
        try:
            self.marker.record(self._releases, self.event_counts, self._spent)
        except (OSError, StateMarkerError) as error:
            log_event("state_marker_write_failed", level="warning", path=str(self.marker.path),
                      type=type(error).__name__)

    def _compose(self, client: str, event: SampledGaussianEvent) -> None:
        self.event_counts[event_key(event.noise_multiplier, event.sample_rate)] += event.count
        self._total.compose(event)
        if client not in self._clients:
            self._clients[client] = build_accountant(self.privacy.accountant)
        self._clients[client].compose(event)
        self._releases += 1

    def _epsilon(self, accountant) -> float:
        return float(accountant.get_epsilon(self.privacy.delta))


def to_record(event: SampledGaussianEvent) -> DpEventRecord:
    return DpEventRecord(event.noise_multiplier, event.sample_rate, event.count)


def _to_event(record: DpEventRecord) -> SampledGaussianEvent:
    return SampledGaussianEvent(
        noise_multiplier=record.noise_multiplier, sample_rate=record.sample_rate, count=record.count
    )
