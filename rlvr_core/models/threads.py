"""Scoped torch CPU thread count.

Why this exists: on a small, busy CPU box (the 2-core dev/CI machine) OpenMP threads that
spin while waiting for each other are dramatically slower than one thread: generating with
the tiny policy took 96 s on 2 threads against 2.8 s on 1 while other processes ran. Models
this small gain little from a second thread even on an idle box.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch


@contextmanager
def torch_threads(count: int | None) -> Iterator[None]:
    """Run the block with `count` torch intra-op threads, then restore; None leaves it alone.

    torch's thread count is process-wide, so other threads of the process see the change
    while the block runs.
    """
    if count is None:
        yield
        return
    if count < 1:
        raise ValueError(f"num_threads must be >= 1, got {count}")
    previous = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(previous)
