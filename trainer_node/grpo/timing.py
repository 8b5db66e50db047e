"""Where a training step's wall time goes, phase by phase (metrics.jsonl `time/<phase>`).

Phases are exclusive: time spent in a phase opened inside another (generation inside sampling,
reward inside generation, upload inside the policy's feedback update) counts for the inner one
only, so the phases of a step add up to its wall time. The clock belongs to the training
thread; work done on a background thread (asynchronous feedback) is reported by its owner as
statistics of its own, never through this clock.

    sampling     the data policy: choosing prompts, filtering groups, observing, its q update
    generation   rendering, tokenising and generating rollouts
    reward       verifying rollouts
    update       advantages, loss, backward and the optimizer step (and the engine's weight sync)
    candidates   building lookahead candidates (L2RR's one-step updates)
    upload       writing, hashing and uploading checkpoints to the owner
    owner_wait   waiting for the owner's release
    other        everything else of the step (its record, the run loop's hooks)

Beside each phase's wall seconds (`time/<phase>`) the clock keeps the training thread's own CPU
seconds in it (`cpu/<phase>`, time.thread_time). Wall minus CPU is time the thread did not run:
waiting for the owner, for the GIL, or for a core. More CPU for the same work is the thread
running slower, e.g. beside other work on a shared machine. Issue 14's goal 1 is read from both.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

PHASES: tuple[str, ...] = (
    "sampling", "generation", "reward", "update", "candidates", "upload", "owner_wait", "other",
)
FEEDBACK_PHASES: tuple[str, ...] = ("candidates", "upload", "owner_wait")
"""The phases that exist only because the run learns from target feedback."""


def phase_key(name: str) -> str:
    return f"time/{name}"


def cpu_key(name: str) -> str:
    return f"cpu/{name}"


class PhaseClock:
    """Wall and CPU seconds per phase since the last `take()` (the calling thread's CPU)."""

    def __init__(self) -> None:
        self._totals = dict.fromkeys(PHASES, 0.0)
        self._cpu = dict.fromkeys(PHASES, 0.0)
        self._stack: list[list] = []  # [name, wall started, cpu started] of the open phases, innermost last

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        if name not in self._totals:
            raise ValueError(f"unknown phase {name!r}; phases: {', '.join(PHASES)}")
        now, cpu = time.perf_counter(), time.thread_time()
        if self._stack:  # pause the enclosing phase
            self._count(self._stack[-1], now, cpu)
        self._stack.append([name, now, cpu])
        try:
            yield
        finally:
            end, cpu_end = time.perf_counter(), time.thread_time()
            self._count(self._stack.pop(), end, cpu_end)
            if self._stack:  # resume it
                self._stack[-1][1:] = [end, cpu_end]

    def _count(self, entry: list, now: float, cpu: float) -> None:
        name, started, cpu_started = entry
        self._totals[name] += now - started
        self._cpu[name] += cpu - cpu_started

    def add(self, name: str, seconds: float, cpu_seconds: float = 0.0) -> None:
        """Count `seconds` (and `cpu_seconds`) measured elsewhere on this thread for `name`."""
        self._totals[name] += seconds
        self._cpu[name] += cpu_seconds

    def take(self) -> dict[str, float]:
        """The totals as `time/<phase>` and `cpu/<phase>` record keys, then zero them."""
        out = {phase_key(name): seconds for name, seconds in self._totals.items()}
        out.update({cpu_key(name): seconds for name, seconds in self._cpu.items()})
        self._totals = dict.fromkeys(PHASES, 0.0)
        self._cpu = dict.fromkeys(PHASES, 0.0)
        return out
