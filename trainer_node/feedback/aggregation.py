"""How the releases of several owners become the one accuracy per candidate a policy sees.

A registry of aggregations (`AGGREGATIONS`, plug-ins through `target_feedback.aggregations`):
each maps the owners' public held-out sizes and the options to one weight per owner. Kept apart
from trainer_node/feedback/owners.py so the config edge (trainer_node/config.py's [owners]) can
type its options without importing the feedback machinery.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pydantic import Field, field_validator

from protocol.plugins import Registry
from rlvr_core.configuration import OptionsSection

Weights = dict[str, float]
AGGREGATIONS: Registry[Callable[[dict[str, int], Any], Weights]] = Registry("aggregations", noun="aggregation")


class AggregationOptions(OptionsSection):
    """How the releases of several owners become the one accuracy per candidate a policy sees."""

    name: str = Field(default="heldout_size", description="A registered aggregation: heldout_size (weights by "
                      "each owner's public held-out size), mixture (the declared `mixture`), per_owner (only "
                      "`owner`'s releases).")
    mixture: dict[str, float] = Field(default_factory=dict, description="aggregation = mixture: owner name -> "
                                      "weight (>= 0, not all zero); every owner must be named.")
    owner: str | None = Field(default=None, description="aggregation = per_owner: the owner whose target the "
                              "policy learns against.")
    drop_after_failures: int = Field(default=2, ge=1, description="Drop an unreachable owner after this many "
                                     "failed queries in a row (an owner out of budget is dropped at once).")

    @field_validator("name")
    @classmethod
    def _known(cls, name: str) -> str:
        if name not in AGGREGATIONS:
            raise ValueError(f"aggregation {name!r} is unknown; choose one of: {', '.join(AGGREGATIONS.names())}")
        return name


@AGGREGATIONS.register("heldout_size")
def by_heldout_size(sizes: dict[str, int], options: AggregationOptions) -> Weights:
    total = sum(sizes.values())
    return {name: size / total if total else 1.0 / len(sizes) for name, size in sizes.items()}


@AGGREGATIONS.register("mixture")
def by_mixture(sizes: dict[str, int], options: AggregationOptions) -> Weights:
    unknown = sorted(set(options.mixture) - set(sizes))
    missing = sorted(set(sizes) - set(options.mixture))
    if unknown or missing or any(w < 0 for w in options.mixture.values()) or not sum(options.mixture.values()):
        raise ValueError(f"owners.mixture: name every owner ({', '.join(sorted(sizes))}) with a weight >= 0, not "
                         f"all zero" + (f"; unknown: {', '.join(unknown)}" if unknown else "")
                         + (f"; missing: {', '.join(missing)}" if missing else ""))
    total = sum(options.mixture.values())
    return {name: options.mixture[name] / total for name in sizes}


@AGGREGATIONS.register("per_owner")
def per_owner(sizes: dict[str, int], options: AggregationOptions) -> Weights:
    if options.owner not in sizes:
        raise ValueError(f"owners.owner: {options.owner!r} is not one of the owners ({', '.join(sorted(sizes))})")
    return {name: 1.0 if name == options.owner else 0.0 for name in sizes}
