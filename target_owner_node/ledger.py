"""The privacy ledger: the durable record of every DP release (owner-private, never sent).

One JSON object per line, appended and fsynced (file + folder) before anything is released:

* ``pending``   written BEFORE evaluation starts. It charges the budget: it holds the DP
  event (noise_multiplier, sample_rate, count), the secret Poisson subsample (packed mask
  and its sha256) and the Gaussian noise draws. A pending entry without a completion still
  counts as spent after a restart, so no crash can undercount.
* ``completed`` written BEFORE the response is sent, with the released values. A retry of
  the same request_id returns these values without spending again.

A retry of a pending-only request (the node crashed mid-evaluation) re-runs evaluation with
the stored subsample and noise, so the released value is the one that was charged for.

A ledger rebuilt from the audit log (`target-owner-node ledger rebuild`) holds ``pending``
entries with ``"recovered": true`` and no subsample or noise: the audit log never records
those secrets. They charge exactly like the originals; a completed one still replays its
released values, but an unfinished one can never be resumed (`RECOVERED_NOT_RESUMABLE`).

On startup the whole file is parsed; composition is rebuilt from the events (never from
stored epsilon numbers). Any line that does not parse or does not fit the schema stops the
node with `LedgerCorruptError`: the spend is never silently reset.
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from target_owner_node.durable import append_line, write_atomically
from target_owner_node.evaluate_request import ACCURACY_RELEASE, ReleaseSpec

LEDGER_FILE = "privacy_ledger.jsonl"
# Sent (INVALID_ARGUMENT / INVALID_REQUEST) for a retry of a charged-but-unfinished release
# after a rebuild: its secret subsample and noise are gone, and fresh ones would be a second
# release of the same request at no charge.
RECOVERED_NOT_RESUMABLE = "this release cannot be resumed after a ledger rebuild; use a fresh request_id"
# The secret fields of a pending entry; a recovered entry must not carry any of them.
_SECRET_FIELDS = ("mask_b64", "mask_sha256", "noise_draws")


class LedgerCorruptError(RuntimeError):
    """The ledger cannot be trusted; the node refuses to start rather than reset the spend."""


@dataclass(frozen=True)
class DpEventRecord:
    """The accountant input of one release, as stored (mirrors SampledGaussianEvent)."""

    noise_multiplier: float
    sample_rate: float
    count: int = 1

    def to_json(self) -> dict[str, Any]:
        return {
            "noise_multiplier": self.noise_multiplier,
            "sample_rate": self.sample_rate,
            "count": self.count,
        }

    @classmethod
    def from_json(cls, event: dict[str, Any]) -> DpEventRecord:
        if not isinstance(event, dict):
            raise TypeError("event must be an object")
        return cls(
            noise_multiplier=_float(event["noise_multiplier"], "event.noise_multiplier", positive=True),
            sample_rate=_float(event["sample_rate"], "event.sample_rate", positive=True),
            count=_int(event["count"], "event.count", minimum=1),
        )


@dataclass(frozen=True)
class PendingRelease:
    """Everything needed to (re)compute one DP release identically.

    `recovered` entries (rebuilt from the audit log) have no `mask` and no `noise_draws`:
    they keep the charge and the public facts, never the secrets.
    """

    release_id: str
    request_id: str
    client: str
    time: float
    request_fingerprint: str  # sha256 of the canonical request; a reused id must match
    checkpoint_ids: tuple[str, ...]
    decoding: dict[str, Any]
    event: DpEventRecord
    epsilon_before: float
    epsilon_total_after: float
    client_epsilon_after: float
    heldout_size: int
    expected_size: float  # public q * N, the release denominator
    noise_std_sum: float  # std of the Gaussian noise on each candidate's sum
    mask: np.ndarray | None = field(compare=False)  # (N,) bool, the secret Poisson subsample
    noise_draws: np.ndarray | None = field(compare=False)  # (k,) noise added to each released value's sum
    recovered: bool = False  # rebuilt from the audit log: no mask, no noise, cannot be resumed
    release: ReleaseSpec = ACCURACY_RELEASE  # what it measures (accuracy, or clipped differences from a base)

    @property
    def released_count(self) -> int:
        """How many values the release holds (one per checkpoint; a difference release's base has none)."""
        return self.release.released(len(self.checkpoint_ids))

    def public_json(self) -> dict[str, Any]:
        """Every field except the secrets (subsample and noise): what the audit log may hold."""
        return {
            "release_id": self.release_id,
            "request_id": self.request_id,
            "client": self.client,
            "time": self.time,
            "request_fingerprint": self.request_fingerprint,
            "checkpoint_ids": list(self.checkpoint_ids),
            "decoding": self.decoding,
            "event": self.event.to_json(),
            "epsilon_before": self.epsilon_before,
            "epsilon_total_after": self.epsilon_total_after,
            "client_epsilon_after": self.client_epsilon_after,
            "heldout_size": self.heldout_size,
            "expected_size": self.expected_size,
            "noise_std_sum": self.noise_std_sum,
            **({"release": self.release.to_json()} if self.release.is_difference else {}),
        }

    def to_json(self) -> dict[str, Any]:
        if self.recovered:
            return {"type": "pending", **self.public_json(), "recovered": True}
        packed = np.packbits(self.mask.astype(bool)).tobytes()
        return {
            "type": "pending",
            **self.public_json(),
            "mask_b64": base64.b64encode(packed).decode("ascii"),
            "mask_sha256": hashlib.sha256(packed).hexdigest(),
            "noise_draws": [float(x) for x in self.noise_draws],
        }

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> PendingRelease:
        """Parse a ledger `pending` line (or, with recovered=true, a rebuilt one). Strict."""
        recovered = obj.get("recovered", False)
        if not isinstance(recovered, bool):
            raise TypeError("recovered must be true or false")
        size = _int(obj["heldout_size"], "heldout_size", minimum=1)
        checkpoint_ids = tuple(_str(x, "checkpoint_ids[]") for x in obj["checkpoint_ids"])
        if not checkpoint_ids:
            raise ValueError("checkpoint_ids must not be empty")
        release = ReleaseSpec.from_json(obj.get("release"))
        released = release.released(len(checkpoint_ids))
        if released < 1:
            raise ValueError("a difference release needs a base and at least one candidate")
        if recovered:
            if any(name in obj for name in _SECRET_FIELDS):
                raise ValueError("a recovered entry must not carry mask or noise fields")
            mask = noise = None
        else:
            mask, noise = _secrets(obj, size, released)
        if not isinstance(obj["decoding"], dict):
            raise ValueError("decoding must be an object")
        return cls(
            release_id=_str(obj["release_id"], "release_id"),
            request_id=_str(obj["request_id"], "request_id", allow_empty=True),
            client=_str(obj["client"], "client"),
            time=_float(obj["time"], "time"),
            request_fingerprint=_str(obj["request_fingerprint"], "request_fingerprint"),
            checkpoint_ids=checkpoint_ids,
            decoding=obj["decoding"],
            event=DpEventRecord.from_json(obj["event"]),
            epsilon_before=_float(obj["epsilon_before"], "epsilon_before"),
            epsilon_total_after=_float(obj["epsilon_total_after"], "epsilon_total_after"),
            client_epsilon_after=_float(obj["client_epsilon_after"], "client_epsilon_after"),
            heldout_size=size,
            expected_size=_float(obj["expected_size"], "expected_size", positive=True),
            noise_std_sum=_float(obj["noise_std_sum"], "noise_std_sum"),
            mask=mask,
            noise_draws=noise,
            recovered=recovered,
            release=release,
        )


def _secrets(obj: dict[str, Any], size: int, released: int) -> tuple[np.ndarray, np.ndarray]:
    """The secret subsample mask and noise draws of a (not recovered) pending entry."""
    packed = base64.b64decode(obj["mask_b64"], validate=True)
    if hashlib.sha256(packed).hexdigest() != obj["mask_sha256"]:
        raise ValueError("mask digest does not match")
    mask = np.unpackbits(np.frombuffer(packed, dtype=np.uint8))[:size].astype(bool)
    if mask.size != size:
        raise ValueError("mask shorter than heldout_size")
    noise = np.asarray([_float(x, "noise_draws[]") for x in obj["noise_draws"]], dtype=np.float64)
    if noise.shape != (released,):
        raise ValueError("noise_draws must have one entry per released value")
    return mask, noise


@dataclass
class LedgerRelease:
    pending: PendingRelease
    values: tuple[float, ...] | None = None  # None until the completed entry is written

    @property
    def completed(self) -> bool:
        return self.values is not None


class Ledger:
    """Append-only privacy ledger. Thread-safe; every append is durable when it returns."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self._releases: dict[str, LedgerRelease] = {}
        self._by_request: dict[tuple[str, str], str] = {}
        self._load()

    # -- reading ---------------------------------------------------------------------------
    def _load(self) -> None:
        if not self.path.exists():
            return
        with self.path.open("rb") as handle:
            for line_number, raw in enumerate(handle, start=1):
                try:
                    obj = json.loads(raw)
                    if not isinstance(obj, dict):
                        raise ValueError("not a JSON object")
                    self._apply(obj)
                except (ValueError, KeyError, TypeError, UnicodeDecodeError) as error:
                    # The error names the field, never a value (values here are owner-private).
                    raise LedgerCorruptError(
                        f"privacy ledger {self.path} line {line_number} is corrupt ({type(error).__name__}: "
                        f"{_safe_reason(error)}). Refusing to start: the privacy spend is never silently reset. "
                        f"Restore the file from a backup; do not delete it."
                    ) from None

    def _apply(self, obj: dict[str, Any]) -> None:
        kind = obj.get("type")
        if kind == "pending":
            pending = PendingRelease.from_json(obj)
            if pending.release_id in self._releases:
                raise ValueError("duplicate release_id")
            self._releases[pending.release_id] = LedgerRelease(pending)
            if pending.request_id:
                self._by_request[(pending.client, pending.request_id)] = pending.release_id
        elif kind == "completed":
            release = self._releases.get(_str(obj["release_id"], "release_id"))
            if release is None:
                raise ValueError("completed entry for an unknown release_id")
            values = tuple(_float(x, "values[]") for x in obj["values"])
            if len(values) != release.pending.released_count:
                raise ValueError("values must have one entry per released value")
            release.values = values
        else:
            raise ValueError("unknown entry type")

    def releases(self) -> list[LedgerRelease]:
        """Every charged release, in ledger order (pending-only ones included)."""
        with self._lock:
            return list(self._releases.values())

    def find(self, client: str, request_id: str) -> LedgerRelease | None:
        if not request_id:
            return None
        with self._lock:
            release_id = self._by_request.get((client, request_id))
            return self._releases.get(release_id) if release_id else None

    # -- writing ---------------------------------------------------------------------------
    def append_pending(self, pending: PendingRelease) -> None:
        """Durably record a charge. Must return before evaluation of that release starts."""
        with self._lock:
            if pending.release_id in self._releases:
                raise ValueError("duplicate release_id")
            append_line(self.path, json.dumps(pending.to_json(), allow_nan=False))
            self._releases[pending.release_id] = LedgerRelease(pending)
            if pending.request_id:
                self._by_request[(pending.client, pending.request_id)] = pending.release_id

    def append_completed(self, release_id: str, values: tuple[float, ...]) -> None:
        """Durably record the released values. Must return before the response is sent."""
        with self._lock:
            release = self._releases[release_id]
            if release.completed:
                return  # a concurrent retry already completed it with the same values
            entry = {"type": "completed", "release_id": release_id, "values": [float(v) for v in values]}
            append_line(self.path, json.dumps(entry, allow_nan=False))
            release.values = tuple(float(v) for v in values)


def write_new_ledger(path: str | Path, releases: list[LedgerRelease]) -> None:
    """Write a whole ledger at once (a rebuild), durably and atomically. Never overwrites."""
    path = Path(path)
    if path.exists():
        raise FileExistsError(f"{path} exists; move it aside first")
    lines = []
    for release in releases:
        lines.append(json.dumps(release.pending.to_json(), allow_nan=False))
        if release.completed:
            entry = {"type": "completed", "release_id": release.pending.release_id, "values": list(release.values)}
            lines.append(json.dumps(entry, allow_nan=False))
    write_atomically(path, "".join(line + "\n" for line in lines).encode("utf-8"))


def _safe_reason(error: Exception) -> str:
    if isinstance(error, KeyError):
        return f"missing field {error.args[0]!r}"
    if isinstance(error, json.JSONDecodeError):
        return "not valid JSON"
    return str(error)


def _str(value: Any, name: str, allow_empty: bool = False) -> str:
    if not isinstance(value, str) or (not value and not allow_empty):
        raise ValueError(f"{name} must be a non-empty string")
    return value


def _float(value: Any, name: str, positive: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number")
    if positive and value <= 0:
        raise ValueError(f"{name} must be positive")
    return float(value)


def _int(value: Any, name: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}")
    return value
