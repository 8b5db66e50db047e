"""The engine-neutral core every engine adapter (TRL, verl) is thin glue over. No engine is imported.

Three pieces, in the order an engine's step meets them:

1. `GlobalIndexStream`: which prompts a round trains on. Rounds of distinct prompt indices drawn
   cluster ~ q, then uniformly inside the cluster, from a generator keyed by (seed, round
   number) alone. Every rank that is handed the same q (bit for bit: the adapter broadcasts
   rank 0's) draws the same round, so the engine's per-rank sharding of one global stream works
   as it does for its own sampler; a resumed run redraws the same rounds.
2. `EngineRun.observe(step, indices, rewards)`: the step's per-sample rewards (one entry per
   completion, a prompt's G completions sharing its index) become the policy's Groups, and
   `policy.observe` sees every group (zero-variance ones too: L2RR's waste signal). The count of
   zero-variance groups per cluster comes back for the engine's logs.
3. `EngineRun.end_step(step)`: once the engine has applied the step's update, the policy is told
   (`DataPolicy.after_update`) with the groups it trained on, and may query the owner through a
   `ReleaseFeedback`: the engine's current HF checkpoint folder (saved by the engine, e.g. TRL's
   `save_model`) is uploaded through the project's feedback client, paced by its BudgetPacer,
   and released as ONE checkpoint (the base). Lookahead candidates are refused: an engine offers
   releases of its current model only (support.py checks the config before a run starts).

Rank 0 owns the policy and the feedback; the other ranks need only the stream and q.
"""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from protocol.validation import is_allowed_file_name
from trainer_node.feedback.client import FeedbackError
from trainer_node.feedback.context import OwnerFeedback
from trainer_node.policies.base import DataPolicy, Group, Rollout, SourcePool, informative_groups

log = logging.getLogger("trainer_node.integrations")


def cluster_ids(pool: SourcePool) -> tuple[np.ndarray, list[str]]:
    """(cluster id of every prompt (N,), cluster names in id order)."""
    names = pool.cluster_names
    position = {name: c for c, name in enumerate(names)}
    return np.array([position[c] for c in pool.clusters], dtype=np.int64), names


class GlobalIndexStream:
    """Rounds of `prompts_per_round` distinct prompt indices, clusters ~ q; the same on every rank."""

    def __init__(self, cluster_of: np.ndarray, num_clusters: int, prompts_per_round: int, seed: int):
        self.cluster_of = np.asarray(cluster_of, dtype=np.int64)
        self.num_clusters = num_clusters
        if not 0 < prompts_per_round <= len(self.cluster_of):
            raise ValueError(
                f"prompts per round must be in [1, {len(self.cluster_of)}] (the pool's size), got {prompts_per_round}"
            )
        self.prompts_per_round = prompts_per_round
        self.seed = seed
        self.members = [np.flatnonzero(self.cluster_of == c) for c in range(num_clusters)]  # by position
        self.sizes = np.array([len(m) for m in self.members], dtype=np.int64)

    def round(self, number: int, q: np.ndarray) -> list[int]:
        """Round `number`'s prompt indices; a function of (seed, number, q) only."""
        q = np.asarray(q, dtype=np.float64)
        if q.shape != (self.num_clusters,) or not np.all(np.isfinite(q)) or q.min() < 0 or q.sum() <= 0:
            raise ValueError(f"q must be {self.num_clusters} finite non-negative weights, got {q.tolist()}")
        rng = np.random.default_rng([self.seed, number])
        p = q / q.sum()
        count = self.prompts_per_round
        per_cluster = np.minimum(rng.multinomial(count, p), self.sizes)
        while per_cluster.sum() < count:  # a cluster ran out of prompts: redraw the excess among the rest
            room = self.sizes - per_cluster
            weights = np.where(room > 0, np.maximum(p, 1e-12), 0.0)
            per_cluster += np.minimum(rng.multinomial(count - per_cluster.sum(), weights / weights.sum()), room)
        picks = [rng.choice(self.members[c], size=take, replace=False)
                 for c, take in enumerate(per_cluster.tolist()) if take > 0]
        return [int(i) for i in rng.permutation(np.concatenate(picks))]


class ReleaseFeedback:
    """The FeedbackContext an engine offers: releases of its current checkpoint, no candidates.

    `checkpoint()` returns the folder the engine has just saved in HF format (TRL: save_model,
    all ranks, then wait_for_everyone). Only the allowlisted files (safetensors, config and
    tokenizer JSON) are linked into a staging folder and uploaded: an engine's folder also holds
    pickles (training_args.bin, optimizer.pt) that never leave the trainer.
    """

    def __init__(self, owner: OwnerFeedback, checkpoint: Callable[[], Path], engine: str = "engine"):
        self.owner = owner
        self.checkpoint = checkpoint
        self.engine = engine
        self.staging = owner.workdir / "staged"
        self.uploads = 0

    @property
    def stats(self):
        return self.owner.stats

    @property
    def pacer(self):
        return self.owner.pacer

    @property
    def stop_reason(self) -> str:
        return self.owner.stop_reason

    def should_query(self, step: int) -> bool:
        return self.owner.should_query(step)

    def candidates(self, batch: Sequence[Group], weights: Sequence[Sequence[float]]) -> list[Any]:
        if len(weights):
            raise RuntimeError(
                f"engine {self.engine!r} cannot build lookahead candidates (extra training passes); "
                "use policy.estimator = 'release_difference'"
            )
        return []

    def evaluate(self, candidates: Sequence[Any]) -> list[float] | None:
        """One release of the current checkpoint: [accuracy], or None (owner unreachable, budget spent)."""
        self.candidates([], list(candidates))
        try:
            checkpoint_id = self.upload_current()
        except FeedbackError as err:
            self.owner.stats.failures += 1
            log.warning("target owner unreachable; training goes on with the last sampler state (%s)", err)
            return None
        return self.owner.release_checkpoints([checkpoint_id])

    def release_current(self, step: int) -> float | None:
        """The final release of the live model (OwnerFeedbackHook.finish), or None."""
        self.owner._step = step
        accuracies = self.evaluate([])
        return accuracies[0] if accuracies else None

    def upload_current(self) -> str:
        """Stage the engine's current checkpoint's allowlisted files and upload them; the owner's id."""
        source = Path(self.checkpoint())
        staged = stage_checkpoint(source, self.staging / f"upload-{self.uploads}")
        self.uploads += 1
        try:
            checkpoint_id = self.owner.client.upload(staged)
            self.owner.stats.uploaded_bytes += int(getattr(self.owner.client, "last_upload_bytes", 0))
        finally:
            shutil.rmtree(staged, ignore_errors=True)
        return checkpoint_id

    def drain(self) -> None:
        self.owner.drain()

    def close(self) -> None:
        self.owner.close()


def stage_checkpoint(source: Path, target: Path) -> Path:
    """Hard-link (or copy) the allowlisted files of an HF checkpoint folder into `target`."""
    if not source.is_dir():
        raise FeedbackError(f"{source}: the engine's checkpoint folder does not exist")
    if target.exists():
        shutil.rmtree(target)
    target.mkdir(parents=True)
    for path in sorted(source.iterdir()):
        if path.is_file() and is_allowed_file_name(path.name):
            try:
                os.link(path, target / path.name)
            except OSError:
                shutil.copyfile(path, target / path.name)
    if not any(target.iterdir()):
        raise FeedbackError(f"{source}: no safetensors or config files to upload")
    return target


class EngineRun:
    """The policy side of one engine run (rank 0): observe the step's rewards, learn after its update."""

    def __init__(self, policy: DataPolicy, pool: SourcePool, feedback: ReleaseFeedback | None = None):
        self.policy = policy
        self.pool = pool
        self.feedback = feedback
        self.cluster_of, self.cluster_names = cluster_ids(pool)
        self._groups: dict[int, Group] = {}  # this step's groups by prompt index, in arrival order
        self.zero_variance_groups = 0
        self.groups_seen = 0

    def q(self) -> np.ndarray:
        """The cluster distribution to draw the next round from: the policy's q when it learns one,
        else the clusters' share of the pool (uniform over prompts)."""
        learnt = getattr(self.policy, "q", None)
        if callable(learnt):
            return np.asarray(learnt(), dtype=np.float64)
        sizes = np.bincount(self.cluster_of, minlength=len(self.cluster_names)).astype(np.float64)
        return sizes / sizes.sum()

    def observe(self, step: int, indices: Sequence[int], rewards: Sequence[float]) -> dict[str, int]:
        """Per-completion (prompt index, reward) pairs of this step (all ranks' together, or several
        calls per step) -> Groups, kept for end_step (where the policy observes the step's groups).
        Returns the zero-variance groups per cluster among the pairs given."""
        if len(indices) != len(rewards):
            raise ValueError(f"observe: {len(indices)} prompt indices for {len(rewards)} rewards")
        fresh: dict[int, Group] = {}
        for index, reward in zip(indices, rewards):
            index = int(index)
            if not 0 <= index < len(self.pool):
                raise ValueError(f"observe: prompt index {index} outside the pool of {len(self.pool)}")
            if reward is None or not np.isfinite(float(reward)):
                continue  # a reward function's None (TRL: excluded sample)
            group = fresh.get(index)
            if group is None:
                group = fresh[index] = Group(index, self.pool.clusters[index])
            group.rollouts.append(Rollout(text="", reward=float(reward), prompt_ids=(), completion_ids=()))
        groups = [g for g in fresh.values() if g.rollouts]
        for group in groups:
            known = self._groups.get(group.index)
            if known is None:
                self._groups[group.index] = group
            else:
                known.rollouts.extend(group.rollouts)
        counts = {name: 0 for name in self.cluster_names}
        for group in groups:
            counts[group.cluster] += int(group.zero_variance)
        return counts

    def end_step(self, step: int) -> dict[str, float]:
        """After the engine's update of `step`: the policy sees every group of the step and the ones
        it trained on (those with reward variance), and may query the owner. Returns its metrics."""
        groups = list(self._groups.values())
        self._groups = {}
        self.policy.observe(step, groups)
        self.groups_seen += len(groups)
        self.zero_variance_groups += sum(g.zero_variance for g in groups)
        self.policy.after_update(step, informative_groups(groups), self.feedback)
        metrics = dict(self.policy.metrics())
        if groups:
            metrics["zero_variance_frac"] = sum(g.zero_variance for g in groups) / len(groups)
        return metrics

    def finish(self, step: int) -> None:
        """The run's end: a query still in flight is booked (ReleaseFeedback answers at once today)."""
        if self.feedback is not None:
            self.feedback.drain()
