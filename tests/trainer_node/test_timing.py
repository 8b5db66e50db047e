"""Per-phase timings: exclusive nesting, the record keys, and the run summary's split."""

from __future__ import annotations

import time

import pytest

from trainer_node.grpo.timing import PHASES, PhaseClock
from trainer_node.run_output import phase_split, summarise


def test_nested_phases_are_exclusive_and_add_up():
    clock = PhaseClock()
    started = time.perf_counter()
    with clock.phase("sampling"):
        time.sleep(0.02)
        with clock.phase("upload"):
            time.sleep(0.03)
            with clock.phase("owner_wait"):
                time.sleep(0.02)
        time.sleep(0.01)
    wall = time.perf_counter() - started
    times = clock.take()
    assert set(times) == {f"time/{name}" for name in PHASES}
    assert times["time/sampling"] == pytest.approx(0.03, abs=0.015)
    assert times["time/upload"] == pytest.approx(0.03, abs=0.015)
    assert times["time/owner_wait"] == pytest.approx(0.02, abs=0.015)
    assert sum(times.values()) == pytest.approx(wall, abs=1e-3)
    assert sum(clock.take().values()) == 0.0  # take() zeroes the totals


def test_unknown_phase_is_refused():
    with pytest.raises(ValueError, match="unknown phase 'uplaod'"), PhaseClock().phase("uplaod"):
        pass


def test_summary_reports_the_split_and_the_feedback_share():
    train = [{"kind": "train", "step": s, "rollouts_cumulative": s, "time/generation": 1.0, "time/update": 0.5,
              "time/candidates": 0.25, "time/upload": 0.15, "time/owner_wait": 0.1} for s in range(4)]
    summary = summarise(train, wall_seconds=9.0)
    assert summary["time/loop_s"] == pytest.approx(8.0)
    assert summary["time/generation_s"] == pytest.approx(4.0)
    assert summary["time/feedback_share"] == pytest.approx(2.0 / 8.0)
    assert phase_split([{"kind": "train", "step": 0}]) == {}  # an old log without timings
