"""What a feedback query asks the owner to release: accuracy, or clipped differences from a base.

A policy names its release in its options (`[policy.release]`, L2RR's): the owner then answers
each lookahead query either with every checkpoint's (noisy) accuracy, or, with kind =
"difference", with each candidate's mean per-row accuracy change from the live model, each row
clipped to a public bound c so the noise is calibrated to c instead of 1 (docs/PRIVACY.md,
"Difference releases"; rlvr_core/differences.py). The owner must list the kind in GetInfo.

c is public and chosen by the trainer from its OWN prompts, never from a release: before each
query the trainer computes the same per-row differences of the query's candidates on
`calibration_prompts` of its source prompts (trainer_node/feedback/clip_calibration.py) and takes
the `clip_quantile` quantile of their absolute values, capped at the owner's max_clip. A fixed
`clip` skips that.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from rlvr_core.configuration import Section


class ReleaseOptions(Section):
    """The release a policy's feedback queries ask for (`[policy.release]`)."""

    kind: Literal["accuracy", "difference"] = Field(
        default="accuracy",
        description="'accuracy': each checkpoint's noisy held-out accuracy (every owner serves it); "
        "'difference': each candidate's clipped accuracy change from the live model, noise calibrated to the "
        "clip (the owner must list RELEASE_KIND_ACCURACY_DIFFERENCE in GetInfo).",
    )
    metric: str = Field(
        default="answer_probability",
        description="difference: the per-row metric (rlvr_core/differences.py), one the owner serves: "
        "'answer_probability' (the change in the probability of the reference answer; short answers, no "
        "generation), 'importance' (importance-weighted change of the reward on the live model's own samples; "
        "chain-of-thought too), 'log_ratio' (its first-order form).",
    )
    clip: float | None = Field(
        default=None, gt=0,
        description="difference: a fixed per-row bound c; None chooses c before each query from the trainer's own "
        "prompts (clip_quantile of |difference| over calibration_prompts of them), capped at the owner's "
        "max_clip.",
    )
    clip_quantile: float = Field(
        default=0.9, gt=0, le=1,
        description="difference, clip = None: the quantile of the trainer's own per-row |differences| used as c.",
    )
    calibration_prompts: int = Field(
        default=64, ge=1,
        description="difference, clip = None: how many of the trainer's source prompts (a fixed sample of the "
        "pool) c is measured on.",
    )
    temperature: float = Field(
        default=1.0, gt=0,
        description="difference: the temperature the owner takes log-probabilities at (and samples the live "
        "model's completions at, for importance and log_ratio). Lower is closer to greedy accuracy.",
    )
    samples_per_prompt: int = Field(
        default=4, ge=1,
        description="difference, a metric that samples: completions per held-out prompt (the leave-one-out "
        "baseline needs >= 2).",
    )

    @field_validator("metric")
    @classmethod
    def _known_metric(cls, name: str) -> str:
        from rlvr_core.differences import difference_metric_names

        if name not in difference_metric_names():
            raise ValueError(f"unknown difference metric {name!r}; known: {', '.join(difference_metric_names())}")
        return name

    @property
    def is_difference(self) -> bool:
        return self.kind == "difference"

    @property
    def samples(self) -> bool:
        """The metric teacher-forces the live model's own samples (it needs a sampling decoding)."""
        from rlvr_core.differences import difference_metric

        return difference_metric(self.metric).generates


ACCURACY = ReleaseOptions()
