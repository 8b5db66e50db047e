"""The typed options of an update rule: the `grpo.selection` / `grpo.reweighting` tables.

Each rule module defines `class XOptions(UpdateRuleOptions)` with `name: Literal["x"] = "x"`
and its own fields (bounds and a description on each), and registers its rule with it:
`@SELECTIONS.register("x", options=XOptions)` (or REWEIGHTINGS). The run config's table is
validated against the model registered under its `name` when the config loads, so

    [grpo]
    selection = { name = "gfpo", kep = 3 }     # typo

fails at load with `grpo.selection.kep: not an option of selection rule 'gfpo'; did you mean
'keep'? ...`, and resolved_config.json lists every option with the value used.

Light on purpose (pydantic only): trainer_node/grpo/settings.py imports it at config load.
"""

from __future__ import annotations

from pydantic import Field

from rlvr_core.configuration import OptionsSection


class UpdateRuleOptions(OptionsSection):
    """What every update rule's options share: the registered name that picked the model."""

    name: str = Field(description="A registered update rule (trainer_node.grpo.update_rules).")
