"""The trainer as a Flower ServerApp, for a real deployment: `flwr run flower-app/ <superlink>`.

A SuperLink runs this app's `main(grid, context)` (in its `flwr-serverapp` process, in the
trainer's environment); each owner runs a SuperNode whose ClientApp is the shim (flower_shim/),
configured by its own `--node-config` (its owner node's loopback address and the trainer's client
certificate). `main` is `trainer-node train` with the owners behind Flower instead of direct mTLS:

1. the run config (`[tool.flwr.app.config]` in flower-app/pyproject.toml, or `flwr run
   --run-config`) names the training config, the owners the run expects and, optionally, each
   owner's registered node id (`owner-nodes`, from `flwr supernode register`: the mapping the
   SuperLink authenticates; without it each shim names its owner from its node_config);
2. each owner is checked at start like a `[[feedback.owners]]` entry (GetInfo, GetBudget, its
   rendering): one that does not answer or is not connected in time is left out and named in
   summary.json's `owners_lost` (step 0);
3. the one run loop trains with a MultiOwnerFeedback over FlowerOwnerClients (one pacer and budget
   per owner; `[owners]` chooses the aggregation); summary.json says `transport = "flower"`;
4. with `[selection] every = N`, checkpoint selection over the owners (trainer_node/feedback/owners.py):
   each candidate goes to every owner with weight, one selection release per owner at the end, the
   best weighted aggregate wins; summary.json's `selection` names the step and its local checkpoint.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
os.environ.setdefault("FLWR_DISABLE_UPDATE_CHECK", "1")

from flwr.serverapp import Grid, ServerApp  # after the environment variables above

log = logging.getLogger("trainer_node.federation")


@dataclass(frozen=True)
class DeploymentOptions:
    """What the ServerApp reads from its run config (keys as in flower-app/pyproject.toml)."""

    train_config: Path
    owners: tuple[str, ...]
    owner_nodes: dict[str, int] = field(default_factory=dict)
    out_dir: str | None = None
    steps: int | None = None
    startup_timeout_s: float = 120.0
    message_timeout_s: float = 300.0
    final_release: bool = True
    """Ask each owner once for the final checkpoint's accuracy (one charged release each), as
    `train`'s feedback.final_release does."""

    @classmethod
    def from_run_config(cls, run_config: dict[str, Any]) -> DeploymentOptions:
        def text(key: str) -> str:
            return str(run_config.get(key, "") or "").strip()

        if not text("train-config"):
            raise ValueError("run config train-config: the path of the training TOML is required "
                             "(flwr run ... --run-config 'train-config=\"/path/run.toml\"')")
        owners = tuple(name.strip() for name in text("owners").split(",") if name.strip())
        if not owners:
            raise ValueError("run config owners: name the owners this run expects, comma-separated "
                             "(each one's SuperNode --node-config owner-name)")
        if len(set(owners)) != len(owners):
            raise ValueError(f"run config owners: {text('owners')!r} names an owner twice")
        pins: dict[str, int] = {}
        for pair in filter(None, (p.strip() for p in text("owner-nodes").split(","))):
            name, _, node = pair.partition("=")
            if name.strip() not in owners or not node.strip().isdigit():
                raise ValueError(f"run config owner-nodes: {pair!r} is not <owner in owners>=<node id>")
            pins[name.strip()] = int(node)
        steps = int(run_config["steps"]) if int(run_config.get("steps", 0) or 0) > 0 else None
        return cls(train_config=Path(text("train-config")), owners=owners, owner_nodes=pins,
                   out_dir=text("out-dir") or None, steps=steps,
                   startup_timeout_s=float(run_config.get("startup-timeout", 120.0)),
                   message_timeout_s=float(run_config.get("message-timeout", 300.0)),
                   final_release=bool(run_config.get("final-release", True)))


def connect_flower_owners(grid: Any, options: DeploymentOptions) -> tuple[dict[str, Any], dict[str, str]]:
    """(client by owner name, why each missing owner is missing). Waits up to startup_timeout_s for
    the expected owners' SuperNodes; a node whose shim names an owner the run does not expect, or
    names one other than its pinned node id's, is not used (and logged)."""
    from trainer_node.federation.client import FlowerOwnerClient
    from trainer_node.feedback.client import FeedbackError

    deadline = time.monotonic() + options.startup_timeout_s
    clients: dict[str, Any] = {}
    seen: set[int] = set()
    failed: dict[str, str] = {}
    pinned = {node: name for name, node in options.owner_nodes.items()}
    while len(clients) < len(options.owners) and time.monotonic() < deadline:
        for node_id in sorted(set(grid.get_node_ids()) - seen):  # nodes register after main() starts
            seen.add(node_id)
            client = FlowerOwnerClient(grid, node_id, timeout_s=options.message_timeout_s)
            try:
                name = client.owner_name()
            except FeedbackError as error:
                log.warning("SuperNode %d does not answer query.info (%s); not used", node_id, error)
                continue
            if name not in options.owners or name in clients:
                log.warning("SuperNode %d names owner %r, which this run does not expect (or already has); not "
                            "used", node_id, name)
                continue
            if options.owner_nodes and pinned.get(node_id) != name:  # pinned: the registered id decides
                log.warning("SuperNode %d names owner %r, but owner-nodes pins %r to node %s; not used", node_id,
                            name, name, options.owner_nodes.get(name))
                continue
            client.name = name
            clients[name] = client
        time.sleep(0.5)
    for name in options.owners:
        if name not in clients:
            failed[name] = (f"its SuperNode did not connect within {options.startup_timeout_s:g} s (run config "
                            "startup-timeout)")
    return {name: clients[name] for name in options.owners if name in clients}, failed


def check_flower_owners(clients: dict[str, Any], failed: dict[str, str]) -> Any:
    """OwnersAtStart (trainer_node/training.py) for owners reached over Flower: GetInfo and GetBudget,
    as `train` checks each [[feedback.owners]] entry; an owner that fails is left out and named."""
    from trainer_node.feedback.client import FeedbackError
    from trainer_node.feedback.preflight import OwnerStartError, OwnerStatus, describe_owner
    from trainer_node.training import OwnersAtStart

    passed = {}
    for name, client in list(clients.items()):
        try:
            status = OwnerStatus(client.info(), client.budget())
        except FeedbackError as error:
            failed[name] = f"the start checks failed over Flower ({error})"
            log.warning("target owner %r left out at start: %s", name, failed[name])
            del clients[name]
            continue
        for line in describe_owner(status):
            log.info("%s: %s", name, line)
        passed[name] = status
    if not passed:
        raise OwnerStartError("no target owner passed the start checks over Flower: "
                              + "; ".join(f"{name}: {why}" for name, why in failed.items()))
    return OwnersAtStart(passed, dict(failed))


def run_deployment(grid: Any, options: DeploymentOptions, progress: bool = False) -> dict[str, Any]:
    """Train with the owners behind `grid`; returns the run's summary (also in run.out_dir/summary.json)."""
    from trainer_node.config import load_config
    from trainer_node.feedback.aggregation import AggregationOptions
    from trainer_node.feedback.hook import OwnerFeedbackHook
    from trainer_node.feedback.owners import connect_owners
    from trainer_node.feedback.selection import CheckpointSelector
    from trainer_node.grpo.checkpoint import checkpoint_name
    from trainer_node.loop import Schedule, run_loop
    from trainer_node.run_output import RunOutput
    from trainer_node.training import (
        SourceEvaluation,
        build_training,
        check_owner_accepts_model,
        check_trainable,
        feedback_settings,
    )

    config = load_config(options.train_config, {"run.out_dir": options.out_dir, "run.steps": options.steps})
    if config.feedback is not None:
        raise ValueError(f"{options.train_config}: [feedback]: over Flower the owners are the SuperNodes of the run "
                         "(run config `owners`); remove the [feedback] section ([owners] chooses the aggregation)")
    check_trainable(config, selects_checkpoints=True)
    clients, failed = connect_flower_owners(grid, options)
    try:
        owners = check_flower_owners(clients, failed)
        setup = build_training(config, owner_rendering=owners.rendering())
        check_owner_accepts_model(setup)
        run_dir = Path(config.run.out_dir)
        aggregation = config.owners or AggregationOptions()
        feedback = connect_owners(clients, setup.trainer, feedback_settings(config), run_dir / "checkpoints_sent",
                                  aggregation, left_out=owners.failed)
        if setup.policy.uses_target_feedback:
            setup.trainer.feedback = feedback
        config.save_resolved(run_dir)
        output = RunOutput(run_dir, config.run.steps, start_step=setup.trainer.step_index, progress=progress)
        schedule = Schedule(steps=config.run.steps, eval_every=config.run.eval_every,
                            save_every=config.run.save_every, checkpoint_dir=run_dir / "checkpoints")
        selector = (CheckpointSelector(feedback, config.selection.every, config.selection.max_candidates,
                                       config.run.steps) if config.selection.every else None)
        hook = OwnerFeedbackHook(feedback, selector=selector, final_release=options.final_release)
        result = run_loop(setup.trainer, output, schedule, SourceEvaluation(setup), hook)
        budgets = {}
        for owner in feedback.owners:
            try:
                budgets[owner.name] = owner.feedback.client.budget()
            except Exception:  # noqa: BLE001 - a lost owner: its spend so far is in the feedback stats
                budgets[owner.name] = None
        summary = feedback.summary()
        for name, budget in budgets.items():
            if budget is not None:
                summary["owners"][name]["epsilon_spent"] = budget.epsilon_spent
                summary["owners"][name]["epsilon_budget"] = budget.epsilon_budget if budget.dp_enabled else 0.0
        extra = {"final_checkpoint": str(result.final_checkpoint), "model_dir": str(setup.model_dir),
                 "transport": "flower", "num_owners": len(options.owners),
                 "upload_bytes": {o.name: getattr(o.feedback.client, "upload_bytes_total", None)
                                  for o in feedback.owners},
                 "rendering": setup.rendering.describe() if setup.rendering else None,
                 **result.feedback.summary, **summary}
        if result.feedback.selection is not None:  # the step chosen, and its checkpoint where one was saved
            chosen = schedule.checkpoint_dir / checkpoint_name(result.feedback.selection.chosen.step)
            extra["selection"] = {**result.feedback.selection.to_json(),
                                  "selected_checkpoint": str(chosen) if chosen.exists() else None}
        return output.close(extra=extra)
    finally:
        for client in clients.values():
            client.close()


app = ServerApp()


@app.main()
def main(grid: Grid, context: Any) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    summary = run_deployment(grid, DeploymentOptions.from_run_config(dict(context.run_config)))
    log.info("run finished: %d steps, owners lost: %s", summary.get("steps", 0), summary.get("owners_lost"))
