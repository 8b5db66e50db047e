"""Oracle mix (diagnostic, simulation only): sample source domains in known target proportions.

On a testbed with hidden label quality (wrong-label entries, or entries whose `skill` is not
their domain: rlvr_core/tasks/testbed.py) the simulation passes `cluster_weights` instead:
the target's composition spread over the CLEAN source clusters that carry each target skill
(testbed.skill_cluster_weights). The oracle alone reads those hidden fields; the trainer's pool
and every other policy never see them.

It lives in the lab, registered in the trainer's policy registry when the lab is imported
(lab/policies/__init__.py), and is marked `simulation_only`, so `train` refuses it.

The simulation knows the target set's domain composition and passes it as
`domain_weights` (domain -> weight, keyed by Example.domain, normalised here). Each of the
batch_size slots draws a domain from those weights (among domains with prompts left this
step) and then a prompt uniformly within it, without replacement; n rollouts each, every
group trains. It is the upper reference for "learn the right source mix" and is NOT
deployable: a real trainer does not know the target composition.

(The other diagnostic, "target_mix", needs no policy: the simulation adds feedback-split
examples to the pool and runs "uniform".)
"""

from __future__ import annotations

import copy
import math
from typing import Any, Literal

import numpy as np
from pydantic import Field, field_validator

from trainer_node.policies.base import POLICIES, DataPolicy, RolloutRequest, SourcePool, StepRollouts
from trainer_node.policies.options import PolicyOptions


class OracleOptions(PolicyOptions):
    name: Literal["oracle"] = Field(
        default="oracle", description="Oracle mix (simulation only): source domains in the target's "
        "proportions."
    )
    domain_weights: dict[str, float] | None = Field(
        default=None,
        description="Domain -> weight (normalised here), keyed by Example.domain. None: a simulation fills "
        "in the target's composition from the testbed (a real trainer cannot know it).",
    )
    cluster_weights: dict[str, float] | None = Field(
        default=None,
        description="Cluster id -> weight (normalised here), keyed by the pool's cluster ids; instead of "
        "domain_weights. None: a simulation fills it in when the testbed hides label quality.",
    )

    @field_validator("domain_weights", "cluster_weights")
    @classmethod
    def _weights(cls, weights: dict[str, float] | None) -> dict[str, float] | None:
        if weights is None:
            return None
        if not weights:
            raise ValueError("must name at least one domain or cluster (name -> weight)")
        for domain, weight in weights.items():
            if not (math.isfinite(weight) and weight >= 0):
                raise ValueError(f"[{domain!r}] must be a finite number >= 0, got {weight!r}")
        if sum(weights.values()) <= 0:
            raise ValueError("must have a positive weight")
        return weights


def target_domain_weights(testbed: str) -> dict[str, float]:
    """The target's domain composition from a testbed file: what a simulation fills in as
    `domain_weights` when none are given (a real trainer cannot know it)."""
    from rlvr_core.tasks.testbed import load_testbed, target_composition

    return target_composition(load_testbed(testbed))


@POLICIES.register("oracle", options=OracleOptions)
class OraclePolicy(DataPolicy):
    simulation_only = True
    options: OracleOptions

    def __init__(self, pool: SourcePool, options: OracleOptions, rng: np.random.Generator):
        super().__init__(pool, options, rng)
        if (options.domain_weights is None) == (options.cluster_weights is None):
            raise ValueError("oracle: give exactly one of the options 'domain_weights' (domain -> weight) and "
                             "'cluster_weights' (cluster -> weight); a simulation fills one in from the testbed")
        by_cluster = options.cluster_weights is not None
        key, chosen_weights = ("cluster", options.cluster_weights) if by_cluster else ("domain", options.domain_weights)
        by_domain: dict[str, list[int]] = {}
        for index, example in enumerate(pool.examples):
            by_domain.setdefault(pool.clusters[index] if by_cluster else example.domain, []).append(index)
        unknown = sorted(set(chosen_weights) - set(by_domain))
        if unknown:
            raise ValueError(f"oracle: option '{key}_weights' names {key}s not in the pool: {unknown}; "
                             f"pool {key}s: {sorted(by_domain)}")
        self.domains = sorted(d for d, w in chosen_weights.items() if w > 0)
        weights = np.array([chosen_weights[d] for d in self.domains], dtype=np.float64)
        self.weights = weights / weights.sum()
        self.members = [np.array(by_domain[d], dtype=np.int64) for d in self.domains]
        self._shares: dict[str, float] = {}

    def next_requests(self, step: int, so_far: StepRollouts) -> list[RolloutRequest]:
        if so_far.rounds > 0:
            return []
        left = [list(self.rng.permutation(m)) for m in self.members]  # uniform order within each domain
        counts = np.zeros(len(self.domains), dtype=np.int64)
        chosen: list[int] = []
        for _ in range(self.options.batch_size):
            open_mask = np.array([len(x) > 0 for x in left])
            if not open_mask.any():
                break
            p = self.weights * open_mask
            d = int(self.rng.choice(len(self.domains), p=p / p.sum()))
            chosen.append(int(left[d].pop()))
            counts[d] += 1
        total = max(len(chosen), 1)
        self._shares = {f"share/{d}": float(c / total) for d, c in zip(self.domains, counts)}
        return [RolloutRequest(i, self.options.rollouts_per_prompt) for i in chosen]

    def state_dict(self) -> dict[str, Any]:
        return {}

    def metrics(self) -> dict[str, float]:
        return dict(self._shares)


def fill_target_weights(raw: dict[str, Any]) -> dict[str, Any]:
    """A raw run config (as read from TOML) whose oracle policy gets the target's composition
    as `domain_weights` when it has none; any other config comes back unchanged. The one place
    a simulation fills them in (simulate and the bench's planning both call it)."""
    from rlvr_core.tasks.testbed import (
        has_hidden_labels,
        load_testbed,
        skill_cluster_weights,
        target_composition,
    )
    from trainer_node.config import DataConfig

    policy = raw.get("policy") or {}
    if policy.get("name") != "oracle" or any(policy.get(k) is not None for k in ("domain_weights", "cluster_weights")):
        return raw
    spec = load_testbed((raw.get("data") or {}).get("testbed", DataConfig().testbed))
    filled = copy.deepcopy(raw)
    if has_hidden_labels(spec):  # only clean skill clusters; the domain would take in wrong labels
        filled["policy"]["cluster_weights"] = skill_cluster_weights(spec)
    else:
        filled["policy"]["domain_weights"] = target_composition(spec)
    return filled
