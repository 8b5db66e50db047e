"""The calibrated noise multiplier and rows_per_query, cached in the storage folder so a restart
takes no seconds.

Calibration (protocol.privacy.calibrate_noise_multiplier) is a deterministic search over the
accountant: its result is a function of the privacy targets, the accountant, the search
tolerance and the accounting library's version, all public. The cache is keyed by every one
of them, so an entry is used only where a fresh calibration would give the same number; any
other entry (another budget, another opacus, a damaged file) is ignored and recalibrated.
Calibrating imports opacus and torch (seconds) and runs the search (seconds more); a cached
start does neither. rows_per_query (protocol.privacy.mechanisms) is a binomial quantile of the
public held-out size, sample rate and tail; computing it imports scipy.stats (1-4 s on a busy
2-core machine), so it is cached the same way, keyed by its inputs and scipy's version.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import Any

from protocol.privacy.accountants import CALIBRATION_TOLERANCE, calibrate_noise_multiplier
from target_owner_node.durable import write_atomically
from target_owner_node.logs import log_event

CACHE_FILE = "noise_multiplier_cache.json"
RULE = "protocol.privacy.calibrate_noise_multiplier/1"  # bump when the search itself changes
ROWS_CACHE_FILE = "rows_per_query_cache.json"
ROWS_RULE = "protocol.privacy.mechanisms.rows_per_query/1"  # bump when that function changes


def calibration_key(epsilon: float, delta: float, sample_rate: float, releases: int, accountant: str) -> dict[str, Any]:
    """Everything the calibrated value depends on."""
    try:
        library = metadata.version("opacus")
    except metadata.PackageNotFoundError:
        library = "absent"
    return {
        "rule": RULE,
        "epsilon": float(epsilon),
        "delta": float(delta),
        "sample_rate": float(sample_rate),
        "planned_releases": int(releases),
        "accountant": str(accountant),
        "tolerance": CALIBRATION_TOLERANCE,
        "opacus": library,
    }


def cached_noise_multiplier(
    folder: Path,
    epsilon: float,
    delta: float,
    sample_rate: float,
    releases: int,
    accountant: str,
    calibrate: Callable[..., float] = calibrate_noise_multiplier,
) -> float:
    """The noise multiplier for these targets: from `folder`/noise_multiplier_cache.json when its
    key matches exactly, else calibrated now and written there (atomically)."""
    key = calibration_key(epsilon, delta, sample_rate, releases, accountant)
    path = Path(folder) / CACHE_FILE
    cached = _read(path)
    if cached is not None and cached.get("key") == key:
        value = cached.get("noise_multiplier")
        if isinstance(value, float) and value > 0:
            return value
    value = float(calibrate(epsilon, delta, sample_rate, releases, accountant=accountant))
    try:
        write_atomically(path, json.dumps({"key": key, "noise_multiplier": value}, indent=1).encode("utf-8"))
    except OSError as error:  # a read-only folder only costs the next start its calibration
        log_event("noise_cache_unwritable", level="warning", path=str(path), error=type(error).__name__)
    return value


def rows_key(heldout_size: int, sample_rate: float, tail: float) -> dict[str, Any]:
    """Everything rows_per_query depends on."""
    try:
        library = metadata.version("scipy")
    except metadata.PackageNotFoundError:
        library = "absent"
    return {"rule": ROWS_RULE, "heldout_size": int(heldout_size), "sample_rate": float(sample_rate),
            "tail": float(tail), "scipy": library}


def cached_rows_per_query(
    folder: Path, heldout_size: int, sample_rate: float, tail: float,
    compute: Callable[[int, float, float], int] | None = None,
) -> int:
    """rows_per_query(heldout_size, sample_rate, tail): from `folder`/rows_per_query_cache.json when
    its key matches exactly, else computed now and written there (atomically)."""
    key = rows_key(heldout_size, sample_rate, tail)
    path = Path(folder) / ROWS_CACHE_FILE
    cached = _read(path)
    if cached is not None and cached.get("key") == key:
        value = cached.get("rows_per_query")
        if isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= heldout_size:
            return value
    if compute is None:
        from protocol.privacy.mechanisms import rows_per_query as compute
    value = int(compute(heldout_size, sample_rate, tail))
    try:
        write_atomically(path, json.dumps({"key": key, "rows_per_query": value}, indent=1).encode("utf-8"))
    except OSError as error:
        log_event("rows_cache_unwritable", level="warning", path=str(path), error=type(error).__name__)
    return value


def _read(path: Path) -> dict[str, Any] | None:
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None
