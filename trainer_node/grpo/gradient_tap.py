"""Lookahead candidates from the gradients the step's own update computes anyway.

An asynchronous lookahead query (L2RR) asks, before step t's update, for candidates
theta_t + step(g_w), one per weight vector w over the batch's groups, where g_w is the
gradient at theta_t of the w-weighted batch loss (whole-batch normalisers). The update that
follows computes the gradient of the same loss at the same theta_t with every weight 1. The
loss is linear in the per-row weights (grpo/losses.py), so if the update's backward runs class
by class, a class being the groups that have the same weight in every candidate (one class
per cluster for L2RR's one-cluster candidates and for SPSA), then

    g_w = sum_k w_k * g_k        and the update's own gradient = sum_k g_k.

So the candidates cost no forward or backward pass of their own, only K gradient copies and
one step rule each; recomputing them (the path this replaces) cost about one more batch of
backward work on the background thread, beside training (docs/RESULTS.md section 6.5). The
price is memory: during the update K class gradients and their sum (K + 1 copies of the trained
parameters, where a plain update holds one), kept until the candidates are built; an adapter's
size in a LoRA run, and grpo.lookahead_from_update = false where full-parameter copies do not fit.

Life of a tap: the trainer makes one per snapshot (GRPOTrainer.lookahead_snapshot) and the
next update fills it, or declines it when it cannot (another batch, a skipped update, several
optimizer steps per batch, seam weights on the rows). The background thread waits for that
and recomputes only when declined. Anything on the training thread that is about to wait for
the background thread declines a pending tap first, so the two never wait for each other.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

import torch

MAX_CLASSES = 16
"""More distinct weight patterns than this (per-group weights, not per-cluster): decline, since
the update would run that many small backward passes and keep that many gradient copies."""


class GradientTap:
    """Per-class gradients of one batch at the snapshot's parameters (module docstring)."""

    def __init__(self, group_indices: Sequence[int], weights: Sequence[Sequence[float]]):
        self.group_indices = [int(i) for i in group_indices]
        patterns: dict[tuple[float, ...], int] = {}
        self.class_of_group = [patterns.setdefault(tuple(float(w[g]) for w in weights), len(patterns))
                               for g in range(len(self.group_indices))]
        # class_weights[k][j]: the weight of class k's groups in candidate j
        self.class_weights = [list(pattern) for pattern in patterns]
        self.candidates = len(weights)
        self._ready = threading.Event()
        self._gradients: list[list[torch.Tensor]] | None = None
        self.waited_s = 0.0  # how long wait() blocked: waiting for the update is not candidate building
        self.names: list[str] = []  # the trainable parameters' names, in the gradients' order

    @property
    def classes(self) -> int:
        return len(self.class_weights)

    def usable(self) -> bool:
        return 0 < self.classes <= MAX_CLASSES

    def matches(self, group_indices: Sequence[int]) -> bool:
        """The update is of the batch this tap was made for (same groups, same order)."""
        return [int(i) for i in group_indices] == self.group_indices

    def row_classes(self, group_ids: torch.Tensor) -> torch.Tensor:
        """(B,) class of each row, from the rows' group ids (positions in the batch)."""
        return torch.tensor(self.class_of_group, dtype=torch.long, device=group_ids.device)[group_ids]

    # --- resolution: exactly one of fill / decline, from the training thread -------------------

    def fill(self, names: list[str], gradients: list[list[torch.Tensor]]) -> None:
        """gradients[k][i]: class k's gradient of trainable parameter names[i] (zeros where it has none)."""
        if len(gradients) != self.classes or any(len(g) != len(names) for g in gradients):
            raise ValueError(f"a gradient tap needs {self.classes} class gradients of {len(names)} parameters")
        self.names = list(names)
        self._gradients = gradients
        self._ready.set()

    def clear(self) -> None:
        """Drop the class gradients (the candidates are built): K copies of the trained parameters."""
        self._gradients = None

    def decline(self) -> None:
        """The update did not compute these gradients: the candidates are recomputed."""
        self._ready.set()

    @property
    def resolved(self) -> bool:
        return self._ready.is_set()

    # --- reading: the background thread ----------------------------------------------------

    def wait(self) -> bool:
        """Block until resolved; True when the gradients are here."""
        started = time.perf_counter()
        self._ready.wait()
        self.waited_s += time.perf_counter() - started
        return self._gradients is not None

    def candidate_gradient(self, candidate: int) -> list[torch.Tensor]:
        """sum_k w_k g_k for candidate `candidate` (call after wait() returned True)."""
        if self._gradients is None:
            raise RuntimeError("the gradient tap was declined or is not resolved yet")
        out: list[torch.Tensor] | None = None
        for weights, grads in zip(self.class_weights, self._gradients):
            w = weights[candidate]
            if w == 0.0:
                continue
            if out is None:
                out = [g * w for g in grads]
            else:
                for total, g in zip(out, grads):
                    total.add_(g, alpha=w)
        return out if out is not None else [torch.zeros_like(g) for g in self._gradients[0]]
