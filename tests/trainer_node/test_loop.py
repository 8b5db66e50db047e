"""The one run loop (trainer_node/loop.py): order of evals, checkpoints and hook calls, with fakes;
and the check that train, simulate and the GRPO tool all drive this same loop."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from trainer_node import loop
from trainer_node.config import parse_config
from trainer_node.loop import FeedbackOutcome, Schedule, run_loop


class FakeTrainer:
    def __init__(self, start: int = 0):
        self.step_index = start
        self.rollouts_cumulative = 10 * start
        self.events: list[str] = []

    def train_step(self) -> dict[str, Any]:
        record = {"step": self.step_index}
        self.step_index += 1
        self.rollouts_cumulative += 10
        self.events.append(f"train{self.step_index}")
        return record


class FakeOutput:
    def __init__(self, events: list[str]):
        self.events, self.steps, self.evals = events, [], []

    def log_step(self, record: dict[str, Any]) -> None:
        self.events.append(f"log{record['step'] + 1}")
        self.steps.append(dict(record))

    def log_eval(self, record: dict[str, Any]) -> None:
        self.events.append(f"eval:{record['name']}@{record['step']}")
        self.evals.append(record)


class FakeEvaluation:
    def __init__(self, events: list[str]):
        self.events, self.labels = events, []

    def evaluate(self, label: str) -> dict[str, Any]:
        self.labels.append(label)
        return {"name": "acc", "accuracy": len(self.labels) / 10}


class FakeFeedback:
    def __init__(self, events: list[str]):
        self.events = events

    def after_step(self, step: int, record: dict[str, Any]) -> None:
        self.events.append(f"hook{step}")
        record["queries"] = step

    def finish(self, step: int) -> FeedbackOutcome:
        self.events.append(f"finish{step}")
        return FeedbackOutcome(evals=[{"name": "released", "accuracy": 0.5}], summary={"queries": step})


@pytest.fixture
def saved(monkeypatch):
    saves: list[Path] = []

    def fake_save(trainer, directory):
        trainer.events.append(f"save:{Path(directory).name}")
        saves.append(Path(directory))
        return Path(directory)

    monkeypatch.setattr(loop, "save_checkpoint", fake_save)
    return saves


def test_the_loop_reads_top_to_bottom(saved, tmp_path):
    trainer = FakeTrainer()
    output, evaluation, feedback = FakeOutput(trainer.events), FakeEvaluation(trainer.events), FakeFeedback(trainer.events)
    schedule = Schedule(steps=4, eval_every=2, save_every=3, checkpoint_dir=tmp_path / "checkpoints")
    result = run_loop(trainer, output, schedule, evaluation, feedback)
    assert trainer.events == [
        "eval:acc@0",
        "train1", "hook1", "log1",
        "train2", "hook2", "log2", "eval:acc@2",
        "train3", "hook3", "log3", "save:step_000003",
        "train4", "hook4", "log4",                    # no periodic eval/save at the last step...
        "eval:acc@4", "save:step_000004",             # ...the final ones instead
        "finish4", "eval:released@4",
    ]
    assert evaluation.labels == ["initial", "step2", "final"]
    assert [s["queries"] for s in output.steps] == [1, 2, 3, 4]  # the hook's keys are in the logged record
    assert result.initial["step"] == 0 and result.final["step"] == 4 and result.final["rollouts_cumulative"] == 40
    assert result.final_checkpoint == tmp_path / "checkpoints" / "step_000004"
    assert result.feedback.summary == {"queries": 4}


def test_a_resumed_run_is_not_measured_again_before_it_continues(saved, tmp_path):
    trainer = FakeTrainer(start=2)
    output = FakeOutput(trainer.events)
    result = run_loop(trainer, output, Schedule(steps=3, checkpoint_dir=tmp_path), FakeEvaluation(trainer.events))
    assert result.initial is None
    assert trainer.events == ["train3", "log3", "eval:acc@3", "save:step_000003"]


def test_without_a_checkpoint_dir_nothing_is_saved_and_no_feedback_is_fine(saved):
    trainer = FakeTrainer()
    result = run_loop(trainer, FakeOutput(trainer.events), Schedule(steps=2, save_every=1),
                      FakeEvaluation(trainer.events))
    assert saved == [] and result.final_checkpoint is None
    assert result.feedback == FeedbackOutcome()


def test_an_evaluation_with_nothing_to_measure_logs_nothing(saved):
    class Nothing:
        def evaluate(self, label):
            return None

    trainer = FakeTrainer()
    output = FakeOutput(trainer.events)
    result = run_loop(trainer, output, Schedule(steps=1, eval_every=1), Nothing())
    assert output.evals == [] and result.initial is None and result.final is None


def test_train_simulate_and_the_grpo_tool_drive_this_one_loop():
    import importlib.util

    import lab.simulate
    import trainer_node.training

    spec = importlib.util.spec_from_file_location("bench_grpo_cpu", Path(__file__).parents[2] / "tools" / "bench_grpo_cpu.py")
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    assert tool.run_loop is loop.run_loop
    # train and simulate run the configured training engine; this project's own, the default, is run_loop
    from trainer_node.integrations import support

    for module in (trainer_node.training, lab.simulate):
        assert module.TRAINING_ENGINES is support.TRAINING_ENGINES, module.__name__
    sentinel = object()
    original = loop.run_loop
    try:
        loop.run_loop = lambda *args: sentinel
        engine = support.TRAINING_ENGINES.get(parse_config({"model": {"tiny": True}}).engine.name)()
        assert engine.run(type("Setup", (), {"trainer": None})(), None, None, None, None, None) is sentinel
    finally:
        loop.run_loop = original
