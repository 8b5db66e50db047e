"""The data-policy seam: which source prompts get rollouts, how many, and which groups train.

One GRPO step drives a policy like this (trainer_node/grpo/trainer.py):

    so_far = StepRollouts()
    while requests := policy.next_requests(step, so_far):   # one or more generation rounds
        so_far.add(rollout(requests))
    batch = policy.training_groups(step, so_far)            # filtering / reuse
    policy.observe(step, so_far.groups)                     # every group, filtered ones too
    policy.before_update(step, batch, feedback)             # target feedback (L2RR), may be None
    update(batch)

To add a policy: write one module in this package with an options model (a PolicyOptions
subclass with `name: Literal["mine"] = "mine"`, see options.py) and a DataPolicy subclass
decorated with `@POLICIES.register("mine", options=MineOptions)`; it reads `self.options`.
A third-party policy is a DataPolicy subclass with an `Options` attribute, declared in the
entry-point group `target_feedback.policies`. Every registered policy runs through
tests/trainer_node/test_policy_contract.py.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

import numpy as np

from protocol.plugins import Registry, subclass_entries
from rlvr_core.configuration import field_error, validate_options
from rlvr_core.tasks.example import Example
from trainer_node.policies.options import DEFAULT_POLICY, PolicyOptions


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
    scores: tuple[float, ...] = ()  # several grader draws (draw 0 = reward before shaping); () = reward only


@dataclass
class Group:
    """All rollouts of one prompt within one step."""

    index: int
    cluster: str
    rollouts: list[Rollout] = field(default_factory=list)

    @property
    def rewards(self) -> np.ndarray:
        return np.array([r.reward for r in self.rollouts], dtype=np.float64)

    # mean_reward and zero_variance are read for every group of every step (observe, filters):
    # plain Python over the few rollouts, no array built per access.
    @property
    def mean_reward(self) -> float:
        return sum(r.reward for r in self.rollouts) / len(self.rollouts) if self.rollouts else 0.0

    @property
    def zero_variance(self) -> bool:
        """True when every rollout got the same reward: the group carries no GRPO signal."""
        if len(self.rollouts) < 2:
            return True
        first = self.rollouts[0].reward
        return all(r.reward == first for r in self.rollouts)

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


class PendingFeedback(Protocol):
    """A query sent and not yet read: `ready()` once its release is in (or it failed);
    `result()` waits for it and returns what `evaluate` would have ([base, *candidates] or None)."""

    def ready(self) -> bool: ...

    def result(self) -> list[float] | None: ...


@dataclass(frozen=True)
class AnsweredFeedback:
    """A PendingFeedback whose release is already in (a context that answers synchronously)."""

    accuracies: list[float] | None

    def ready(self) -> bool:
        return True

    def result(self) -> list[float] | None:
        return self.accuracies


def send_query(
    feedback: FeedbackContext, batch: Sequence[Group], weights: Sequence[Sequence[float]], asynchronous: bool,
    with_base: bool = True, *, mixtures: Sequence[Mapping[str, float]] | None = None, release: Any = None,
) -> PendingFeedback:
    """One query of lookahead candidates (one per weight vector, or, with `mixtures`, one per cluster
    mixture along the clusters' running directions: FeedbackContext.direction_candidates). Asynchronous,
    when asked and the context can (OwnerFeedback.submit_lookahead / submit_directions: candidates built,
    uploaded and scored off the training thread); otherwise built and answered now. The caller reads the
    release from the returned handle either way.

    `with_base = False`: the caller needs only differences between the candidates, so the live
    model is left out of the release where the context can do that (`releases_without_base`):
    one checkpoint fewer to upload and for the owner to score, and a smaller release (epsilon
    per release grows with its length). The release is then [*candidates]; otherwise it is
    [base, *candidates], as the caller must accept either way.

    `release` (trainer_node/feedback/release.py ReleaseOptions; None: accuracy) a difference release:
    the base is sent (its differences are from it), and the release is [*candidates] differences."""
    extra = {} if release is None else {"release": release}
    if mixtures is not None:
        submit = getattr(feedback, "submit_directions", None) if asynchronous else None
        if submit is not None:
            return submit(mixtures, with_base=with_base, **extra)
        candidates = feedback.direction_candidates(mixtures)
        if getattr(feedback, "releases_without_base", False):
            return AnsweredFeedback(feedback.evaluate(candidates, with_base=with_base, **extra))
        return AnsweredFeedback(feedback.evaluate(candidates, **extra))
    omit = weights and not with_base and getattr(feedback, "releases_without_base", False)
    if omit:
        submit = getattr(feedback, "submit_lookahead", None) if asynchronous else None
        if submit is not None:
            return submit(batch, weights, with_base=False, **extra)
        return AnsweredFeedback(feedback.evaluate(feedback.candidates(batch, weights), with_base=False, **extra))
    if not weights:  # the current model alone (release_difference): nothing to build
        submit_current = getattr(feedback, "submit", None) if asynchronous else None
        return submit_current([]) if submit_current is not None else AnsweredFeedback(feedback.evaluate([]))
    submit = getattr(feedback, "submit_lookahead", None) if asynchronous else None
    if submit is not None:
        return submit(batch, weights, **extra)
    return AnsweredFeedback(feedback.evaluate(feedback.candidates(batch, weights), **extra))


class DataPolicy(ABC):
    """One data policy. It is built from its typed options (`self.options`: the `[policy]`
    table, shared batch shape included) and exposes capabilities as class attributes, so
    callers never compare registered names."""

    name: ClassVar[str] = ""
    """Stamped by the registry: the name the class is registered under (for logs and messages)."""
    uses_target_feedback: ClassVar[bool] = False
    """Learns from the target owner (gets a FeedbackContext in before_update)."""
    simulation_only: ClassVar[bool] = False
    """Needs knowledge only a simulation has (e.g. the target's composition); `train` refuses it."""
    cluster_sampler: ClassVar[bool] = False
    """Its draws are a cluster distribution (`q()`, uniform over prompts without one), which an
    engine's shared index stream reproduces (trainer_node/integrations/); False: it picks prompts
    itself (rounds, filters, replays), so only this project's own loop runs it."""

    def __init__(self, pool: SourcePool, options: PolicyOptions, rng: np.random.Generator):
        self.pool = pool
        self.options = options
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

    def after_update(self, step: int, batch: Sequence[Group], feedback: FeedbackContext | None) -> None:
        """An engine that runs the update itself (TRL, verl: trainer_node/integrations/) calls this
        instead of before_update, once `batch` is trained; its `feedback` offers releases of the
        current model only (no candidates). Default: what before_update does without feedback."""
        self.before_update(step, batch, None)

    def state_dict(self) -> dict[str, Any]:
        """JSON-serialisable state for checkpoint/resume (the rng is saved by the trainer)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass

    def metrics(self) -> dict[str, float]:
        """Scalars logged each step (e.g. q per cluster as `q/<cluster>`)."""
        return {}


def _import_builtin_policies() -> None:
    import importlib
    import pkgutil

    import trainer_node.policies as pkg

    for mod in pkgutil.iter_modules(pkg.__path__):
        if mod.name not in ("base", "options"):
            importlib.import_module(f"trainer_node.policies.{mod.name}")


POLICIES: Registry[type[DataPolicy]] = Registry(
    "policies", _import_builtin_policies, noun="data policy", on_add=subclass_entries(DataPolicy, "data policy")
)
"""Data policies by name; plug-ins come through the entry-point group `target_feedback.policies`
(a DataPolicy subclass with an `Options` attribute: its PolicyOptions model)."""


def policy_names() -> list[str]:
    return POLICIES.names()


def policy_class(name: str) -> type[DataPolicy]:
    """The class registered as `name`, for its capabilities (uses_target_feedback, simulation_only)."""
    return POLICIES.get(name)


def policy_options_model(name: str) -> type[PolicyOptions]:
    """The options model registered with policy `name` (PolicyOptions for a plug-in without one)."""
    model = POLICIES.options_model(name) or PolicyOptions
    if not (isinstance(model, type) and issubclass(model, PolicyOptions)):
        raise TypeError(f"data policy {name!r}: its options model {model!r} must subclass "
                        "trainer_node.policies.options.PolicyOptions")
    return model


def parse_policy_options(raw: Mapping[str, Any] | PolicyOptions) -> PolicyOptions:
    """Validate a `[policy]` table with the options model of the policy it names.

    Raises pydantic's ValidationError with locations inside the table (`lambda_waste`,
    `name`, ...); the config edge prefixes them with `policy.`.
    """
    if isinstance(raw, PolicyOptions):
        return raw
    if not isinstance(raw, Mapping):
        raise field_error("PolicyOptions", (), "model_type", "must be a table, e.g. [policy] name = "
            "\"l2rr\"", raw)
    if "options" in raw:
        raise field_error(
            "PolicyOptions", ("options",), "moved_table",
            "policy options now sit directly in [policy]: move every key of [policy.options] up into "
            "[policy] (e.g. `lambda_waste = 0.25` under [policy]) and delete the [policy.options] table",
            raw["options"],
        )
    name = raw.get("name", DEFAULT_POLICY)
    if not isinstance(name, str) or name not in POLICIES:
        known = ", ".join(policy_names())
        raise field_error("PolicyOptions", ("name",), "unknown_entry",
                          f"unknown data policy {name!r}; known: {known}", name)
    return validate_options(policy_options_model(name), {**raw, "name": name}, part=f"data policy {name!r}")


def build_policy(options: PolicyOptions | Mapping[str, Any], pool: SourcePool,
                 rng: np.random.Generator) -> DataPolicy:
    """Create the policy its options name (a `[policy]` table, typed or not). Known names:
    see policy_names()."""
    typed = parse_policy_options(options)
    return POLICIES.get(typed.name)(pool, typed, rng)


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
