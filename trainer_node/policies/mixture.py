"""Domain-mixture data policies (DataFlex-RL's third family, seed 001 Eq. 3): the policy
chooses p_t(d), the share of each step's prompts drawn from source domain d, from per-domain
statistics of earlier steps. It steers what is sampled next; it never touches the update.

Shared machinery for the four mixtures (static, reward_gap, dump_ucb, tscl), one module each:

- Domains are the pool's `Example.domain` values (the testbed's source domains: math, logic,
  text on the `dataflex` testbed), sorted by name.
- A step draws `batch_size` prompts: domain counts by largest-remainder rounding of
  p_t(d) * batch_size (as DataFlex-RL's replay buffer), ties broken at random (ours: DataFlex
  breaks them in domain order, which favours the first domains every step); prompts uniformly
  without replacement within each domain; a domain short of prompts is topped up uniformly from
  the others.
- Statistics (`DomainStats`), updated in `observe` from every generated rollout: a sliding
  window of the last `window` rollouts' rewards and absolute advantages per domain (DataFlex's
  DomainStatsTracker, window 50), cumulative rollout counts n_d, and each step's mean reward
  per domain for learning-progress slopes.
- The mixture is recomputed after every `update_every`-th step once `warmup_steps` steps have
  run on the equal prior (DataFlex-RL: warmup_step 1, update_step 1).
- Adaptive mixtures end with DataFlex's softmax-with-floor: p = softmax(score / T), then
  max(p, floor), renormalised (T = 1, floor = 0.05).

The absolute advantage is GRPO's (r - mean_g) / (std_g + 1e-6) of the rollout's group (0 for a
zero-variance group), computed here: a data policy does not see the trainer's estimator.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np
from pydantic import Field

from trainer_node.policies.base import DataPolicy, Group, RolloutRequest, SourcePool, StepRollouts
from trainer_node.policies.options import PolicyOptions


class AdaptiveMixtureOptions(PolicyOptions):
    """What the three adaptive mixtures share (their defaults are DataFlex-RL's run settings)."""

    window: int = Field(default=50, ge=1, description="Rollouts per domain in the sliding window of statistics.")
    warmup_steps: int = Field(
        default=1, ge=0, description="Steps sampled with the equal mixture before the first update."
    )
    update_every: int = Field(default=1, ge=1, description="Recompute the mixture after every k-th step.")
    temperature: float = Field(default=1.0, gt=0, description="T of the softmax over domain scores.")
    floor: float = Field(
        default=0.05, ge=0, lt=1, description="Least share of a domain before renormalising (no domain starves)."
    )


def softmax_with_floor(scores: np.ndarray, temperature: float, floor: float) -> np.ndarray:
    """DataFlex-RL's mixer output: softmax(scores / T), floored at `floor`, renormalised."""
    z = np.asarray(scores, dtype=np.float64) / max(temperature, 1e-6)
    p = np.exp(z - z.max())
    p = np.maximum(p / p.sum(), floor)
    return p / p.sum()


def allocate(proportions: np.ndarray, total: int, rng: np.random.Generator) -> np.ndarray:
    """Largest-remainder counts summing to `total`; equal remainders are ordered at random."""
    raw = np.asarray(proportions, dtype=np.float64) * total
    counts = np.floor(raw).astype(np.int64)
    remainder = raw - counts
    tiebreak = rng.random(len(raw))
    order = sorted(range(len(raw)), key=lambda d: (-round(float(remainder[d]), 12), tiebreak[d]))
    for d in order[: total - int(counts.sum())]:
        counts[d] += 1
    return counts


def group_abs_advantages(rewards: np.ndarray) -> np.ndarray:
    """|GRPO advantage| of each reward in one group: |r - mean| / (unbiased std + 1e-6); 0 when
    every reward is equal (the trainer's `grpo` estimator, for the mixture's signal only)."""
    if len(rewards) < 2 or np.all(rewards == rewards[0]):
        return np.zeros(len(rewards))
    return np.abs(rewards - rewards.mean()) / (rewards.std(ddof=1) + 1e-6)


class DomainStats:
    """Per-domain statistics of the rollouts generated so far (JSON state for resume)."""

    def __init__(self, domains: Sequence[str], window: int, series_length: int = 50):
        self.domains = list(domains)
        self.window = window
        self.rewards = {d: deque(maxlen=window) for d in self.domains}
        self.abs_advantages = {d: deque(maxlen=window) for d in self.domains}
        self.counts = dict.fromkeys(self.domains, 0)
        self.step_means = {d: deque(maxlen=series_length) for d in self.domains}

    def add_step(self, domain_of: dict[int, str], groups: Sequence[Group]) -> None:
        step_rewards: dict[str, list[float]] = {d: [] for d in self.domains}
        for group in groups:
            domain = domain_of[group.index]
            fresh = [r for r in group.rollouts if not r.reused]
            rewards = np.array([r.reward for r in fresh], dtype=np.float64)
            self.rewards[domain].extend(rewards.tolist())
            self.abs_advantages[domain].extend(group_abs_advantages(rewards).tolist())
            self.counts[domain] += len(fresh)
            step_rewards[domain].extend(rewards.tolist())
        for domain, values in step_rewards.items():
            if values:
                self.step_means[domain].append(float(np.mean(values)))

    def mean_reward(self) -> np.ndarray:
        return np.array([np.mean(self.rewards[d]) if self.rewards[d] else 0.0 for d in self.domains])

    def mean_abs_advantage(self) -> np.ndarray:
        return np.array([np.mean(self.abs_advantages[d]) if self.abs_advantages[d] else 0.0
                         for d in self.domains])

    def count_array(self) -> np.ndarray:
        return np.array([self.counts[d] for d in self.domains], dtype=np.float64)

    def reward_slope(self, last: int) -> np.ndarray:
        """Least-squares slope of each domain's per-step mean reward over its `last` entries
        (0 with fewer than two): TSCL's learning progress, per step."""
        slopes = []
        for d in self.domains:
            ys = np.array(list(self.step_means[d])[-last:], dtype=np.float64)
            if len(ys) < 2:
                slopes.append(0.0)
                continue
            xs = np.arange(len(ys), dtype=np.float64)
            slopes.append(float(((xs - xs.mean()) * (ys - ys.mean())).sum() / ((xs - xs.mean()) ** 2).sum()))
        return np.array(slopes)

    def state_dict(self) -> dict[str, Any]:
        return {
            "rewards": {d: list(v) for d, v in self.rewards.items()},
            "abs_advantages": {d: list(v) for d, v in self.abs_advantages.items()},
            "counts": dict(self.counts),
            "step_means": {d: list(v) for d, v in self.step_means.items()},
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if sorted(state["counts"]) != sorted(self.domains):
            raise ValueError(f"mixture state is for domains {sorted(state['counts'])}, this pool has "
                             f"{sorted(self.domains)}")
        for d in self.domains:
            self.rewards[d] = deque((float(x) for x in state["rewards"][d]), maxlen=self.window)
            self.abs_advantages[d] = deque((float(x) for x in state["abs_advantages"][d]), maxlen=self.window)
            self.counts[d] = int(state["counts"][d])
            self.step_means[d] = deque((float(x) for x in state["step_means"][d]),
                                       maxlen=self.step_means[d].maxlen)


class DomainMixturePolicy(DataPolicy):
    """Draws each step's prompts by domain shares p_t(d); subclasses say how p_t moves (`mix`)."""

    intervention_family: ClassVar[str] = "mixture"
    """DataFlex-RL's family of this policy (the bench groups its three-family table by it)."""

    def __init__(self, pool: SourcePool, options: PolicyOptions, rng: np.random.Generator):
        super().__init__(pool, options, rng)
        self.domains = sorted({example.domain for example in pool.examples})
        self.members = [np.array([i for i, e in enumerate(pool.examples) if e.domain == d], dtype=np.int64)
                        for d in self.domains]
        self.domain_of = {i: e.domain for i, e in enumerate(pool.examples)}
        self.proportions = np.full(len(self.domains), 1.0 / len(self.domains))
        self.stats = DomainStats(self.domains, getattr(options, "window", 50))
        self._drawn = np.zeros(len(self.domains), dtype=np.int64)

    def mix(self, step: int) -> np.ndarray:
        """The shares for the steps after `step` (called when the schedule says so); default: keep."""
        return self.proportions

    def signal(self) -> np.ndarray | None:
        """The per-domain score the mixture reads (logged as signal/<domain>); None: none."""
        return None

    def next_requests(self, step: int, so_far: StepRollouts) -> list[RolloutRequest]:
        if so_far.rounds > 0:
            return []
        size = min(self.options.batch_size, len(self.pool))
        counts = allocate(self.proportions, size, self.rng)
        chosen: list[int] = []
        leftovers: list[int] = []
        for members, count in zip(self.members, counts):
            order = self.rng.permutation(members)
            chosen.extend(int(i) for i in order[:count])
            leftovers.extend(int(i) for i in order[count:])
        short = size - len(chosen)
        if short > 0:  # a domain with fewer prompts than its share: top up from the others
            chosen.extend(int(i) for i in self.rng.choice(np.array(leftovers), size=short, replace=False))
        self._drawn = np.array([sum(1 for i in chosen if self.domain_of[i] == d) for d in self.domains])
        return [RolloutRequest(i, self.options.rollouts_per_prompt) for i in chosen]

    def observe(self, step: int, groups: Sequence[Group]) -> None:
        self.stats.add_step(self.domain_of, groups)
        warmup = getattr(self.options, "warmup_steps", 0)
        every = getattr(self.options, "update_every", 1)
        if step + 1 >= warmup and (step + 1) % every == 0:
            self.proportions = np.asarray(self.mix(step), dtype=np.float64)

    def state_dict(self) -> dict[str, Any]:
        return {"proportions": self.proportions.tolist(), "stats": self.stats.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        proportions = np.asarray(state["proportions"], dtype=np.float64)
        if proportions.shape != (len(self.domains),):
            raise ValueError(f"mixture state has {proportions.shape[0]} shares, this pool has "
                             f"{len(self.domains)} domains")
        self.proportions = proportions
        self.stats.load_state_dict(state["stats"])

    def metrics(self) -> dict[str, float]:
        out = {f"share/{d}": float(p) for d, p in zip(self.domains, self.proportions)}
        total = max(int(self._drawn.sum()), 1)
        out.update({f"drawn/{d}": float(c / total) for d, c in zip(self.domains, self._drawn)})
        signal = self.signal()
        if signal is not None:
            out.update({f"signal/{d}": float(v) for d, v in zip(self.domains, signal)})
        return out
