"""Simulation-only data policies. Importing this package registers them in the trainer's policy
registry (trainer_node/policies/base.py), marked `simulation_only`.

Why an import, not the registry's entry-point group: the trainer image installs the project
without the lab, and an entry point declared in pyproject.toml whose module is absent would
make every policy lookup there fail. So the lab registers its policies itself, and every lab
module imports this package (via lab/__init__.py) before it names a policy.
"""

from typing import Any

from lab.policies import oracle


def fill_simulation_options(raw: dict[str, Any]) -> dict[str, Any]:
    """A raw run config with the options only a simulation knows filled in (today: the oracle's
    target composition); a config naming any other policy comes back unchanged."""
    return oracle.fill_target_weights(raw)


__all__ = ["fill_simulation_options"]
