"""The data-policy seam: which source prompts get rollouts, how many, and which groups train.

One GRPO step drives a policy like this (trainer_node/grpo/trainer.py):

    so_far = StepRollouts()
    while requests := policy.next_requests(step, so_far):   # one or more generation rounds
        so_far.add(rollout(requests))
    batch = policy.training_groups(step, so_far)            # filtering / reuse
    policy.observe(step, so_far.groups)                     # every group, filtered ones too
    policy.before_update(step, batch, feedback)             # target feedback (L2RR), may be None
    update(batch)

To add a policy: write one module in this package with a DataPolicy subclass, give it a
unique `name`, and decorate it with @register_policy. Every registered policy runs through
tests/trainer_node/test_policy_contract.py.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol, TypeVar

import numpy as np

from rlvr_core.tasks.example import Example


@dataclass(frozen=True)
class SourcePool:
    """The trainer's source prompts, with a cluster id per prompt (domain tag by default)."""

    examples: tuple[Example, ...]
    clusters: tuple[str, ...]  # len == len(examples)

    def __post_init__(self) -> None:
        if len(self.examples) != len(self.clusters):
            raise ValueError("SourcePool: examples and clusters must have the same length")

    @property
    def cluster_names(self) -> list[str]:
        return sorted(set(self.clusters))

    def __len__(self) -> int:
        return len(self.examples)


@dataclass(frozen=True)
class RolloutRequest:
    index: int          # into SourcePool.examples
    num_rollouts: int


@dataclass
class Rollout:
    text: str
    reward: float
    prompt_ids: tuple[int, ...]
    completion_ids: tuple[int, ...]
    reused: bool = False  # True for a response replayed from an earlier step (AR3PO)


@dataclass
class Group:
    """All rollouts of one prompt within one step."""

    index: int
    cluster: str
    rollouts: list[Rollout] = field(default_factory=list)

    @property
    def rewards(self) -> np.ndarray:
        return np.array([r.reward for r in self.rollouts], dtype=np.float64)

    @property
    def mean_reward(self) -> float:
        return float(self.rewards.mean()) if self.rollouts else 0.0

    @property
    def zero_variance(self) -> bool:
        """True when every rollout got the same reward: the group carries no GRPO signal."""
        rewards = self.rewards
        return len(rewards) < 2 or bool(np.all(rewards == rewards[0]))

    @property
    def generated(self) -> int:
        return sum(1 for r in self.rollouts if not r.reused)


@dataclass
class StepRollouts:
    """Groups generated so far in one step, merged by prompt index across rounds."""

    groups: list[Group] = field(default_factory=list)
    rounds: int = 0

    def add(self, new_groups: Sequence[Group]) -> None:
        by_index = {g.index: g for g in self.groups}
        for group in new_groups:
            if group.index in by_index:
                by_index[group.index].rollouts.extend(group.rollouts)
            else:
                self.groups.append(group)
                by_index[group.index] = group
        self.rounds += 1

    @property
    def rollouts_generated(self) -> int:
        return sum(g.generated for g in self.groups)


class FeedbackContext(Protocol):
    """What the trainer offers a policy that learns from the target owner.

    `candidates` builds one-step lookahead models: for each weight vector (one weight per
    group of `batch`, 0 drops a group) it applies one update from the current parameters
    with the group-weighted loss, and returns opaque handles. `evaluate` sends the base
    model plus candidates to the owner in ONE multi-candidate query (same secret
    subsample, same decoding seed) and returns released accuracies: [base, *candidates].
    It returns None when the owner is unreachable or the budget is exhausted; the policy
    must then keep its last state.
    """

    def candidates(self, batch: Sequence[Group], weights: Sequence[Sequence[float]]) -> list[Any]: ...

    def evaluate(self, candidates: Sequence[Any]) -> list[float] | None: ...

    def should_query(self, step: int) -> bool: ...


@dataclass(frozen=True)
class PolicySettings:
    """Batch shape shared by every policy; per-policy options come as a dict."""

    batch_size: int = 16             # prompts per training batch (B)
    rollouts_per_prompt: int = 8     # n
    options: dict[str, Any] = field(default_factory=dict)


class DataPolicy(ABC):
    name: ClassVar[str] = ""
    uses_target_feedback: ClassVar[bool] = False
    simulation_only: ClassVar[bool] = False
    """Needs knowledge only a simulation has (e.g. the target's composition); `train` refuses it."""

    def __init__(self, pool: SourcePool, settings: PolicySettings, rng: np.random.Generator):
        self.pool = pool
        self.settings = settings
        self.rng = rng

    @abstractmethod
    def next_requests(self, step: int, so_far: StepRollouts) -> list[RolloutRequest]:
        """Prompts to roll out next within this step; [] ends the step's generation."""

    def training_groups(self, step: int, so_far: StepRollouts) -> list[Group]:
        """Groups to train on. Default: all of them."""
        return list(so_far.groups)

    def observe(self, step: int, groups: Sequence[Group]) -> None:
        """Every group generated this step, including ones filtered out of training."""

    def before_update(self, step: int, batch: Sequence[Group], feedback: FeedbackContext | None) -> None:
        """Called with the training batch before the optimizer step."""

    def state_dict(self) -> dict[str, Any]:
        """JSON-serialisable state for checkpoint/resume (the rng is saved by the trainer)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass

    def metrics(self) -> dict[str, float]:
        """Scalars logged each step (e.g. q per cluster as `q/<cluster>`)."""
        return {}


_REGISTRY: dict[str, type[DataPolicy]] = {}


def register_policy(cls: type[DataPolicy]) -> type[DataPolicy]:
    if not cls.name:
        raise ValueError(f"{cls.__name__} must set a non-empty `name`")
    if cls.name in _REGISTRY:
        raise ValueError(f"data policy {cls.name!r} is already registered by {_REGISTRY[cls.name].__name__}")
    _REGISTRY[cls.name] = cls
    return cls


def policy_names() -> list[str]:
    _import_all()
    return sorted(_REGISTRY)


def policy_class(name: str) -> type[DataPolicy]:
    """The class registered as `name`, for its capabilities (uses_target_feedback, simulation_only)."""
    _import_all()
    if name not in _REGISTRY:
        raise ValueError(f"unknown data policy {name!r}; known: {', '.join(sorted(_REGISTRY))}")
    return _REGISTRY[name]


def build_policy(name: str, pool: SourcePool, settings: PolicySettings, rng: np.random.Generator) -> DataPolicy:
    """Create a registered policy by name. Known names: see policy_names()."""
    _import_all()
    if name not in _REGISTRY:
        raise ValueError(f"unknown data policy {name!r}; known: {', '.join(sorted(_REGISTRY))}")
    return _REGISTRY[name](pool, settings, rng)


def _import_all() -> None:
    import importlib
    import pkgutil

    import trainer_node.policies as pkg

    for mod in pkgutil.iter_modules(pkg.__path__):
        if mod.name != "base":
            importlib.import_module(f"trainer_node.policies.{mod.name}")


RewardFn = Callable[[str, Example], float]


# --- small helpers shared by several policies ----------------------------------------------


def informative_groups(groups: Sequence[Group]) -> list[Group]:
    """Groups with non-zero reward variance, in order: the only ones with a GRPO gradient."""
    return [g for g in groups if not g.zero_variance]


def sample_fresh_uniform(
    rng: np.random.Generator, pool_size: int, count: int, exclude: set[int]
) -> list[int]:
    """Up to `count` distinct prompt indices drawn uniformly from those not in `exclude`.

    Policies that roll out several rounds per step exclude the prompts already rolled out
    this step: a repeated index would be merged into the existing group (StepRollouts.add).
    """
    eligible = np.arange(pool_size)
    if exclude:
        eligible = np.setdiff1d(eligible, np.fromiter(exclude, dtype=np.int64))
    count = min(count, len(eligible))
    if count == 0:
        return []
    return [int(i) for i in rng.choice(eligible, size=count, replace=False)]


# --- option parsing shared by every policy ------------------------------------------------

OptionsT = TypeVar("OptionsT")


def parse_options(policy: str, options_type: type[OptionsT], options: Mapping[str, Any]) -> OptionsT:
    """Build a policy's typed options dataclass from `PolicySettings.options`.

    Validated once, at the edge: an unknown key raises ValueError naming it and listing the
    valid keys, and a value of the wrong type raises ValueError naming the key. Range checks
    belong in the options dataclass's __post_init__. bool is never accepted for an int/float
    option (a TOML typo like `eta_q = true` must not become 1.0), and ints are widened to float.
    """
    fields = {f.name: f for f in dataclasses.fields(options_type)}  # type: ignore[arg-type]
    hints = typing.get_type_hints(options_type)
    values: dict[str, Any] = {}
    for key, value in options.items():
        if key not in fields:
            raise ValueError(
                f"{policy}: unknown option {key!r}; valid options: {', '.join(sorted(fields)) or '(none)'}"
            )
        values[key] = _coerce_option(policy, key, value, hints[key])
    return options_type(**values)


def _coerce_option(policy: str, key: str, value: Any, expected: Any) -> Any:
    allowed = typing.get_args(expected) if isinstance(expected, types.UnionType) else (expected,)
    for kind in allowed:
        if kind is type(None) and value is None:
            return None
        if kind is bool and isinstance(value, bool):
            return value
        if kind is int and isinstance(value, int) and not isinstance(value, bool):
            return value
        if kind is float and isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if kind is str and isinstance(value, str):
            return value
        if typing.get_origin(kind) is dict and isinstance(value, Mapping):
            return dict(value)
    names = " | ".join(getattr(k, "__name__", str(k)) for k in allowed)
    raise ValueError(f"{policy}: option {key!r} must be {names}, got {type(value).__name__} {value!r}")


def require(condition: bool, policy: str, key: str, message: str) -> None:
    """Raise the standard option error (naming the policy and key) unless `condition` holds."""
    if not condition:
        raise ValueError(f"{policy}: option {key!r} {message}")
