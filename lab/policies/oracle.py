"""Oracle mix (diagnostic, simulation only): sample source domains in known target proportions.

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
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from trainer_node.policies.base import (
    DataPolicy,
    PolicySettings,
    RolloutRequest,
    SourcePool,
    StepRollouts,
    parse_options,
    register_policy,
    require,
)


@dataclass(frozen=True)
class OracleOptions:
    domain_weights: dict[str, float] = field(default_factory=dict)  # required

    def __post_init__(self) -> None:
        require(bool(self.domain_weights), "oracle", "domain_weights", "is required (domain -> weight)")
        for domain, weight in self.domain_weights.items():
            require(
                isinstance(domain, str),
                "oracle",
                "domain_weights",
                f"keys must be domain names, got {domain!r}",
            )
            ok = isinstance(weight, (int, float)) and not isinstance(weight, bool) and math.isfinite(weight)
            require(
                ok and weight >= 0, "oracle", "domain_weights", f"[{domain!r}] must be a finite number >= 0"
            )
        require(
            sum(self.domain_weights.values()) > 0, "oracle", "domain_weights", "must have a positive weight"
        )


def target_domain_weights(testbed: str) -> dict[str, float]:
    """The target's domain composition from a testbed file: what a simulation fills in as
    `domain_weights` when none are given (a real trainer cannot know it)."""
    from rlvr_core.tasks.testbed import load_testbed, target_composition

    return target_composition(load_testbed(testbed))


@register_policy
class OraclePolicy(DataPolicy):
    name = "oracle"
    simulation_only = True

    def __init__(self, pool: SourcePool, settings: PolicySettings, rng: np.random.Generator):
        super().__init__(pool, settings, rng)
        self.options = parse_options(self.name, OracleOptions, settings.options)
        by_domain: dict[str, list[int]] = {}
        for index, example in enumerate(pool.examples):
            by_domain.setdefault(example.domain, []).append(index)
        unknown = sorted(set(self.options.domain_weights) - set(by_domain))
        require(
            not unknown,
            "oracle",
            "domain_weights",
            f"names domains not in the pool: {unknown}; pool domains: {sorted(by_domain)}",
        )
        self.domains = sorted(d for d, w in self.options.domain_weights.items() if w > 0)
        weights = np.array([self.options.domain_weights[d] for d in self.domains], dtype=np.float64)
        self.weights = weights / weights.sum()
        self.members = [np.array(by_domain[d], dtype=np.int64) for d in self.domains]
        self._shares: dict[str, float] = {}

    def next_requests(self, step: int, so_far: StepRollouts) -> list[RolloutRequest]:
        if so_far.rounds > 0:
            return []
        left = [list(self.rng.permutation(m)) for m in self.members]  # uniform order within each domain
        counts = np.zeros(len(self.domains), dtype=np.int64)
        chosen: list[int] = []
        for _ in range(self.settings.batch_size):
            open_mask = np.array([len(x) > 0 for x in left])
            if not open_mask.any():
                break
            p = self.weights * open_mask
            d = int(self.rng.choice(len(self.domains), p=p / p.sum()))
            chosen.append(int(left[d].pop()))
            counts[d] += 1
        total = max(len(chosen), 1)
        self._shares = {f"share/{d}": float(c / total) for d, c in zip(self.domains, counts)}
        return [RolloutRequest(i, self.settings.rollouts_per_prompt) for i in chosen]

    def state_dict(self) -> dict[str, Any]:
        return {}

    def metrics(self) -> dict[str, float]:
        return dict(self._shares)


def fill_target_weights(raw: dict[str, Any]) -> dict[str, Any]:
    """A raw run config (as read from TOML) whose oracle policy gets the target's composition
    as `domain_weights` when it has none; any other config comes back unchanged. The one place
    a simulation fills them in (simulate and the bench's planning both call it)."""
    from trainer_node.config import DataConfig

    policy = raw.get("policy") or {}
    options = policy.get("options") or {}
    if policy.get("name") != "oracle" or "domain_weights" in options:
        return raw
    testbed = (raw.get("data") or {}).get("testbed", DataConfig().testbed)
    filled = copy.deepcopy(raw)
    filled["policy"]["options"] = {**options, "domain_weights": target_domain_weights(testbed)}
    return filled
