"""A hash-chained, append-only audit log (JSON lines).

Each entry carries `prev_hash` (the previous entry's hash, or 64 zeros for the first) and
`hash = sha256(prev_hash + canonical JSON of the entry without "hash")`. Editing, removing
or reordering any line breaks the chain from that line on, which `verify_chain` reports.

The log records who asked for what and what aggregate left the node (time, client
identity, checkpoint digests, decoding settings, split, epsilon, released accuracies). It
never records prompts, answers, generations or per-example scores. It stays on the owner.

Every DP charge is recorded twice, in the privacy ledger and here ("release_charged", public
facts only: never the secret subsample or noise), so that each file can be checked against
the other at start and a lost ledger can be rebuilt from this log (see `ledger_audit`).
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from target_owner_node.durable import append_line

GENESIS_HASH = "0" * 64


class AuditChainError(RuntimeError):
    """The audit log on disk fails verification; the node will not append to a broken chain."""


def canonical_json(value: Any) -> str:
    """The one serialisation hashes are computed over (sorted keys, no spaces, no NaN)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)


def entry_hash(prev_hash: str, entry: dict[str, Any]) -> str:
    body = {key: value for key, value in entry.items() if key != "hash"}
    return hashlib.sha256((prev_hash + canonical_json(body)).encode("ascii")).hexdigest()


def verify_chain(path: str | Path) -> tuple[bool, int, int | None]:
    """Check every line of the log. Returns (ok, entries_verified, first_bad_line or None).

    Line numbers are 1-based. A missing file is an empty, valid log.
    """
    path = Path(path)
    if not path.exists():
        return True, 0, None
    prev = GENESIS_HASH
    count = 0
    with path.open("rb") as handle:
        for line_number, raw in enumerate(handle, start=1):
            try:
                entry = json.loads(raw)
            except (json.JSONDecodeError, UnicodeDecodeError):
                return False, count, line_number
            if (
                not isinstance(entry, dict)
                or entry.get("prev_hash") != prev
                or entry.get("hash") != entry_hash(prev, entry)
            ):
                return False, count, line_number
            prev = entry["hash"]
            count += 1
    return True, count, None


def read_entries(path: str | Path) -> Iterator[dict[str, Any]]:
    """Every entry of a verified log, in order (verify first: this does not check hashes)."""
    path = Path(path)
    if not path.exists():
        return
    with path.open("rb") as handle:
        for raw in handle:
            yield json.loads(raw)


class AuditLog:
    """Appends chained entries; each append is fsynced before it returns."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        ok, count, bad_line = verify_chain(self.path)
        if not ok:
            raise AuditChainError(
                f"audit log {self.path} fails verification at line {bad_line}; refusing to extend a broken "
                f"chain. Inspect it with `target-owner-node audit verify --log {self.path}`."
            )
        self._count = count
        self._last_hash = self._read_last_hash() if count else GENESIS_HASH
        self._lock = threading.Lock()

    def _read_last_hash(self) -> str:
        last = None
        with self.path.open("rb") as handle:
            for raw in handle:
                last = raw
        return json.loads(last)["hash"]

    @property
    def entries(self) -> int:
        return self._count

    def append(self, event: str, **fields: Any) -> dict[str, Any]:
        """Record one event; `fields` must be JSON-serialisable aggregates (no data content)."""
        with self._lock:
            entry = {"time": time.time(), "event": event, **fields, "prev_hash": self._last_hash}
            entry["hash"] = entry_hash(self._last_hash, entry)
            append_line(self.path, canonical_json(entry))
            self._last_hash = entry["hash"]
            self._count += 1
            return entry
