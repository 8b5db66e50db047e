"""static: the equal domain mixture p_t(d) = 1/D (seed 001, Table 1: DataFlex-RL's fixed-mixture
control, against which every adaptive mixture is compared).

Each step draws round(batch_size / D) prompts per domain (largest remainder, ties at random),
uniformly within each domain. Unlike `uniform`, whose domain counts vary from step to step with
the pool's composition, every step here is stratified by domain. See mixture.py.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from trainer_node.policies.base import POLICIES
from trainer_node.policies.mixture import DomainMixturePolicy
from trainer_node.policies.options import PolicyOptions


class StaticOptions(PolicyOptions):
    """The equal mixture takes only the shared batch shape."""

    name: Literal["static"] = Field(default="static", description="Equal domain mixture (1/D each).")


@POLICIES.register("static", options=StaticOptions)
class StaticMixture(DomainMixturePolicy):
    options: StaticOptions
