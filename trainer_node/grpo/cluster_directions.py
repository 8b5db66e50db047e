"""Each cluster's running update direction: lookahead candidates that point where the cluster does.

A lookahead candidate built from one step's batch (grpo.lookahead_directions = "batch") moves
along the gradient of the few groups of its cluster that happened to be in the batch: at batch 16
with most groups carrying no reward variance, one or two prompts. Whether that step helps the
target then says more about those prompts than about the cluster, and two clusters'
candidates are often identical (both had no informative group: only the shared momentum
moves). docs/RESULTS.md section 10.1 measured the consequence: the per-release signal points
nowhere even without DP noise.

"cluster_mean" replaces it with a running average over steps. At every update the backward runs
cluster by cluster (each cluster's rows with the whole batch's normalisers; their sum is the
update's gradient, as in grpo/gradient_tap.py), and for each cluster c present with n_c of the
batch's B groups

    S_c <- beta * S_c + B * g_c        W_c <- beta * W_c + n_c        D_c = S_c / W_c

so D_c is the gradient a batch made only of cluster c's groups would have (B * g_c / n_c),
averaged over recent steps with each step weighted by how many of c's groups it held. A cluster
absent from a step keeps its direction (both sums decay alike) and becomes less certain only
relative to newer evidence. A candidate for a cluster mixture s is then one lookahead step along
sum_c s_c D_c, available for every cluster seen so far, not only those of the current batch.

The price is memory and a little compute: one gradient copy per cluster (an adapter's size in a
LoRA run), and the update's backward split into one pass per cluster present (bench_tapped_update
measured the split at 0.97-1.10x a plain backward).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch


class ClusterDirections:
    """Per-cluster running directions (module docstring), keyed by cluster name."""

    def __init__(self, beta: float):
        if not 0.0 <= beta < 1.0:
            raise ValueError(f"beta must be in [0, 1), got {beta}")
        self.beta = beta
        self.names: list[str] = []  # the trainable parameters' names, in the gradients' order
        self._sums: dict[str, list[torch.Tensor]] = {}
        self._weights: dict[str, float] = {}

    def record(self, names: Sequence[str], gradients: Mapping[str, Sequence[torch.Tensor]],
               groups: Mapping[str, int], batch_groups: int) -> None:
        """One update's per-cluster gradients (whole-batch normalisers) and each cluster's group count."""
        if self.names and list(names) != self.names:
            raise ValueError("cluster directions: the parameters changed between updates")
        self.names = list(names)
        for cluster in self._sums:
            for tensor in self._sums[cluster]:
                tensor.mul_(self.beta)
            self._weights[cluster] *= self.beta
        for cluster, grads in gradients.items():
            count = int(groups[cluster])
            if count <= 0:
                continue
            scaled = [g.detach() * float(batch_groups) for g in grads]
            if cluster in self._sums:
                for total, add in zip(self._sums[cluster], scaled, strict=True):
                    total.add_(add)
                self._weights[cluster] += count
            else:
                self._sums[cluster] = [t.clone() for t in scaled]
                self._weights[cluster] = float(count)

    def clusters(self) -> list[str]:
        """Clusters with a direction (seen in some update), sorted."""
        return sorted(c for c, w in self._weights.items() if w > 0)

    def mixture(self, shares: Mapping[str, float]) -> list[torch.Tensor]:
        """sum_c shares[c] * D_c (clusters without a direction contribute nothing)."""
        total: list[torch.Tensor] | None = None
        for cluster, share in shares.items():
            if share == 0 or cluster not in self._sums or self._weights[cluster] <= 0:
                continue
            scale = float(share) / self._weights[cluster]
            if total is None:
                total = [s * scale for s in self._sums[cluster]]
            else:
                for out, s in zip(total, self._sums[cluster], strict=True):
                    out.add_(s, alpha=scale)
        if total is None:
            raise ValueError(f"no direction for any of the clusters {sorted(shares)}; known: {self.clusters()}")
        return total

    def copy(self) -> ClusterDirections:
        """An independent copy (an asynchronous query builds its candidates from the directions of its step)."""
        twin = ClusterDirections(self.beta)
        twin.names = list(self.names)
        twin._sums = {c: [t.clone() for t in sums] for c, sums in self._sums.items()}
        twin._weights = dict(self._weights)
        return twin
