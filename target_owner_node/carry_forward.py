"""Restoring a storage folder from a backup without undercounting: carry the lost spend forward.

A backup of storage.dir (ledger + audit log) is older than the releases made since. Started as
it is, the node would compose fewer events and spend the same privacy twice. The state marker
outside storage.dir holds the high-water mark of every charge (state_marker.py), so the node
refuses such a folder; `target-owner-node ledger carry-forward` then makes it usable:

- the ledger and the audit log must agree with each other (`ledger verify`; rebuild first if not);
- every DP event the marker counted beyond the ledger's is charged again, as a ledger entry marked
  recovered (no subsample, no noise: it can never be resumed) with its audit entry
  "release_charged", under the client name CARRIED_CLIENT, in the marker's event kinds;
- one audit entry "spend_carried_forward" records how many releases, which events, the epsilon
  before and after, and the operator's reason.

The spend then composes at least the marker's events, so it is never below what was released.
What cannot be carried: the lost releases' clients (per-client caps count them under
CARRIED_CLIENT) and their values (a retry of a request_id the backup lacks is a new release).
Stop the node first; it runs once per restore (a second run finds nothing missing).
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass

from protocol.privacy.accountants import build_accountant
from protocol.privacy.events import SampledGaussianEvent
from target_owner_node.audit import AuditLog
from target_owner_node.config import OwnerConfig
from target_owner_node.heldout import split_facts
from target_owner_node.ledger import DpEventRecord, Ledger, PendingRelease
from target_owner_node.ledger_audit import CHARGE_EVENT, AuditRecordError, charge_fields, check_consistency
from target_owner_node.state_marker import StateMarker, parse_event_key

CARRIED_EVENT = "spend_carried_forward"
CARRIED_CLIENT = "(carried forward)"


@dataclass(frozen=True)
class CarryResult:
    carried: int  # releases charged again
    epsilon_before: float
    epsilon_after: float
    high_water_epsilon: float


def carry_forward(config: OwnerConfig, ledger: Ledger, audit: AuditLog, reason: str) -> CarryResult:
    """Charge the releases the marker counted beyond the ledger (module docstring); audited."""
    from target_owner_node.node import ledger_event_counts

    if not reason.strip():
        raise ValueError("--reason: say why the storage folder was restored (it is written to the audit log)")
    consistency = check_consistency(ledger, audit.path)
    if not consistency.ok:
        raise AuditRecordError(f"{consistency.describe()}; make the ledger and the audit log agree first "
                               "(`target-owner-node ledger verify`, `ledger rebuild`)")
    marker = StateMarker(config.storage.state_marker_path, config.storage.dir)
    mark = marker.high_water()
    privacy = config.privacy
    accountant = build_accountant(privacy.accountant)
    for release in ledger.releases():
        accountant.compose(_event(release.pending.event))
    before = float(accountant.get_epsilon(privacy.delta))
    missing = mark.missing_from(ledger_event_counts(ledger)) if mark is not None else {}
    if not missing:
        return CarryResult(0, before, before, mark.epsilon_spent if mark else 0.0)
    facts = split_facts(config.data.heldout_path, None, config.data.verifier, config.data.min_heldout_size)
    carried, epsilon = 0, before
    for key, count in sorted(missing.items()):
        noise_multiplier, sample_rate = parse_event_key(key)
        for _ in range(count):
            record = DpEventRecord(noise_multiplier, sample_rate, 1)
            accountant.compose(_event(record))
            after = float(accountant.get_epsilon(privacy.delta))
            pending = PendingRelease(
                release_id=uuid.uuid4().hex, request_id="", client=CARRIED_CLIENT, time=time.time(),
                request_fingerprint="carried-forward", checkpoint_ids=("carried-forward",), decoding={},
                event=record, epsilon_before=epsilon, epsilon_total_after=after, client_epsilon_after=after,
                heldout_size=facts.heldout_size, expected_size=sample_rate * facts.heldout_size,
                noise_std_sum=noise_multiplier, mask=None, noise_draws=None, recovered=True,
            )
            ledger.append_pending(pending)  # ledger first, then its audit entry: the charge order
            audit.append(CHARGE_EVENT, **charge_fields(pending), recovered=True)
            epsilon, carried = after, carried + 1
    audit.append(CARRIED_EVENT, releases=carried, events=dict(sorted(missing.items())), epsilon_before=before,
                 epsilon_after=epsilon, high_water_epsilon=mark.epsilon_spent, reason=reason.strip())
    return CarryResult(carried, before, epsilon, mark.epsilon_spent)


def _event(record: DpEventRecord) -> SampledGaussianEvent:
    return SampledGaussianEvent(noise_multiplier=record.noise_multiplier, sample_rate=record.sample_rate,
                                count=record.count)
