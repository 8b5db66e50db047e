"""GRESO: skip prompts whose reward history predicts a zero-variance group, before rollout.

Rules from the public GRESO code (Infini-AI-Lab/GRESO, ray_trainer.py + DataProfiler):

- History: the mean group reward of every step the prompt was rolled out. Only the run of
  most recent entries matters, so we keep two streak counters per prompt instead of lists.
- Skip probability (pre-rollout): no history -> never skipped. If the latest entry is easy
  (mean >= easy_threshold), with z = consecutive most recent easy entries,
  P_skip = 1 - max(p_easy^z, keep_floor); if it is hard (mean <= hard_threshold), the same
  with p_hard. Anything else -> not skipped.
- Adaptive exploration, after each step: with alpha = target_zero_variance, the targets are
  alpha/3 easy and 2*alpha/3 hard (hard prompts are more likely to change as the model
  improves). If the step's easy ratio >= its target, p_easy -= p_step (skip more), else
  += p_step; same for hard; both clipped to [p_min, p_max].
- Adaptive sampling batch size, between rounds: with rho = this round's zero-variance ratio,
  B_est = int((target - have) / (1 - rho) * margin) prompts (GRESO writes it in
  trajectories, /n, which is the same). If B_est <= sampling_batch_size this is the last
  round; the next round samples max(min(B_est, sampling_batch_size), min_sampling_batch_size)
  non-skipped prompts. The batch is the first batch_size informative groups (as DAPO).

Scaled for our small batches (GRESO: sampling 384 / train 256 / min 64): sampling_batch_size
defaults to ceil(1.5 * batch_size) and min_sampling_batch_size to max(1, batch_size // 4).

Deviations: GRESO walks an epoch dataloader; we draw prompts uniformly each round (never one
already rolled out or skipped this step). GRESO adapts p only after epoch 0 (before that no
prompt has history); we adapt every step, since with per-step draws history exists early.
GRESO keeps sampling while B_est > sampling_batch_size; `max_num_gen_batches` (ours) caps
the rounds so a pool that is all zero-variance cannot loop forever.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Literal

import numpy as np
from pydantic import Field, ValidationInfo, field_validator

from trainer_node.policies.base import (
    POLICIES,
    DataPolicy,
    Group,
    RolloutRequest,
    SourcePool,
    StepRollouts,
    informative_groups,
)
from trainer_node.policies.options import PolicyOptions


class GresoOptions(PolicyOptions):
    name: Literal["greso"] = Field(
        default="greso", description="GRESO pre-rollout skipping of predicted-waste prompts."
    )
    p_easy: float = Field(default=0.5, gt=0, le=1, description="Initial keep base for easy prompts.")
    p_hard: float = Field(default=0.5, gt=0, le=1, description="Initial keep base for hard prompts.")
    easy_threshold: float = Field(
        default=0.98, description="Mean reward >= this: easy (binary rewards: all correct)."
    )
    hard_threshold: float = Field(
        default=0.11, description="Mean reward <= this: hard (binary rewards: all wrong); < easy_threshold."
    )
    keep_floor: float = Field(
        default=0.01, gt=0, le=1, description="A prompt is always kept with at least this probability."
    )
    target_zero_variance: float = Field(
        default=0.25, gt=0, lt=1, description="alpha: the zero-variance share the keep bases steer towards."
    )
    p_step: float = Field(default=0.01, ge=0, description="Step of the keep bases after each step.")
    p_min: float = Field(default=0.05, gt=0, le=1, description="Lowest keep base.")
    p_max: float = Field(default=0.95, gt=0, le=1, description="Highest keep base (>= p_min).")
    sampling_batch_size: int | None = Field(
        default=None, ge=1, description="Prompts per sampling round at most; None = ceil(1.5 * batch_size)."
    )
    min_sampling_batch_size: int | None = Field(
        default=None, ge=1, description="Prompts per sampling round at least; None = max(1, batch_size // 4)."
    )
    batch_margin: float = Field(
        default=1.25, gt=0, description="Safety factor on the adaptive round size B_est."
    )
    max_num_gen_batches: int = Field(
        default=8, ge=1, description="Sampling rounds per step at most (a pool of only waste cannot loop)."
    )

    @field_validator("hard_threshold")
    @classmethod
    def _below_easy(cls, value: float, info: ValidationInfo) -> float:
        easy = info.data.get("easy_threshold")
        if easy is not None and not value < easy:
            raise ValueError(f"must be < easy_threshold ({easy}), got {value}")
        return value

    @field_validator("p_max")
    @classmethod
    def _above_min(cls, value: float, info: ValidationInfo) -> float:
        low = info.data.get("p_min")
        if low is not None and value < low:
            raise ValueError(f"must be >= p_min ({low}), got {value}")
        return value


def skip_probability(
    easy_streak: int, hard_streak: int, p_easy: float, p_hard: float, keep_floor: float
) -> float:
    """GRESO's P_skip from the prompt's trailing run of easy or hard history entries."""
    if easy_streak > 0:
        return 1.0 - max(p_easy**easy_streak, keep_floor)
    if hard_streak > 0:
        return 1.0 - max(p_hard**hard_streak, keep_floor)
    return 0.0


def adaptive_batch_size(target: int, have: int, zero_var_ratio: float, margin: float) -> int:
    """GRESO's B_est: prompts to sample so that `target - have` informative groups arrive."""
    informative_rate = max(1.0 - zero_var_ratio, 1e-9)  # rho = 1 would divide by zero; B_est is capped anyway
    return int((target - have) / informative_rate * margin)


def step_probability(
    p: float, observed_ratio: float, target_ratio: float, step: float, lo: float, hi: float
) -> float:
    """Move a keep base toward the zero-variance target: too many -> skip more (smaller p)."""
    if observed_ratio >= target_ratio:
        return max(p - step, lo)
    return min(p + step, hi)


@POLICIES.register("greso", options=GresoOptions)
class GresoPolicy(DataPolicy):
    options: GresoOptions

    def __init__(self, pool: SourcePool, options: GresoOptions, rng: np.random.Generator):
        super().__init__(pool, options, rng)
        opts = options
        batch = options.batch_size
        self.sampling_batch_size = opts.sampling_batch_size or max(1, math.ceil(1.5 * batch))
        self.min_sampling_batch_size = opts.min_sampling_batch_size or max(1, batch // 4)
        self.p_easy = opts.p_easy
        self.p_hard = opts.p_hard
        self.easy_streak = np.zeros(len(pool), dtype=np.int64)
        self.hard_streak = np.zeros(len(pool), dtype=np.int64)
        # Per-step scratch, reset when a step starts (so_far.rounds == 0); never checkpointed
        # because the trainer checkpoints between steps.
        self._skipped: set[int] = set()
        self._last_round = False
        self._round_sizes: list[int] = []
        self._groups_before_round = 0
        self._step_metrics: dict[str, float] = {}

    # --- per-round sampling ---------------------------------------------------------------

    def skip_probabilities(self, indices: np.ndarray) -> np.ndarray:
        """Vectorised skip_probability over prompt indices."""
        easy = self.easy_streak[indices]
        hard = self.hard_streak[indices]
        floor = self.options.keep_floor
        p_easy = 1.0 - np.maximum(self.p_easy ** easy.astype(np.float64), floor)
        p_hard = 1.0 - np.maximum(self.p_hard ** hard.astype(np.float64), floor)
        return np.where(easy > 0, p_easy, np.where(hard > 0, p_hard, 0.0))

    def next_requests(self, step: int, so_far: StepRollouts) -> list[RolloutRequest]:
        if so_far.rounds == 0:
            self._skipped = set()
            self._last_round = False
            self._round_sizes = []
            self._groups_before_round = 0
            size = self.sampling_batch_size
        else:
            size = self._next_round_size(so_far)
            if size == 0:
                return []
        self._groups_before_round = len(so_far.groups)
        chosen = self._draw_unskipped(size, {g.index for g in so_far.groups})
        self._round_sizes.append(len(chosen))
        return [RolloutRequest(i, self.options.rollouts_per_prompt) for i in chosen]

    def _next_round_size(self, so_far: StepRollouts) -> int:
        """0 to stop; else the adaptive sampling batch size for the next round."""
        target = self.options.batch_size
        have = len(informative_groups(so_far.groups))
        if have >= target or self._last_round or so_far.rounds >= self.options.max_num_gen_batches:
            return 0
        this_round = so_far.groups[self._groups_before_round :]
        rho = sum(g.zero_variance for g in this_round) / max(len(this_round), 1)
        estimate = adaptive_batch_size(target, have, rho, self.options.batch_margin)
        if estimate <= self.sampling_batch_size:
            self._last_round = True
        return max(min(estimate, self.sampling_batch_size), self.min_sampling_batch_size)

    def _draw_unskipped(self, size: int, rolled_out: set[int]) -> list[int]:
        """Walk a uniform random order of fresh prompts, skipping each with its P_skip, until `size` kept.

        The walk is drawn lazily: uniform indices in chunks, dropping repeats and excluded prompts,
        which is exactly the prefix of a uniform permutation of the eligible prompts. Its cost is
        the walk's length (about size / keep rate), not the pool's; only when the walk has seen a
        large share of the pool does it finish with an explicit permutation of the rest."""
        exclude = rolled_out | self._skipped
        pool_size = len(self.pool)
        chosen: list[int] = []
        walked: set[int] = set()

        def visit(order: np.ndarray) -> bool:
            keep = self.rng.random(len(order)) >= self.skip_probabilities(order)
            for index, kept in zip(order.tolist(), keep.tolist()):
                if len(chosen) == size:
                    return True
                walked.add(index)
                if kept:
                    chosen.append(index)
                else:
                    self._skipped.add(index)
            return len(chosen) == size

        exclude = {i for i in exclude if 0 <= i < pool_size}
        while len(chosen) < size:
            done = len(exclude) + len(walked)  # disjoint: an excluded prompt is never walked
            if done >= pool_size:
                break
            if 4 * done > pool_size:  # repeats would dominate the chunks: permute what is left
                seen = np.fromiter(exclude | walked, dtype=np.int64)
                visit(self.rng.permutation(np.setdiff1d(np.arange(pool_size), seen)))
                break
            chunk = self.rng.integers(0, pool_size, size=max(2 * (size - len(chosen)), 64))
            _, first = np.unique(chunk, return_index=True)
            fresh = [i for i in chunk[np.sort(first)].tolist() if i not in exclude and i not in walked]
            if fresh and visit(np.asarray(fresh, dtype=np.int64)):
                break
        return chosen

    # --- after rollout --------------------------------------------------------------------

    def training_groups(self, step: int, so_far: StepRollouts) -> list[Group]:
        kept = informative_groups(so_far.groups)
        total = max(len(so_far.groups), 1)
        self._step_metrics = {
            "rounds": float(so_far.rounds),
            "kept_groups": float(min(len(kept), self.options.batch_size)),
            "zero_variance_frac": float(sum(g.zero_variance for g in so_far.groups) / total),
            "rollouts_generated": float(so_far.rollouts_generated),
            "skipped": float(len(self._skipped)),
            "last_sampling_batch_size": float(self._round_sizes[-1] if self._round_sizes else 0),
            "cap_hit": float(len(kept) < self.options.batch_size),
        }
        return kept[: self.options.batch_size]

    def observe(self, step: int, groups: Sequence[Group]) -> None:
        opts = self.options
        if not groups:
            return
        indices = np.fromiter((g.index for g in groups), dtype=np.int64, count=len(groups))
        means = np.fromiter((g.mean_reward for g in groups), dtype=np.float64, count=len(groups))
        is_easy = means >= opts.easy_threshold
        is_hard = ~is_easy & (means <= opts.hard_threshold)
        if len(np.unique(indices)) == len(indices):
            # Vectorised: a streak grows on its kind and resets to 0 on anything else.
            self.easy_streak[indices] = np.where(is_easy, self.easy_streak[indices] + 1, 0)
            self.hard_streak[indices] = np.where(is_hard, self.hard_streak[indices] + 1, 0)
        else:  # a repeated prompt: its updates must compose in order
            for index, easy_one, hard_one in zip(indices.tolist(), is_easy.tolist(), is_hard.tolist()):
                self.easy_streak[index] = self.easy_streak[index] + 1 if easy_one else 0
                self.hard_streak[index] = self.hard_streak[index] + 1 if hard_one else 0
        alpha = opts.target_zero_variance
        easy_ratio, hard_ratio = float(is_easy.mean()), float(is_hard.mean())
        self.p_easy = step_probability(
            self.p_easy, easy_ratio, alpha / 3, opts.p_step, opts.p_min, opts.p_max
        )
        self.p_hard = step_probability(
            self.p_hard, hard_ratio, 2 * alpha / 3, opts.p_step, opts.p_min, opts.p_max
        )
        self._step_metrics.update(
            {"easy_frac": easy_ratio, "hard_frac": hard_ratio, "p_easy": self.p_easy, "p_hard": self.p_hard}
        )

    # --- checkpoint -----------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        return {
            "p_easy": self.p_easy,
            "p_hard": self.p_hard,
            "easy_streak": self.easy_streak.tolist(),
            "hard_streak": self.hard_streak.tolist(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        easy = np.asarray(state["easy_streak"], dtype=np.int64)
        hard = np.asarray(state["hard_streak"], dtype=np.int64)
        if easy.shape != (len(self.pool),) or hard.shape != (len(self.pool),):
            raise ValueError(
                f"greso state is for a pool of {easy.shape[0]} prompts, this pool has {len(self.pool)}"
            )
        self.p_easy = float(state["p_easy"])
        self.p_hard = float(state["p_hard"])
        self.easy_streak = easy
        self.hard_streak = hard

    def metrics(self) -> dict[str, float]:
        return {"p_easy": self.p_easy, "p_hard": self.p_hard, **self._step_metrics}
