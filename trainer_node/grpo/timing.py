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


class PhaseClock:
    """Seconds per phase since the last `take()`."""

    def __init__(self) -> None:
        self._totals = dict.fromkeys(PHASES, 0.0)
        self._stack: list[list] = []  # [name, started] of the open phases, innermost last

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        if name not in self._totals:
            raise ValueError(f"unknown phase {name!r}; phases: {', '.join(PHASES)}")
        now = time.perf_counter()
        if self._stack:  # pause the enclosing phase
            outer = self._stack[-1]
            self._totals[outer[0]] += now - outer[1]
        self._stack.append([name, now])
        try:
            yield
        finally:
            end = time.perf_counter()
            inner = self._stack.pop()
            self._totals[inner[0]] += end - inner[1]
            if self._stack:  # resume it
                self._stack[-1][1] = end

    def add(self, name: str, seconds: float) -> None:
        """Count `seconds` measured elsewhere (on this thread) for `name`."""
        self._totals[name] += seconds

    def take(self) -> dict[str, float]:
        """The totals as `time/<phase>` record keys, then zero them."""
        out = {phase_key(name): seconds for name, seconds in self._totals.items()}
        self._totals = dict.fromkeys(PHASES, 0.0)
        return out
