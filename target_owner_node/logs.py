"""Structured logs: one JSON object per line on stderr.

Only operational facts go here (event name, client identity, checkpoint ids, epsilon,
sizes, durations). Never prompts, answers, generations, per-example scores or exception
texts (which could quote any of those): callers pass explicit fields, and only JSON scalars
and lists of them are written.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from typing import Any, TextIO

_lock = threading.Lock()
_stream: TextIO | None = None  # None = sys.stderr at call time (pytest swaps it)
_enabled = True


def configure(stream: TextIO | None = None, enabled: bool = True) -> None:
    """Send logs to `stream` (default stderr) or silence them."""
    global _stream, _enabled
    _stream, _enabled = stream, enabled


def log_event(event: str, **fields: Any) -> None:
    """Write one log line: {"time", "level", "event", **fields}."""
    if not _enabled:
        return
    record = {"time": round(time.time(), 3), "event": event}
    for key, value in fields.items():
        record[key] = (
            value if isinstance(value, (str, int, float, bool, type(None), list, tuple)) else str(value)
        )
    line = json.dumps(record, default=str)
    with _lock:
        stream = _stream or sys.stderr
        stream.write(line + "\n")
        stream.flush()
