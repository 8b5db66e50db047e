"""The two update seams inside a GRPO step: which responses enter the update, and how much
each of their tokens counts (DataFlex-RL's selection and reweighting families, seed 001).

    advantages -> selection mask m_gk -> weights w_gkl -> loss        (the order is fixed)

    L_sel = 1/(GK) sum_g sum_k  m_gk / L_gk  sum_l  loss_gkl           DataFlex Eq. 1
    L_rew = 1/(GK) sum_g sum_k     1 / L_gk  sum_l  w_gkl loss_gkl     DataFlex Eq. 2

Both seams see the same typed input, `UpdateInput`: rewards, advantages, group ids, response
lengths and the completion mask, the selection mask so far, and optional inputs a rule asks
for by name in `requires` (token log-probabilities today; several grader scores per rollout
and per-group gradient geometry are reserved for SetGRPO's coefficient module, issue 19,
which plugs in here as a reweighting rule instead of adding a third seam).

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

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any, ClassVar

import torch

from protocol.plugins import Registry, subclass_entries
from rlvr_core.configuration import field_error, validate_options
from trainer_node.grpo.batch import PolicyBatch
from trainer_node.grpo.update_options import UpdateRuleOptions

OPTIONAL_INPUTS = ("token_logprobs", "grader_scores", "group_geometry")
"""UpdateInput fields a rule may ask for in `requires`; the others are always present."""
PROVIDED_BY_TRAINER = frozenset({"token_logprobs"})
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
    """(N, J): J grader scores per rollout, columns named by `grader_names` (reserved: SetGRPO)."""
    grader_names: tuple[str, ...] = ()
    group_geometry: Mapping[str, torch.Tensor] | None = None
    """Per-group gradient geometry, e.g. {"gram": (G, G) inner products of per-group policy
    gradients, "norms": (G,)} (reserved: SetGRPO's coefficient module)."""

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
                   token_logprobs: torch.Tensor | None = None) -> UpdateInput:
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
        )


class UpdateRule(ABC):
    """An entry of either seam: built from its typed options; capabilities as class attributes."""

    name: ClassVar[str] = ""
    """Stamped by the registry: the name the class is registered under."""
    requires: ClassVar[frozenset[str]] = frozenset()
    """Optional UpdateInput fields this rule reads (OPTIONAL_INPUTS), e.g. {"token_logprobs"}."""

    def __init__(self, options: UpdateRuleOptions):
        self.options = options


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
SEAMS: dict[str, Registry[Any]] = {"selection": SELECTIONS, "reweighting": REWEIGHTINGS}
"""The `[grpo]` key of each seam and its registry."""


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


@dataclass(frozen=True)
class UpdateSeams:
    """The selection and reweighting rules of one run (either may be None: identity)."""

    selection: SelectionRule | None = None
    reweighting: ReweightingRule | None = None

    @classmethod
    def from_settings(cls, settings: Any) -> UpdateSeams:
        """From GRPOSettings' `selection` / `reweighting` (typed options or None)."""
        return cls(
            selection=None if settings.selection is None else build_rule("selection", settings.selection),
            reweighting=None if settings.reweighting is None else build_rule("reweighting", settings.reweighting),
        )

    @property
    def identity(self) -> bool:
        return self.selection is None and self.reweighting is None

    @property
    def requires(self) -> frozenset[str]:
        rules = [r for r in (self.selection, self.reweighting) if r is not None]
        return frozenset().union(*(r.requires for r in rules))

    def token_factor(self, inputs: UpdateInput) -> torch.Tensor | None:
        """m_gk * w_gkl as (N, T) (0 off the completion tokens), or None for the identity."""
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

    def weigh(self, batch: PolicyBatch, rewards: torch.Tensor, logprobs: LogprobFn) -> PolicyBatch:
        """The batch with the seams' token weights attached (unchanged for the identity)."""
        if self.identity:
            return batch
        token_logprobs = logprobs(batch) if "token_logprobs" in self.requires else None
        inputs = UpdateInput.from_batch(batch, rewards, token_logprobs)
        return replace(batch, token_weights=self.token_factor(inputs))


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
