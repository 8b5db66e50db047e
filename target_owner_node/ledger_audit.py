"""The privacy ledger checked against the audit log, and rebuilt from it.

Every DP charge is written twice, under one lock: first the ledger's ``pending`` entry (with
the secret subsample and noise), then the audit entry ``release_charged`` (public facts
only). So at any moment the two files hold the same charges, except that a crash between
the two writes can leave the LAST ledger charge without its audit entry.

`check_consistency` compares them at start: same release ids, same client and DP event for
each, and the values of every DP release the audit log says was sent equal the ledger's
completed values. The one allowed gap is repaired by `repair_last_charge` (an audit entry
with recovered=true). Anything else (a lost or truncated ledger, an audit charge the ledger
lacks, differing events) stops the node: a smaller ledger would undercount the spend.

`rebuild_ledger` is the explicit recovery after a ledger is lost: it writes a new ledger
from the audit log's charges (so the spend is exact) and released values (so a retry of a
completed request still replays identically). A charged but unfinished release cannot be
resumed (its subsample and noise were never audited); its retry is refused.
"""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from target_owner_node.audit import AuditLog, read_entries
from target_owner_node.durable import fsync_dir
from target_owner_node.ledger import (
    Ledger,
    LedgerRelease,
    PendingRelease,
    write_new_ledger,
)

CHARGE_EVENT = "release_charged"
RELEASE_EVENT = "release"
REBUILT_EVENT = "ledger_rebuilt"
REBUILD_COMMAND = "target-owner-node ledger rebuild --config {config}"
VERIFY_COMMAND = "target-owner-node ledger verify --config {config}"


class AuditRecordError(ValueError):
    """The audit log's charge entries cannot be read (missing fields, duplicates)."""


def charge_fields(pending: PendingRelease) -> dict[str, Any]:
    """The audit fields of one charge: the ledger entry without its secrets (subsample, noise).

    Everything here is public to the node's trainers already: ids they sent or received,
    their request's fingerprint and decoding, the DP event and epsilons GetInfo and
    Evaluate report, N, q*N and z.
    """
    fields = pending.public_json()
    fields.pop("time")  # the audit entry has its own time
    fields["dp_event"] = fields.pop("event")  # "event" is the audit entry's name
    return fields


def pending_from_charge(entry: dict[str, Any]) -> PendingRelease:
    """A recovered ledger entry (no subsample, no noise) from a `release_charged` audit entry."""
    fields = {
        key: value for key, value in entry.items() if key not in ("event", "prev_hash", "hash", "recovered")
    }
    fields["event"] = fields.pop("dp_event")
    return PendingRelease.from_json({**fields, "recovered": True})


@dataclass(frozen=True)
class AuditCharges:
    """What the audit log says about DP charges and the values they released."""

    charges: dict[str, PendingRelease]  # release_id -> recovered entry, in log order
    released: dict[str, tuple[float, ...]]  # release_id -> values sent, DP releases only


def read_audit_charges(audit_path: Path) -> AuditCharges:
    """Parse the charges and DP releases of a verified audit log. Strict: raises AuditRecordError."""
    charges: dict[str, PendingRelease] = {}
    released: dict[str, tuple[float, ...]] = {}
    for number, entry in enumerate(read_entries(audit_path), start=1):
        kind = entry.get("event")
        try:
            if kind == CHARGE_EVENT:
                pending = pending_from_charge(entry)
                if pending.release_id in charges:
                    raise ValueError("duplicate release_id")
                charges[pending.release_id] = pending
            elif kind == RELEASE_EVENT and entry.get("dp") is True:
                values = entry["values"]
                if not isinstance(values, list) or not all(isinstance(v, (int, float)) for v in values):
                    raise ValueError("values must be a list of numbers")
                released[str(entry["release_id"])] = tuple(float(v) for v in values)
        except (ValueError, KeyError, TypeError) as error:
            reason = f"missing field {error.args[0]!r}" if isinstance(error, KeyError) else str(error)
            raise AuditRecordError(
                f"audit log {audit_path} line {number} ({kind}) cannot be read as a charge record: {reason}"
            ) from None
    return AuditCharges(charges, released)


@dataclass(frozen=True)
class Consistency:
    """The result of comparing the ledger with the audit log."""

    ledger_path: Path
    audit_path: Path
    ledger_charges: int
    audit_charges: int
    problems: tuple[str, ...]
    missing_last: PendingRelease | None = None  # the last ledger charge, not yet audited

    @property
    def ok(self) -> bool:
        return not self.problems

    def describe(self) -> str:
        head = (
            f"privacy ledger {self.ledger_path} ({self.ledger_charges} charges) and audit log "
            f"{self.audit_path} ({self.audit_charges} charges)"
        )
        if self.problems:
            return f"{head} disagree:\n" + "\n".join(f"  - {problem}" for problem in self.problems)
        if self.missing_last is not None:
            return (
                f"{head} agree, except that the last charge ({self.missing_last.release_id}) is not audited yet "
                f"(a crash between the two writes); starting the node records it"
            )
        return f"{head} agree"


def check_consistency(ledger: Ledger, audit_path: Path) -> Consistency:
    """Compare the ledger's charges and completions with the audit log's (see the module doc)."""
    audit = read_audit_charges(audit_path)
    releases = ledger.releases()
    ours = {release.pending.release_id: release for release in releases}
    problems: list[str] = []
    missing_last = None
    if audit.charges and not ours:
        state = "missing" if not ledger.path.exists() else "empty"
        problems.append(f"the ledger is {state} but the audit log records {len(audit.charges)} charges")
    else:
        lost = [rid for rid in audit.charges if rid not in ours]
        if lost:
            problems.append(
                f"{len(lost)} charge(s) in the audit log are absent from the ledger (first: release {lost[0]})"
            )
    unaudited = [rid for rid in ours if rid not in audit.charges]
    last = releases[-1].pending if releases else None
    if last is not None and unaudited == [last.release_id]:
        missing_last = last
    elif unaudited:
        problems.append(
            f"{len(unaudited)} charge(s) in the ledger are absent from the audit log (first: release {unaudited[0]})"
        )
    for release_id, recorded in audit.charges.items():
        release = ours.get(release_id)
        if release is None:
            continue
        mine = release.pending
        if (mine.client, mine.event) != (recorded.client, recorded.event):
            problems.append(
                f"release {release_id}: the ledger and the audit log record different clients or DP events"
            )
    for release_id, values in audit.released.items():
        release = ours.get(release_id)
        if release is None:
            problems.append(
                f"the audit log records values sent for release {release_id}, which the ledger lacks"
            )
        elif release.values is None:
            problems.append(
                f"release {release_id}: the audit log records values sent but the ledger no completion"
            )
        elif tuple(release.values) != values:
            problems.append(
                f"release {release_id}: the ledger and the audit log record different released values"
            )
    return Consistency(
        ledger.path, Path(audit_path), len(ours), len(audit.charges), tuple(problems), missing_last
    )


def repair_last_charge(consistency: Consistency, audit: AuditLog) -> None:
    """Audit the one charge a crash left unaudited (marked recovered)."""
    if consistency.missing_last is None or not consistency.ok:
        raise ValueError("only a consistent ledger with its last charge unaudited can be repaired")
    audit.append(CHARGE_EVENT, **charge_fields(consistency.missing_last), recovered=True)


@dataclass(frozen=True)
class RebuildResult:
    ledger_path: Path
    moved_aside: Path | None  # where --force moved the previous ledger
    charges: int
    completed: int  # releases whose values are restored (a retry replays them)
    unfinished: int  # charged, never released: a retry is refused


def rebuild_ledger(ledger_path: Path, audit: AuditLog, force: bool = False) -> RebuildResult:
    """Write a new ledger from the audit log, then audit the rebuild ("ledger_rebuilt").

    Refuses (FileExistsError) when a ledger exists, unless `force`: then the old one is
    renamed aside (`<name>.before-rebuild-<UTC time>`), never deleted.
    """
    ledger_path = Path(ledger_path)
    recorded = read_audit_charges(audit.path)
    releases = [
        LedgerRelease(pending, recorded.released.get(release_id))
        for release_id, pending in recorded.charges.items()
    ]
    for release in releases:
        if release.completed and len(release.values) != release.pending.released_count:
            raise AuditRecordError(
                f"audit log {audit.path}: release {release.pending.release_id} has "
                f"{len(release.values)} values where its charge releases {release.pending.released_count}"
            )
    moved_aside = None
    if ledger_path.exists():
        if not force:
            raise FileExistsError(
                f"{ledger_path} exists; the rebuild never replaces a ledger silently. Check it with "
                f"`target-owner-node ledger verify`, or pass --force to move it aside (it is kept, renamed)"
            )
        moved_aside = _move_aside(ledger_path)
    write_new_ledger(ledger_path, releases)
    result = RebuildResult(
        ledger_path=ledger_path,
        moved_aside=moved_aside,
        charges=len(releases),
        completed=sum(release.completed for release in releases),
        unfinished=sum(not release.completed for release in releases),
    )
    audit.append(
        REBUILT_EVENT,
        charges=result.charges,
        completed=result.completed,
        unfinished=result.unfinished,
        moved_aside=moved_aside.name if moved_aside else None,
    )
    return result


def _move_aside(path: Path) -> Path:
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%SZ")
    target = path.with_name(f"{path.name}.before-rebuild-{stamp}")
    suffix = 1
    while target.exists():
        suffix += 1
        target = path.with_name(f"{path.name}.before-rebuild-{stamp}-{suffix}")
    os.rename(path, target)
    fsync_dir(path.parent)
    return target
