"""Keep freed CPU memory in the process instead of handing it back to the kernel.

Why: a forward pass allocates and frees the same large activation buffers every step. glibc's
malloc serves blocks above its mmap threshold with fresh mappings and trims the heap top
after every large free, so each pass faults the same pages in again. The owner's scoring worker
took 3 million minor page faults and 5 s of kernel time in a 60-step `simulate` run (a quarter
of its CPU); the trainer's loop, 0.6 million. With the thresholds raised the buffers are
reused, and the process keeps its peak heap, which for these loops is the steady state anyway.

glibc only (Linux); elsewhere `keep_freed_memory` does nothing and says so.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

# mallopt(3) parameters (malloc.h)
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3

KEEP_BYTES = 1 << 30
"""Blocks up to this size come from the heap, and the heap keeps up to this much free at its top."""


def keep_freed_memory(keep_bytes: int = KEEP_BYTES) -> bool:
    """Raise glibc's mmap and trim thresholds to `keep_bytes`; True when they were set."""
    if keep_bytes < 1:
        raise ValueError(f"keep_bytes must be >= 1, got {keep_bytes}")
    if not sys.platform.startswith("linux"):
        return False
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # musl and other libcs have no mallopt
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    value = min(int(keep_bytes), 2**31 - 1)
    # Older glibc caps the mmap threshold at half its heap size (32 MiB on 64-bit).
    mmap_set = bool(mallopt(_M_MMAP_THRESHOLD, value)) or bool(mallopt(_M_MMAP_THRESHOLD, min(value, 32 << 20)))
    return mmap_set and bool(mallopt(_M_TRIM_THRESHOLD, value))
