"""The state marker: a small file OUTSIDE the storage folder holding the spend's high-water mark.

The ledger and the audit log share one storage folder, so they can be lost, or rolled back,
together: a wiped volume, `rm -r storage`, or a restore of an older but self-consistent copy of
both (or both truncated to a consistent prefix, issue 41). Checking one against the other cannot
see that: the two agree. The marker (by default `<config folder>/.target-owner-node-state.json`,
setting `storage.state_marker`) records, for each storage folder, the high-water mark of what it
has charged: how many releases, the multiset of their DP events (what the accountant composes),
and the epsilon that composed to. It is rewritten durably after every charge (after the ledger
and audit entries, so a crash can leave it one charge BEHIND, never ahead), and never lowered.

At start the ledger must hold at least the marker's releases, event by event. Otherwise the node
refuses: its spend would be undercounted. Restoring a storage folder from a backup is then an
explicit, audited step, `target-owner-node ledger carry-forward` (target_owner_node/carry_forward.py):
the releases the backup lacks are charged again from the marker's events, so the spend never
goes below what was released. Losing the folder AND the marker (or restoring both from one old
backup) is out of scope: keep the marker on storage the backups of storage.dir do not roll back.

File format (JSON): {"format": FORMAT, "storage": {"<absolute folder>": {"first_charge_time": t,
"releases": n, "events": {"<noise multiplier>|<sample rate>": count}, "epsilon_spent": e}}}.
Format 1 files (first_charge_time only) are read as a mark of zero releases and upgraded on the
next charge. One marker may record several storage folders (several configs in one folder).
"""

from __future__ import annotations

import datetime
import json
import os
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from target_owner_node.durable import write_atomically

MARKER_NAME = ".target-owner-node-state.json"
FORMAT = "target-owner-node-state/2"
_OLD_FORMATS = ("target-owner-node-state/1",)
CARRY_FORWARD_COMMAND = "target-owner-node ledger carry-forward --config {config}"


class StateMarkerError(RuntimeError):
    """The marker is unreadable, or says more budget was spent than the storage folder records."""


def event_key(noise_multiplier: float, sample_rate: float) -> str:
    """How the marker names one kind of DP event (the accountant's input)."""
    return f"{float(noise_multiplier)!r}|{float(sample_rate)!r}"


def parse_event_key(key: str) -> tuple[float, float]:
    multiplier, _, rate = key.partition("|")
    return float(multiplier), float(rate)


@dataclass(frozen=True)
class HighWater:
    """What a storage folder had charged when the marker was last written."""

    first_charge_time: float
    releases: int = 0
    events: Mapping[str, int] = field(default_factory=dict)
    epsilon_spent: float = 0.0

    def missing_from(self, recorded: Mapping[str, int]) -> Counter:
        """The events this mark holds beyond `recorded` (event key -> count; empty when none)."""
        return Counter({k: n - recorded.get(k, 0) for k, n in self.events.items() if n > recorded.get(k, 0)})


@dataclass
class StateMarker:
    path: Path
    storage_dir: Path
    _recorded_releases: int = field(default=-1, init=False)  # cache: what the file holds for this folder

    @property
    def key(self) -> str:
        return str(Path(self.storage_dir).resolve())

    def _read(self) -> dict[str, Any]:
        if not self.path.exists():
            return {"format": FORMAT, "storage": {}}
        try:
            state = json.loads(self.path.read_bytes())
            if not isinstance(state, dict) or state.get("format") not in (FORMAT, *_OLD_FORMATS):
                raise ValueError("not a state marker")
            storage = state["storage"]
            if not isinstance(storage, dict) or not all(_valid_record(v) for v in storage.values()):
                raise ValueError("storage must map folders to their high-water marks")
        except (ValueError, KeyError, TypeError, UnicodeDecodeError) as error:
            raise StateMarkerError(
                f"state marker {self.path} is unreadable ({error}). It records how much privacy budget storage "
                f"folders have spent; restore it from a backup, or delete it to knowingly forget that record."
            ) from None
        state["format"] = FORMAT
        return state

    def high_water(self) -> HighWater | None:
        """This storage folder's mark, or None if the marker has no record of it."""
        record = self._read()["storage"].get(self.key)
        if record is None:
            return None
        return HighWater(float(record["first_charge_time"]), int(record.get("releases", 0)),
                         dict(record.get("events", {})), float(record.get("epsilon_spent", 0.0)))

    def first_charge_time(self) -> float | None:
        """When this storage folder was first charged, or None if the marker has no record of it."""
        mark = self.high_water()
        return None if mark is None else mark.first_charge_time

    def writable(self) -> bool:
        """Whether the marker can be written (its folder exists and is writable)."""
        folder = self.path.parent
        return folder.is_dir() and os.access(folder, os.W_OK | os.X_OK)

    def record(self, releases: int, events: Mapping[str, int], epsilon_spent: float,
               first_charge_time: float | None = None) -> None:
        """Durably raise this folder's mark to (releases, events, epsilon). Never lowers it: a mark
        already at or above `releases` is left as it is (and not rewritten)."""
        if releases <= self._recorded_releases:
            return
        state = self._read()
        current = state["storage"].get(self.key)
        if current is not None and int(current.get("releases", 0)) >= releases:
            self._recorded_releases = int(current.get("releases", 0))
            return
        first = current["first_charge_time"] if current is not None else (
            time.time() if first_charge_time is None else first_charge_time)
        state["storage"][self.key] = {"first_charge_time": first, "releases": int(releases),
                                      "events": {k: int(n) for k, n in sorted(events.items()) if n > 0},
                                      "epsilon_spent": float(epsilon_spent)}
        write_atomically(self.path, (json.dumps(state, indent=1, sort_keys=True) + "\n").encode("utf-8"))
        self._recorded_releases = int(releases)


def _valid_record(record: Any) -> bool:
    if not (isinstance(record, dict) and isinstance(record.get("first_charge_time"), (int, float))):
        return False
    events = record.get("events", {})
    return (isinstance(record.get("releases", 0), int) and isinstance(record.get("epsilon_spent", 0.0), (int, float))
            and isinstance(events, dict)
            and all(isinstance(k, str) and isinstance(n, int) and n >= 0 for k, n in events.items()))


def refuse_if_storage_lost(marker: StateMarker, ledger_path: Path, audit_path: Path, charges_found: int) -> None:
    """Raise StateMarkerError when the marker says budget was spent but neither the ledger nor the
    audit log (`charges_found` counts both) records a charge: deleted, emptied or truncated."""
    first = marker.first_charge_time()
    if first is None or charges_found:
        return
    when = datetime.datetime.fromtimestamp(first, datetime.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    raise StateMarkerError(
        f"the state marker {marker.path} records that storage folder {marker.key} spent privacy budget "
        f"(first charge {when}), but neither {ledger_path.name} nor {audit_path.name} there records any "
        f"charge (missing or emptied). Refusing to start with a fresh budget. Restore the storage folder "
        f"from a backup; or, only to knowingly start a fresh budget (the old spend is then forgotten), "
        f"delete {marker.path} and start again."
    )


def refuse_if_rolled_back(marker: StateMarker, ledger_path: Path, releases: int, events: Mapping[str, int],
                          config_shown: str) -> None:
    """Raise StateMarkerError when the ledger holds fewer releases (or fewer of some DP event) than
    the marker's high-water mark: an older copy of the storage folder, or one cut short."""
    mark = marker.high_water()
    if mark is None:
        return
    missing = mark.missing_from(events)
    if releases >= mark.releases and not missing:
        return
    raise StateMarkerError(
        f"{ledger_path.name} records {releases} releases, but the state marker {marker.path} has seen this "
        f"storage folder charge {mark.releases} (epsilon {mark.epsilon_spent:.4g}); {sum(missing.values())} "
        f"charged releases are missing: the folder was restored from an older backup or cut short. Refusing to "
        f"start with less spend recorded than was released. To keep the restored folder, run "
        f"`{CARRY_FORWARD_COMMAND.format(config=config_shown)}`: it charges the missing releases again from the "
        f"marker's record (audited), so the spend stays at least what was released."
    )
