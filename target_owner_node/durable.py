"""Durable file writes: the ledger, the audit log and the checkpoint store only report
success after the bytes AND the directory entry are on disk (fsync), so a crash right after
a write can never lose it."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def fsync_dir(path: Path) -> None:
    """Make a file creation or rename durable: fsync its directory entry."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def append_line(path: Path, line: str) -> None:
    """Append one text line and fsync the file (and the folder when the file is new)."""
    if "\n" in line:
        raise ValueError("a durable line must not contain a newline")
    new_file = not path.exists()
    with path.open("a", encoding="utf-8") as handle:
        handle.write(line + "\n")
        handle.flush()
        os.fsync(handle.fileno())
    if new_file:
        fsync_dir(path.parent)


def write_atomically(path: Path, data: bytes) -> None:
    """Replace `path` with `data` so that readers see the old or the new file, never half."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)
