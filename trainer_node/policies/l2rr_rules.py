"""L2RR's source-side rules: per-prompt history, predicted waste, rollout allocation, q.

Pure functions over numpy arrays plus one small state container, so each rule can be
checked by hand (tests/trainer_node/test_policy_l2rr.py) and read next to docs/L2RR.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from trainer_node.policies.waste_index import WasteIndex


def beta_bernoulli_all_same(
    successes: np.ndarray, failures: np.ndarray, n: int
) -> tuple[np.ndarray, np.ndarray]:
    """P(all n next rewards correct), P(all n wrong) under a Beta(1+S, 1+F) success rate.

    Beta-binomial predictive: P(all correct) = prod_{j<n} (a+j)/(a+b+j), with a = 1+S, b = 1+F;
    symmetric for all wrong. Fractional S/F (mean rewards in [0, 1]) are fine.
    """
    a = 1.0 + np.asarray(successes, dtype=np.float64)
    b = 1.0 + np.asarray(failures, dtype=np.float64)
    all_correct = np.ones_like(a)
    all_wrong = np.ones_like(a)
    for j in range(n):
        all_correct *= (a + j) / (a + b + j)
        all_wrong *= (b + j) / (a + b + j)
    return all_correct, all_wrong


def predicted_waste(successes: np.ndarray, failures: np.ndarray, n: int) -> np.ndarray:
    """Probability that a group of n fresh rollouts has zero reward variance."""
    all_correct, all_wrong = beta_bernoulli_all_same(successes, failures, n)
    return all_correct + all_wrong


def allocate_rollouts(success_rate: np.ndarray, n: int, n_min: int) -> np.ndarray:
    """Rollouts per prompt ~ n * 4p(1-p) (Bernoulli variance, 1 at p=1/2), clipped to [n_min, n]."""
    p = np.asarray(success_rate, dtype=np.float64)
    wanted = np.ceil(n * 4.0 * p * (1.0 - p) - 1e-9)  # -1e-9: 4*0.5*0.5*n must stay n, not n+1
    return np.clip(wanted, min(n_min, n), n).astype(np.int64)


def mixed_distribution(logits: np.ndarray, floor: float) -> np.ndarray:
    """q = (1 - floor) * softmax(logits) + floor / C: no cluster's share drops below floor / C."""
    z = np.exp(logits - logits.max())
    return (1.0 - floor) * z / z.sum() + floor / len(logits)


@dataclass
class PromptHistory:
    """What L2RR remembers about each source prompt (arrays indexed by pool index).

    waste: consecutive zero-variance groups since the prompt's last informative group, capped
        at max_waste (reset to 0 by an informative group; docs/L2RR.md says why).
    last_mean / last_count: mean reward and size of the prompt's latest group.
    times_sampled: groups ever generated for the prompt (0 = no history).
    index: the policy's WasteIndex (buckets by cluster and waste level, per-cluster sums), kept
        in step by `record` / `record_groups`; None for a bare history (the rule tests).
    Write through `record` / `record_groups` only: the index follows those.
    """

    waste: np.ndarray
    last_mean: np.ndarray
    last_count: np.ndarray
    times_sampled: np.ndarray
    index: WasteIndex | None = field(default=None, compare=False)

    @classmethod
    def empty(cls, size: int) -> PromptHistory:
        return cls(
            waste=np.zeros(size, dtype=np.int64),
            last_mean=np.zeros(size, dtype=np.float64),
            last_count=np.zeros(size, dtype=np.int64),
            times_sampled=np.zeros(size, dtype=np.int64),
        )

    def indexed(
        self, cluster_of: np.ndarray, clusters: int, max_waste: int, order: np.ndarray | None = None
    ) -> PromptHistory:
        """This history with a WasteIndex over `cluster_of` (built once, O(N log N)); `order`
        restores a saved bucket order (WasteIndex)."""
        self.index = WasteIndex(cluster_of, clusters, self.waste, self.times_sampled > 0, max_waste + 1, order)
        return self

    def record(self, index: int, mean_reward: float, count: int, zero_variance: bool, max_waste: int) -> None:
        old, seen = int(self.waste[index]), bool(self.times_sampled[index] > 0)
        self.times_sampled[index] += 1
        self.last_mean[index] = mean_reward
        self.last_count[index] = count
        new = min(old + 1, max_waste) if zero_variance else 0
        self.waste[index] = new
        if self.index is not None:
            self.index.update(int(index), old, new, seen)

    def record_groups(
        self, indices: np.ndarray, means: np.ndarray, counts: np.ndarray, zero_variance: np.ndarray, max_waste: int
    ) -> None:
        """`record` for one step's groups at once (distinct prompts; vectorised, O(groups))."""
        indices = np.asarray(indices, dtype=np.int64)
        if len(np.unique(indices)) != len(indices):  # a repeated prompt: its records must compose in order
            for i, m, c, z in zip(indices.tolist(), means, counts, zero_variance):
                self.record(i, float(m), int(c), bool(z), max_waste)
            return
        old = self.waste[indices].copy()
        seen = self.times_sampled[indices] > 0
        new = np.where(zero_variance, np.minimum(old + 1, max_waste), 0)
        self.times_sampled[indices] += 1
        self.last_mean[indices] = means
        self.last_count[indices] = counts
        self.waste[indices] = new
        if self.index is not None:
            for i, a, b, s in zip(indices.tolist(), old.tolist(), new.tolist(), seen.tolist()):
                if a != b or not s:
                    self.index.update(i, a, b, s)

    def evidence(self, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Pseudo-counts (successes, failures) of each prompt's current success rate.

        The latest group counts once; during a waste streak of length s the s identical
        zero-variance groups count s times (approximated by s copies of the latest group).
        History before the last informative group is forgotten: it came from an older model.
        """
        sampled = self.times_sampled[indices] > 0
        repeats = np.where(sampled, np.maximum(self.waste[indices], 1), 0)
        trials = self.last_count[indices] * repeats
        successes = self.last_mean[indices] * trials
        return successes, trials - successes

    def cluster_waste(self, members: list[np.ndarray]) -> np.ndarray:
        """Mean waste counter over the prompts of each cluster that have history (0 if none).

        O(C) from the index's running sums; without an index, one pass over `members`."""
        if self.index is not None:
            return self.index.cluster_waste()
        out = np.zeros(len(members))
        for c, idx in enumerate(members):
            seen = idx[self.times_sampled[idx] > 0]
            out[c] = float(self.waste[seen].mean()) if len(seen) else 0.0
        return out

    def state_dict(self) -> dict[str, Any]:
        return {
            "waste": self.waste.tolist(),
            "last_mean": self.last_mean.tolist(),
            "last_count": self.last_count.tolist(),
            "times_sampled": self.times_sampled.tolist(),
        }

    @classmethod
    def from_state(cls, state: dict[str, Any], size: int) -> PromptHistory:
        history = cls(
            waste=np.asarray(state["waste"], dtype=np.int64),
            last_mean=np.asarray(state["last_mean"], dtype=np.float64),
            last_count=np.asarray(state["last_count"], dtype=np.int64),
            times_sampled=np.asarray(state["times_sampled"], dtype=np.int64),
        )
        for name in ("waste", "last_mean", "last_count", "times_sampled"):
            if getattr(history, name).shape != (size,):
                raise ValueError(
                    f"l2rr state: {name} has {len(getattr(history, name))} entries, the pool has {size}"
                )
        if (history.waste < 0).any():
            raise ValueError("l2rr state: waste counters must be >= 0")
        return history
