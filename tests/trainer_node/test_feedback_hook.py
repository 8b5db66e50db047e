"""The feedback pieces the run loop uses, apart from the loop: the one OwnerFeedback wiring and
the loop-level OwnerFeedbackHook (stats per step, selection candidates, the final release)."""

from __future__ import annotations

from types import SimpleNamespace

from trainer_node.feedback.client import FeedbackError
from trainer_node.feedback.context import FeedbackSettings, FeedbackStats, connect_owner_feedback
from trainer_node.feedback.hook import OwnerFeedbackHook


class FakeClient:
    def __init__(self, dp: bool | None):
        self.dp = dp

    def info(self):
        if self.dp is None:
            raise FeedbackError("owner down")
        return SimpleNamespace(privacy=SimpleNamespace(enabled=self.dp))


def test_one_wiring_builds_pacer_and_decoding_from_the_settings(tmp_path):
    settings = FeedbackSettings(total_steps=40, max_new_tokens=6, seed=3, samples_per_prompt=2, temperature=0.5,
                                min_interval=4, reserve_queries=1)
    feedback = connect_owner_feedback(FakeClient(dp=False), trainer=None, settings=settings, workdir=tmp_path / "w")
    pacer, decoding = feedback.pacer, feedback.decoding
    assert (pacer.total_steps, pacer.min_interval, pacer.reserve_queries, pacer.dp_enabled) == (40, 4, 1, False)
    assert (decoding.max_new_tokens, decoding.samples_per_prompt, decoding.seed) == (6, 2, 3)
    assert abs(decoding.temperature - 0.5) < 1e-6
    assert (tmp_path / "w").is_dir()


def test_an_owner_down_at_start_is_assumed_to_charge(tmp_path):
    settings = FeedbackSettings(total_steps=5, max_new_tokens=4, seed=0)
    feedback = connect_owner_feedback(FakeClient(dp=None), None, settings, tmp_path)
    assert feedback.pacer.dp_enabled  # the conservative assumption: pace as if every release costs
    assert feedback.decoding.temperature == 0.0 and feedback.decoding.samples_per_prompt == 1


class FakeOwnerFeedback:
    def __init__(self, release: float | None = 0.7):
        self.stats = FeedbackStats(queries=3, failures=1, epsilon_spent=0.25)
        self.release = release
        self.released_at: list[int] = []

    def release_current(self, step: int) -> float | None:
        self.released_at.append(step)
        return self.release


class FakeSelector:
    def __init__(self):
        self.steps: list[int] = []

    def after_step(self, step: int) -> None:
        self.steps.append(step)

    def select(self):
        return "chosen"


def test_the_hook_adds_stats_to_each_step_and_collects_candidates():
    checks: list[str] = []
    selector = FakeSelector()
    hook = OwnerFeedbackHook(FakeOwnerFeedback(), selector=selector, health_check=lambda: checks.append("alive"))
    record: dict = {}
    hook.after_step(2, record)
    assert record == {"feedback_queries": 3, "feedback_failures": 1, "epsilon_spent": 0.25,
                      "feedback_uploaded_bytes": 0, "feedback_query_uploaded_bytes": 0,
                      "feedback_noise_std": 0.0, "feedback_clip": 0.0}
    assert selector.steps == [2] and checks == ["alive"]
    outcome = hook.finish(2)
    assert outcome.selection == "chosen" and outcome.evals == []  # no final release unless asked


def test_the_final_release_is_logged_and_summarised():
    owner = FakeOwnerFeedback(release=0.7)
    outcome = OwnerFeedbackHook(owner, final_release=True).finish(9)
    assert owner.released_at == [9]
    assert outcome.evals == [{"name": "target_feedback", "accuracy": 0.7}]
    assert outcome.summary == {"target_feedback_accuracy": 0.7, "feedback_queries": 3, "feedback_failures": 1,
                               "epsilon_spent": 0.25, "feedback_query_uploaded_bytes": 0}
    unanswered = OwnerFeedbackHook(FakeOwnerFeedback(release=None), final_release=True).finish(9)
    assert unanswered.evals == [] and "target_feedback_accuracy" not in unanswered.summary
