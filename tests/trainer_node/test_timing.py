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
    record = clock.take()
    assert set(record) == {f"time/{name}" for name in PHASES} | {f"cpu/{name}" for name in PHASES}
    times = {k: v for k, v in record.items() if k.startswith("time/")}
    assert times["time/sampling"] == pytest.approx(0.03, abs=0.015)
    assert times["time/upload"] == pytest.approx(0.03, abs=0.015)
    assert times["time/owner_wait"] == pytest.approx(0.02, abs=0.015)
    assert sum(times.values()) == pytest.approx(wall, abs=1e-3)
    assert sum(clock.take().values()) == 0.0  # take() zeroes the totals


def _spin(seconds: float) -> None:
    until = time.thread_time() + seconds
    while time.thread_time() < until:
        pass


def test_cpu_seconds_tell_computing_from_waiting():
    """A phase that sleeps is wall time off the CPU; one that computes is both (goal 1 reads the gap)."""
    clock = PhaseClock()
    with clock.phase("owner_wait"):
        time.sleep(0.05)
    with clock.phase("update"):
        _spin(0.05)
        with clock.phase("candidates"):
            _spin(0.03)
    record = clock.take()
    assert record["time/owner_wait"] == pytest.approx(0.05, abs=0.02)
    assert record["cpu/owner_wait"] < 0.01
    assert record["cpu/update"] == pytest.approx(0.05, abs=0.01)  # the nested phase's CPU is its own
    assert record["cpu/candidates"] == pytest.approx(0.03, abs=0.01)
    assert record["cpu/update"] <= record["time/update"] + 1e-3


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
    assert "cpu/loop_s" not in summary  # a log from before the CPU split
    assert phase_split([{"kind": "train", "step": 0}]) == {}  # an old log without timings


def test_summary_reports_the_training_threads_cpu():
    train = [{"kind": "train", "step": s, "time/generation": 1.0, "time/update": 0.5, "time/owner_wait": 0.5,
              "cpu/generation": 0.9, "cpu/update": 0.5, "cpu/owner_wait": 0.0} for s in range(2)]
    split = phase_split(train)
    assert split["time/loop_s"] == pytest.approx(4.0)
    assert split["cpu/loop_s"] == pytest.approx(2.8)
    assert split["cpu/generation_s"] == pytest.approx(1.8)
