"""L2RR's prompts bucketed by (cluster, waste level): draws and cluster statistics in O(batch).

The within-cluster draw picks prompts without replacement with probability proportional to
exp(-lambda * waste_i). Waste is a small integer (0..max_waste), so the prompts of a cluster
fall into max_waste + 1 buckets of equal weight. Sequential sampling without replacement then
needs only the bucket sizes: pick a bucket with probability ~ (prompts left in it) *
exp(-lambda * level), then a uniform prompt left in that bucket. That is the same distribution
as a Gumbel top-k over every prompt of the cluster (both are successive sampling), at
O(take * levels) per cluster instead of O(cluster size).

Layout (no Python object per prompt, so memory stays linear and small):
    order   (N,) int64   prompt ids, grouped so that bucket b = cluster * L + level occupies
                         order[bounds[b]:bounds[b + 1]]
    pos     (N,) int64   where each prompt sits in `order`
    bounds  (C*L + 1,)   bucket boundaries
A prompt whose waste moves from level a to level b is walked across the |a - b| bucket
boundaries between them by one swap each (waste rises by one per zero-variance group and
resets to 0, so at most max_waste swaps). Per-cluster sums (prompts with history, their total
waste) are kept beside, so the cluster waste statistic needs no pass over the pool either.
Memory: 16 bytes per prompt here, plus PromptHistory's four 8-byte arrays (48 in all).
"""

from __future__ import annotations

import math

import numpy as np


class WasteIndex:
    def __init__(
        self,
        cluster_of: np.ndarray,
        clusters: int,
        waste: np.ndarray,
        seen: np.ndarray,
        levels: int,
        order: np.ndarray | None = None,
    ):
        """`order`: a saved `order` (state_dict) to resume with; the order inside a bucket decides
        which prompt a given random number picks, so a bit-exact resume needs it back."""
        self.cluster_of = np.asarray(cluster_of, dtype=np.int64)
        self.clusters = int(clusters)
        self.levels = max(int(levels), int(waste.max(initial=0)) + 1)
        bucket = self.cluster_of * self.levels + np.asarray(waste, dtype=np.int64)
        if order is None:
            order = np.argsort(bucket, kind="stable")
        else:
            order = np.asarray(order, dtype=np.int64)
            valid = order.shape == bucket.shape and (np.sort(order) == np.arange(len(bucket))).all()
            if not valid or (np.diff(bucket[order]) < 0).any():
                raise ValueError("l2rr state: bucket_order is not the pool's prompts grouped by cluster and waste")
        self.order = order.astype(np.int64)
        self.pos = np.empty(len(bucket), dtype=np.int64)
        self.pos[self.order] = np.arange(len(bucket), dtype=np.int64)
        counts = np.bincount(bucket, minlength=self.clusters * self.levels)
        self.bounds = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        seen = np.asarray(seen, dtype=bool)
        self.seen_count = np.bincount(self.cluster_of[seen], minlength=self.clusters).astype(np.int64)
        self.waste_sum = np.bincount(
            self.cluster_of[seen], weights=np.asarray(waste, dtype=np.float64)[seen], minlength=self.clusters
        )

    # --- updates ----------------------------------------------------------------------------

    def update(self, index: int, old_waste: int, new_waste: int, was_seen: bool) -> None:
        """Prompt `index` got a group: its waste went from old to new (it has history now)."""
        c = int(self.cluster_of[index])
        if not was_seen:
            self.seen_count[c] += 1
        self.waste_sum[c] += new_waste - (old_waste if was_seen else 0)
        if new_waste >= self.levels:
            raise ValueError(f"waste {new_waste} is above the index's top level {self.levels - 1}")
        self._move(int(index), c * self.levels + int(old_waste), c * self.levels + int(new_waste))

    def _swap(self, index: int, slot: int) -> None:
        order, pos = self.order, self.pos
        here = int(pos[index])
        other = int(order[slot])
        order[here], order[slot] = other, index
        pos[other], pos[index] = here, slot

    def _move(self, index: int, bucket: int, target: int) -> None:
        bounds = self.bounds
        while bucket < target:  # swap to the bucket's last slot, then shift the boundary left
            self._swap(index, int(bounds[bucket + 1]) - 1)
            bounds[bucket + 1] -= 1
            bucket += 1
        while bucket > target:  # swap to the bucket's first slot, then shift the boundary right
            self._swap(index, int(bounds[bucket]))
            bounds[bucket] += 1
            bucket -= 1

    # --- queries ----------------------------------------------------------------------------

    def cluster_waste(self) -> np.ndarray:
        """(C,) mean waste over each cluster's prompts with history (0 when none)."""
        return np.divide(self.waste_sum, self.seen_count, out=np.zeros(self.clusters), where=self.seen_count > 0)

    def draw(self, cluster: int, take: int, lam: float, rng: np.random.Generator) -> np.ndarray:
        """`take` distinct prompts of `cluster`, sequentially without replacement, p ~ exp(-lam * waste)."""
        levels, base = self.levels, cluster * self.levels
        starts = self.bounds[base : base + levels + 1].tolist()
        left = [starts[level + 1] - starts[level] for level in range(levels)]
        if take > sum(left):
            raise ValueError(f"cannot draw {take} prompts from a cluster of {sum(left)}")
        weight = [math.exp(-lam * level) for level in range(levels)]
        active = [level for level in range(levels) if left[level]]  # usually a few of the levels
        total = sum(left[level] * weight[level] for level in active)
        uniforms = rng.random(2 * take).tolist()
        picks = np.empty(take, dtype=np.int64)
        for k in range(take):
            level = _bucket_at(active, left, weight, uniforms[2 * k] * total)
            start = starts[level]
            slot = start + min(int(uniforms[2 * k + 1] * left[level]), left[level] - 1)
            last = start + left[level] - 1  # the prompts not drawn yet fill the bucket's front
            index = int(self.order[slot])
            self._swap(index, last)  # within one bucket: membership is unchanged
            picks[k] = index
            left[level] -= 1
            total -= weight[level]
            if not left[level]:
                active.remove(level)
        return picks


def _bucket_at(active: list[int], left: list[int], weight: list[float], target: float) -> int:
    """The non-empty level whose cumulative mass first passes `target` (the last one if rounding
    carries `target` past the end)."""
    running = 0.0
    for level in active:
        running += left[level] * weight[level]
        if target < running:
            return level
    return active[-1]
