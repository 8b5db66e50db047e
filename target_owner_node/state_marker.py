"""The state marker: a small file OUTSIDE the storage folder recording that it has spent budget.

The ledger and the audit log share one storage folder, so they can be lost together (a wiped
volume, a wrong mount, `rm -r storage`). Checking one against the other cannot see that:
two missing files agree. The marker (by default `<config folder>/.target-owner-node-state.json`,
setting `storage.state_marker`) is written durably at the first charge of a storage folder
(after its ledger and audit entries, so a crash never leaves a marker for a charge that was
not made; a start that finds ledger charges but no record adds it), with that folder's path
and the time. A start that finds the marker's record but no charge in either file refuses:
restore the folder from backup, or delete the marker to start a fresh budget knowingly.
Losing the folder AND the marker is out of scope (the operator's backups).

File format (JSON): {"format": FORMAT, "storage": {"<absolute folder>": {"first_charge_time": t}}}.
One marker may record several storage folders (several configs in one folder).
"""

from __future__ import annotations

import datetime
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from target_owner_node.durable import write_atomically

MARKER_NAME = ".target-owner-node-state.json"
FORMAT = "target-owner-node-state/1"


class StateMarkerError(RuntimeError):
    """The marker is unreadable, or says budget was spent in a storage folder that is now empty."""


@dataclass
class StateMarker:
    path: Path
    storage_dir: Path
    _recorded: bool = field(default=False, init=False)  # cache: the record exists on disk

    @property
    def key(self) -> str:
        return str(Path(self.storage_dir).resolve())

    def _read(self) -> dict[str, Any]:
        if not self.path.exists():
            return {"format": FORMAT, "storage": {}}
        try:
            state = json.loads(self.path.read_bytes())
            if not isinstance(state, dict) or state.get("format") != FORMAT:
                raise ValueError("not a state marker")
            storage = state["storage"]
            if not isinstance(storage, dict) or not all(
                isinstance(v, dict) and isinstance(v.get("first_charge_time"), (int, float))
                for v in storage.values()
            ):
                raise ValueError("storage must map folders to {first_charge_time}")
        except (ValueError, KeyError, UnicodeDecodeError) as error:
            raise StateMarkerError(
                f"state marker {self.path} is unreadable ({error}). It records that a storage folder has spent "
                f"privacy budget; restore it from a backup, or delete it to knowingly forget that record."
            ) from None
        return state

    def first_charge_time(self) -> float | None:
        """When this storage folder was first charged, or None if the marker has no record of it."""
        record = self._read()["storage"].get(self.key)
        return None if record is None else float(record["first_charge_time"])

    def writable(self) -> bool:
        """Whether the marker can be written (its folder exists and is writable)."""
        folder = self.path.parent
        return folder.is_dir() and os.access(folder, os.W_OK | os.X_OK)

    def record_first_charge(self, when: float | None = None) -> None:
        """Durably record that this storage folder has spent budget. Idempotent and cheap after the first."""
        if self._recorded:
            return
        state = self._read()
        if self.key not in state["storage"]:
            state["storage"][self.key] = {"first_charge_time": time.time() if when is None else when}
            write_atomically(self.path, (json.dumps(state, indent=1, sort_keys=True) + "\n").encode("utf-8"))
        self._recorded = True


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
