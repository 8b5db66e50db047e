"""The two update seams inside a GRPO step: which responses enter the update, and how much
each of their tokens counts (DataFlex-RL's selection and reweighting families, seed 001).

    advantages [-> coefficients] -> selection mask m_gk -> weights w_gkl -> loss   (the order is fixed)

    L_sel = 1/(GK) sum_g sum_k  m_gk / L_gk  sum_l  loss_gkl           DataFlex Eq. 1
    L_rew = 1/(GK) sum_g sum_k     1 / L_gk  sum_l  w_gkl loss_gkl     DataFlex Eq. 2

Both seams see the same typed input, `UpdateInput`: rewards, advantages, group ids, response
lengths and the completion mask, the selection mask so far, and optional inputs a rule asks
for by name in `requires`: token log-probabilities, several grader scores per rollout, and
per-response gradient features (the local update geometry).

The advantage stage may end with a coefficient module (`grpo.coefficients`, registry
COEFFICIENTS): SetGRPO (issue 19, docs/SETGRPO.md) replaces the estimator's advantages with
calibrated, recovered coefficients and marks the groups it holds back for calibration or
rejects as not kept; the selection and reweighting rules then see those coefficients and that
mask. It is part of the advantage step, not a third seam: one typed input, one order.

- A selection rule returns a keep mask (N,) bool: m_gk.
- A reweighting rule returns weights >= 0, per response (N,) or per token (N, T): w_gkl, up to
  a constant. The seam rescales them to mean 1 over the kept responses (per-response weights)
  or over the kept completion tokens (token weights), as DataFlex-RL's reweighters do, so a
  rule changes only the relative emphasis, never the step size.

Their product m_gk * w_gkl becomes `PolicyBatch.token_weights` (B, T), which every loss
aggregation multiplies into the per-token loss; the normalisers (1/(GK) with `seq_mean`, the
token count with `token_mean`) are those of the whole batch, so a dropped response still counts
in them, as in Eq. 1. With no rule selected the seams are the identity (token_weights None).
L2RR's lookahead candidates are built from the same batch, so they see the same mask and weights.

To add a rule: one module in trainer_node/grpo/update_rules/ with an options model (an
UpdateRuleOptions subclass with `name: Literal["mine"]`) and a SelectionRule or ReweightingRule
subclass decorated with `@SELECTIONS.register("mine", options=MineOptions)` (or REWEIGHTINGS);
select it with `grpo.selection = { name = "mine", ... }` (plug-ins: entry points
`target_feedback.selections` / `target_feedback.reweightings`).
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

import torch

from protocol.plugins import Registry, subclass_entries
from rlvr_core.configuration import field_error, validate_options
from trainer_node.grpo.batch import PolicyBatch
from trainer_node.grpo.update_options import UpdateRuleOptions

OPTIONAL_INPUTS = ("token_logprobs", "grader_scores", "group_geometry")
"""UpdateInput fields a rule may ask for in `requires`; the others are always present."""
PROVIDED_BY_TRAINER = frozenset({"token_logprobs", "grader_scores", "group_geometry"})
"""Optional inputs this trainer fills in; a rule requiring another one is refused at build time."""


@dataclass(frozen=True)
class UpdateInput:
    """The group batch an update rule sees: N rollouts in G groups, T token columns."""

    rewards: torch.Tensor          # (N,) float64: the verifier's reward r_gk
    advantages: torch.Tensor       # (N,) float: A_gk (outcome advantage: every token of a response shares it)
    group_ids: torch.Tensor        # (N,) long in [0, G): the prompt group of each rollout
    lengths: torch.Tensor          # (N,) float: completion tokens L_gk
    completion_mask: torch.Tensor  # (N, T) float: 1 on completion tokens
    keep: torch.Tensor             # (N,) bool: the selection mask so far (all True for a selection rule)
    token_logprobs: torch.Tensor | None = None
    """(N, T) log pi_old of each token under the policy that generated it; only when a rule
    requires "token_logprobs" (one no-grad forward pass)."""
    grader_scores: torch.Tensor | None = None
    """(N, J) float64: J independent grader draws per rollout (draw 0 is the reward), only when a
    rule requires "grader_scores" (the trainer then asks its grader for J = GRADER_DRAWS draws)."""
    grader_names: tuple[str, ...] = ()
    group_geometry: Mapping[str, torch.Tensor] | None = None
    """The local update geometry, only when a rule requires "group_geometry":
    {"features": (N, D)} per-response policy-gradient features (grpo/geometry.py: the LM head's
    gradient of each response's mean token log-probability), so a group's Gram matrix is
    features[g] @ features[g].T."""

    def __post_init__(self) -> None:
        n = self.rewards.shape[0]
        for name in ("advantages", "group_ids", "lengths", "keep"):
            if getattr(self, name).shape != (n,):
                raise ValueError(f"UpdateInput.{name} has shape {tuple(getattr(self, name).shape)}, expected ({n},)")
        if self.completion_mask.dim() != 2 or self.completion_mask.shape[0] != n:
            raise ValueError(f"UpdateInput.completion_mask has shape {tuple(self.completion_mask.shape)}, "
                             f"expected ({n}, T)")
        if self.token_logprobs is not None and self.token_logprobs.shape != self.completion_mask.shape:
            raise ValueError("UpdateInput.token_logprobs must have the completion mask's shape (N, T)")
        if self.grader_scores is not None and (self.grader_scores.dim() != 2 or self.grader_scores.shape[0] != n):
            raise ValueError(f"UpdateInput.grader_scores has shape {tuple(self.grader_scores.shape)}, "
                             f"expected ({n}, J)")
        features = (self.group_geometry or {}).get("features")
        if features is not None and (features.dim() != 2 or features.shape[0] != n):
            raise ValueError(f"UpdateInput.group_geometry['features'] has shape {tuple(features.shape)}, "
                             f"expected ({n}, D)")

    @property
    def size(self) -> int:
        return int(self.rewards.shape[0])

    @property
    def num_groups(self) -> int:
        return int(self.group_ids.max()) + 1 if self.size else 0

    def groups(self) -> list[torch.Tensor]:
        """Row indices of each group, in group order."""
        return [torch.nonzero(self.group_ids == g, as_tuple=False).flatten() for g in range(self.num_groups)]

    @classmethod
    def from_batch(cls, batch: PolicyBatch, rewards: torch.Tensor,
                   token_logprobs: torch.Tensor | None = None, grader_scores: torch.Tensor | None = None,
                   group_geometry: Mapping[str, torch.Tensor] | None = None) -> UpdateInput:
        mask = batch.completion_mask.to(torch.float32)
        group_ids = batch.group_ids if batch.group_ids is not None else torch.zeros(batch.size, dtype=torch.long)
        return cls(
            rewards=rewards.to(device=mask.device, dtype=torch.float64),
            advantages=batch.advantages,
            group_ids=group_ids.to(mask.device),
            lengths=mask.sum(dim=1),
            completion_mask=mask,
            keep=torch.ones(batch.size, dtype=torch.bool, device=mask.device),
            token_logprobs=token_logprobs,
            grader_scores=None if grader_scores is None else grader_scores.to(mask.device, torch.float64),
            group_geometry=group_geometry,
        )


class UpdateRule(ABC):
    """An entry of either seam: built from its typed options; capabilities as class attributes."""

    name: ClassVar[str] = ""
    """Stamped by the registry: the name the class is registered under."""
    requires: ClassVar[frozenset[str]] = frozenset()
    """Optional UpdateInput fields this rule reads (OPTIONAL_INPUTS), e.g. {"token_logprobs"}."""

    def __init__(self, options: UpdateRuleOptions):
        self.options = options

    def state_dict(self) -> dict[str, Any]:
        """What the rule carries across steps, JSON-able, for the run's checkpoint ({}: stateless)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore `state_dict()`'s output on resume (a stateless rule has nothing to restore)."""


class SelectionRule(UpdateRule):
    """m_gk: which responses enter the update."""

    @abstractmethod
    def keep(self, inputs: UpdateInput) -> torch.Tensor:
        """(N,) bool: True for a response that stays in the update."""


class ReweightingRule(UpdateRule):
    """w_gkl: how much each response, or each of its tokens, counts."""

    @abstractmethod
    def weights(self, inputs: UpdateInput) -> torch.Tensor:
        """(N,) per-response or (N, T) per-token weights >= 0, up to a constant (the seam
        rescales them to mean 1 over kept responses / kept tokens). `inputs.keep` is the mask."""


@dataclass(frozen=True)
class Coefficients:
    """What a coefficient module returns: the training coefficients and which responses stay."""

    advantages: torch.Tensor  # (N,) replaces the estimator's advantages
    keep: torch.Tensor        # (N,) bool: False for held-back (calibration) and rejected groups


class CoefficientRule(UpdateRule):
    """The end of the advantage stage: recalibrated coefficients (SetGRPO). May keep state across
    steps (a calibration window), so one instance lives for one run."""

    grader_draws: ClassVar[int] = 1
    """How many grader draws per rollout it reads from `grader_scores` (>= 2 for SetGRPO)."""

    @abstractmethod
    def coefficients(self, inputs: UpdateInput) -> Coefficients:
        """Coefficients and keep mask for this batch (inputs.keep is all True here)."""

    def metrics(self) -> dict[str, float]:
        """Diagnostics of the last call, logged with the step's record."""
        return {}


def _import_builtin_rules() -> None:
    import importlib
    import pkgutil

    import trainer_node.grpo.update_rules as pkg

    for mod in pkgutil.iter_modules(pkg.__path__):
        importlib.import_module(f"trainer_node.grpo.update_rules.{mod.name}")


SELECTIONS: Registry[type[SelectionRule]] = Registry(
    "selections", _import_builtin_rules, noun="selection rule",
    on_add=subclass_entries(SelectionRule, "selection rule"),
)
REWEIGHTINGS: Registry[type[ReweightingRule]] = Registry(
    "reweightings", _import_builtin_rules, noun="reweighting rule",
    on_add=subclass_entries(ReweightingRule, "reweighting rule"),
)
COEFFICIENTS: Registry[type[CoefficientRule]] = Registry(
    "coefficients", _import_builtin_rules, noun="coefficient module",
    on_add=subclass_entries(CoefficientRule, "coefficient module"),
)
SEAMS: dict[str, Registry[Any]] = {"selection": SELECTIONS, "reweighting": REWEIGHTINGS,
                                   "coefficients": COEFFICIENTS}
"""The `[grpo]` key of each stage and its registry."""


def parse_rule_options(seam: str, raw: Any) -> UpdateRuleOptions:
    """Validate a `grpo.selection` / `grpo.reweighting` value with the options model of the rule
    it names: a table with `name`, or just the name (`grpo.selection = "gfpo"`). Errors are
    located inside the table (`name`, `keep`, ...); the config edge prefixes `grpo.<seam>.`."""
    registry = SEAMS[seam]
    if isinstance(raw, UpdateRuleOptions):
        return raw
    if isinstance(raw, str):
        raw = {"name": raw}
    if not isinstance(raw, Mapping):
        raise field_error("UpdateRuleOptions", (), "model_type",
                          f"must be a rule name or a table, e.g. {{ name = \"{registry.names()[0]}\" }}", raw)
    name = raw.get("name")
    if not isinstance(name, str) or name not in registry:
        raise field_error("UpdateRuleOptions", ("name",), "unknown_entry",
                          f"unknown {registry.noun} {name!r}; known: {', '.join(registry.names())}", name)
    model = registry.options_model(name) or UpdateRuleOptions
    return validate_options(model, dict(raw), part=f"{registry.noun} {name!r}")


def build_rule(seam: str, options: UpdateRuleOptions | Mapping[str, Any] | str) -> UpdateRule:
    typed = parse_rule_options(seam, options)
    rule = SEAMS[seam].get(typed.name)(typed)
    missing = sorted(set(rule.requires) - PROVIDED_BY_TRAINER)
    unknown = sorted(set(rule.requires) - set(OPTIONAL_INPUTS))
    if unknown:
        raise ValueError(f"{SEAMS[seam].noun} {typed.name!r} requires unknown input(s) {unknown}; "
                         f"optional inputs: {', '.join(OPTIONAL_INPUTS)}")
    if missing:
        raise ValueError(f"{SEAMS[seam].noun} {typed.name!r} needs {', '.join(missing)}, which this trainer "
                         f"does not provide yet (it provides {', '.join(sorted(PROVIDED_BY_TRAINER))})")
    return rule


LogprobFn = Callable[[PolicyBatch], torch.Tensor]
"""batch -> (B, T) token log-probabilities of the current (= rollout) policy, without grad."""
FeatureFn = Callable[[PolicyBatch], torch.Tensor]
"""batch -> (B, D) per-response policy-gradient features (grpo/geometry.py), without grad."""


@dataclass(frozen=True)
class UpdateSeams:
    """The selection and reweighting rules of one run (either may be None: identity)."""

    selection: SelectionRule | None = None
    reweighting: ReweightingRule | None = None
    coefficients: CoefficientRule | None = None
    timings: dict[str, float] = field(default_factory=dict)
    """Seconds of the last `weigh` spent on the geometry ("setgrpo/jacobian_s") and in the
    coefficient module ("setgrpo/recovery_s"): seed 002's Table 6 split."""

    @classmethod
    def from_settings(cls, settings: Any) -> UpdateSeams:
        """From GRPOSettings' `selection` / `reweighting` / `coefficients` (typed options or None)."""
        coefficients = getattr(settings, "coefficients", None)
        return cls(
            selection=None if settings.selection is None else build_rule("selection", settings.selection),
            reweighting=None if settings.reweighting is None else build_rule("reweighting", settings.reweighting),
            coefficients=None if coefficients is None else build_rule("coefficients", coefficients),
        )

    @property
    def identity(self) -> bool:
        return self.selection is None and self.reweighting is None and self.coefficients is None

    @property
    def requires(self) -> frozenset[str]:
        rules = [r for r in (self.selection, self.reweighting, self.coefficients) if r is not None]
        return frozenset().union(*(r.requires for r in rules))

    @property
    def grader_draws(self) -> int:
        """Grader draws per rollout the rules read (1: the reward alone)."""
        return self.coefficients.grader_draws if self.coefficients is not None else 1

    def advantages(self, inputs: UpdateInput) -> UpdateInput:
        """The coefficient module's advantages and keep mask (the input unchanged without one)."""
        if self.coefficients is None:
            return inputs
        started = time.perf_counter()
        out = self.coefficients.coefficients(inputs)
        self.timings["setgrpo/recovery_s"] = time.perf_counter() - started
        if out.advantages.shape != (inputs.size,) or out.keep.shape != (inputs.size,) or out.keep.dtype != torch.bool:
            raise ValueError(f"coefficient module {self.coefficients.name!r} returned advantages "
                             f"{tuple(out.advantages.shape)} and keep {tuple(out.keep.shape)}; expected ({inputs.size},)")
        return replace(inputs, advantages=out.advantages.to(inputs.advantages.dtype), keep=out.keep & inputs.keep)

    def rules(self) -> dict[str, UpdateRule]:
        """The stages that have a rule, by their `[grpo]` key."""
        stages = {"selection": self.selection, "reweighting": self.reweighting, "coefficients": self.coefficients}
        return {stage: rule for stage, rule in stages.items() if rule is not None}

    def state_dict(self) -> dict[str, Any]:
        """Each rule's state by stage, with its name (the checkpoint's `update_rules`)."""
        return {stage: {"name": rule.name, "state": rule.state_dict()} for stage, rule in self.rules().items()}

    def check_state(self, state: dict[str, Any]) -> None:
        """ValueError unless `state` holds one entry per stage of this run, for the same rule (the
        state of one rule means nothing to another)."""
        saved = {stage: entry.get("name") if isinstance(entry, Mapping) else None for stage, entry in state.items()}
        mine = {stage: rule.name for stage, rule in self.rules().items()}
        if saved != mine:
            raise ValueError(f"the checkpoint's update rules {saved} differ from this run's {mine} "
                             "(grpo.selection, grpo.reweighting, grpo.coefficients)")

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore `state_dict()`'s output (checked first: nothing is loaded unless every stage matches)."""
        self.check_state(state)
        for stage, rule in self.rules().items():
            rule.load_state_dict(state[stage]["state"])

    def metrics(self) -> dict[str, float]:
        """The coefficient module's diagnostics and timings of the last step ({} without one)."""
        if self.coefficients is None:
            return {}
        return {**self.coefficients.metrics(), **self.timings}

    def token_factor(self, inputs: UpdateInput) -> torch.Tensor | None:
        """m_gk * w_gkl as (N, T) (0 off the completion tokens), or None for the identity.
        `inputs` has been through `advantages` already."""
        if self.identity:
            return None
        keep = inputs.keep
        if self.selection is not None:
            keep = _checked_mask(self.selection.keep(inputs), inputs, self.selection.name)
        factor = keep.to(torch.float32).unsqueeze(1) * inputs.completion_mask
        if self.reweighting is not None:
            raw = self.reweighting.weights(replace(inputs, keep=keep))
            factor = factor * _mean_one(_checked_weights(raw, inputs, self.reweighting.name), keep, inputs)
        return factor

    def weigh(self, batch: PolicyBatch, rewards: torch.Tensor, logprobs: LogprobFn,
              grader_scores: torch.Tensor | None = None, features: FeatureFn | None = None) -> PolicyBatch:
        """The batch with the coefficient module's advantages (if any) and the seams' token
        weights attached (unchanged for the identity)."""
        if self.identity:
            return batch
        needs = self.requires
        token_logprobs = logprobs(batch) if "token_logprobs" in needs else None
        geometry = None
        if "group_geometry" in needs:
            if features is None:
                raise ValueError("an update rule requires group_geometry; pass `features` to UpdateSeams.weigh")
            started = time.perf_counter()
            geometry = {"features": features(batch)}
            self.timings["setgrpo/jacobian_s"] = time.perf_counter() - started
        if "grader_scores" in needs and (grader_scores is None or grader_scores.shape[1] < self.grader_draws):
            raise ValueError(f"an update rule requires {self.grader_draws} grader draws per rollout; "
                             "the trainer's grader gave fewer")
        inputs = self.advantages(UpdateInput.from_batch(batch, rewards, token_logprobs, grader_scores, geometry))
        return replace(batch, advantages=inputs.advantages, token_weights=self.token_factor(inputs))


def _checked_mask(mask: torch.Tensor, inputs: UpdateInput, rule: str) -> torch.Tensor:
    if mask.shape != (inputs.size,) or mask.dtype != torch.bool:
        raise ValueError(f"selection rule {rule!r} returned {mask.dtype} of shape {tuple(mask.shape)}; "
                         f"expected a bool mask of shape ({inputs.size},)")
    return mask & inputs.keep


def _checked_weights(weights: torch.Tensor, inputs: UpdateInput, rule: str) -> torch.Tensor:
    if weights.shape not in ((inputs.size,), tuple(inputs.completion_mask.shape)):
        raise ValueError(f"reweighting rule {rule!r} returned shape {tuple(weights.shape)}; expected "
                         f"({inputs.size},) or {tuple(inputs.completion_mask.shape)}")
    weights = weights.to(torch.float32)
    if not bool(torch.isfinite(weights).all()) or bool((weights < 0).any()):
        raise ValueError(f"reweighting rule {rule!r} returned a negative or non-finite weight")
    return weights


def _mean_one(weights: torch.Tensor, keep: torch.Tensor, inputs: UpdateInput) -> torch.Tensor:
    """(N, T) weights rescaled to mean 1 over kept responses (per-response weights) or over kept
    completion tokens (token weights); all-zero weights stay zero."""
    kept = keep.to(torch.float32)
    if weights.dim() == 1:
        total, count = (weights * kept).sum(), kept.sum()
        scaled = weights * (count / total) if float(total) > 0 else torch.zeros_like(weights)
        return scaled.unsqueeze(1).expand_as(inputs.completion_mask)
    tokens = kept.unsqueeze(1) * inputs.completion_mask
    total, count = (weights * tokens).sum(), tokens.sum()
    return weights * (count / total) if float(total) > 0 else torch.zeros_like(weights)


def seam_metrics(batch: PolicyBatch) -> dict[str, float]:
    """Logged each step: share of responses kept, and the spread of the per-token factor over
    the kept tokens (its mean is 1 by construction when a reweighting rule is set)."""
    if batch.token_weights is None:
        return {}
    mask = batch.completion_mask.to(torch.float32)
    factor = batch.token_weights.to(torch.float32) * mask
    with_tokens = mask.sum(dim=1) > 0  # an empty completion has no token to weigh
    kept = (factor.sum(dim=1) > 0)[with_tokens]
    values = factor[(factor > 0)]
    return {
        "update/kept_frac": float(kept.float().mean()) if kept.numel() else 0.0,
        "update/weight_mean": float(values.mean()) if values.numel() else 0.0,
        "update/weight_std": float(values.std()) if values.numel() > 1 else 0.0,
        "update/weight_max": float(values.max()) if values.numel() else 0.0,
    }


def nothing_kept(batch: PolicyBatch) -> bool:
    """True when the seams dropped every response: the step is skipped (see GRPOTrainer.update)."""
    return batch.token_weights is not None and not bool((batch.token_weights * batch.completion_mask).any())
