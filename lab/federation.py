"""`trainer-node simulate --owners N`: one trainer, N target owners, over Flower's simulation runtime.

1. the testbed's target domains (families, where a testbed declares them) are dealt out to the
   owners: owner i holds only its own domain(s), in its own owner folder (the owner's own init)
   and its own `target-owner-node serve` process; the trainer builds from SOURCE data only;
2. Flower's simulation runtime (`flwr.simulation.run_simulation`, Ray backend) starts N
   SuperNodes running the shim ClientApp (flower_shim/), each forwarding over loopback mTLS to
   its owner's node; the ServerApp's main() is the trainer: it learns which node is which owner
   (query.info), wraps each in a FlowerOwnerClient and runs the one run loop with a
   MultiOwnerFeedback (one pacer and budget per owner, releases aggregated by
   [owners] aggregation, trainer_node/feedback/owners.py);
3. each owner measures its own target TEST split before and after; summary.json reports
   accuracy and epsilon per owner, and names each owner lost during the run with its step.

An owner that dies or runs out of budget is dropped; training goes on with the others.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lab.evaluation import owner_test_decoding, sampled_decoding_summary, sampled_decoding_words
from lab.owner_process import OwnerProcess, init_owner
from lab.simulate import SimulateOptions, Simulation, prompt_width
from rlvr_core.configuration import ConfigError
from rlvr_core.tasks.testbed import TestbedSpec, build_testbed_data, load_testbed
from trainer_node.feedback.aggregation import AggregationOptions
from trainer_node.feedback.client import FeedbackError
from trainer_node.feedback.hook import OwnerFeedbackHook
from trainer_node.feedback.owners import MultiOwnerFeedback, connect_owners
from trainer_node.loop import Schedule, run_loop
from trainer_node.run_output import RunOutput
from trainer_node.training import build_training

log = logging.getLogger("lab.federation")


def owner_testbeds(spec: TestbedSpec, owners: int) -> list[TestbedSpec]:
    """Owner i's testbed: the same source, and the target entries of the i-th target family
    (a testbed without families: its domains), dealt round-robin when there are more families than
    owners. More owners than families is refused (a ConfigError: the CLI prints it without a
    traceback): every owner has its own target domain."""
    families = sorted({entry.family_name for entry in spec.target})
    if owners < 1 or owners > len(families):
        raise ConfigError(f"--owners {owners}: testbed {spec.name!r} declares {len(families)} target domain(s) "
                         f"({', '.join(families)}); each owner needs its own, so use 1..{len(families)}")
    specs = []
    for index in range(owners):
        mine = {family for i, family in enumerate(families) if i % owners == index}
        target = [entry for entry in spec.target if entry.family_name in mine]
        specs.append(spec.model_copy(update={"name": f"{spec.name}-owner{index}", "target": target,
                                             "summaries": {}}))
    return specs


def write_testbed(spec: TestbedSpec, path: Path) -> Path:
    """A testbed TOML the owner's init reads (arrays of tables for source and target)."""
    from lab.bench.tomlwrite import toml_value

    # TOML has no null: a field left None (e.g. source_grader) is omitted and reads back as its default
    data = spec.model_dump(exclude={"summaries"}, exclude_none=True)
    lines = [f"{key} = {toml_value(value)}" for key, value in data.items() if key not in ("source", "target")]
    for table in ("source", "target"):
        for entry in data[table]:
            lines += ["", f"[[{table}]]"] + [f"{key} = {toml_value(value)}" for key, value in entry.items()]
    path.write_text("\n".join(lines) + "\n")
    load_testbed(path)  # what the owner will read: refuse here, naming the file, if it does not round-trip
    return path


@dataclass(frozen=True)
class FederatedOptions:
    owners: int = 3
    aggregation: AggregationOptions | None = None
    """None: the config's [owners] section, else heldout_size."""
    aggregation_name: str | None = None
    """`--aggregation`: replaces the aggregation's name."""
    learn_from: str | None = None
    """`--learn-from OWNER`: per_owner aggregation on that owner (L2RR learns q against its target)."""
    startup_timeout_s: float = 120.0
    message_timeout_s: float = 300.0
    on_step: Callable[[int, dict[str, OwnerProcess]], None] | None = None
    """Called after every step with the owner processes (a test kills one mid-run here)."""


class FederatedSimulation(Simulation):
    def __init__(self, opts: SimulateOptions, federated: FederatedOptions):
        super().__init__(opts)
        self.federated = federated

    def run(self) -> dict[str, Any]:
        os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
        os.environ.setdefault("FLWR_DISABLE_UPDATE_CHECK", "1")
        started = time.perf_counter()
        cfg, opts, fed = self.config, self.opts, self.federated
        self.run_dir.mkdir(parents=True, exist_ok=True)
        owners_dir = self.run_dir / "owners"
        if owners_dir.exists():
            shutil.rmtree(owners_dir)  # fresh certificates and budgets for every run
        owners_dir.mkdir()
        specs = owner_testbeds(load_testbed(cfg.data.testbed), fed.owners)
        setup = build_training(cfg)  # the trainer's model and pool: source data only
        names = [f"owner{i}" for i in range(fed.owners)]
        processes: dict[str, OwnerProcess] = {}
        try:
            for index, (name, spec) in enumerate(zip(names, specs, strict=True)):
                folder = owners_dir / name
                folder.mkdir()
                testbed = write_testbed(spec, owners_dir / f"{name}.testbed.toml")
                init_owner(folder / "node", str(testbed), dp=not opts.no_dp, test_split=True, epsilon=opts.epsilon,
                           sample_rate=opts.sample_rate, planned_releases=opts.planned_releases,
                           max_prompt_tokens=prompt_width(setup.tokenizer, build_testbed_data(spec), setup.template),
                           feedback_verifier=cfg.simulated_owner.feedback_verifier)  # every owner's, alike
                processes[name] = OwnerProcess(folder / "node", startup_timeout_s=fed.startup_timeout_s,
                                                # each owner its own noise stream (independent noise, as real owners)
                                                **cfg.simulated_owner.process_options(cfg.run.seed * 1009 + index))
                processes[name].start()
            outcome = self._federate(setup, processes, specs)
        finally:
            for process in processes.values():
                process.stop()
        return self._summarize(outcome, specs, started)

    def _federate(self, setup: Any, processes: dict[str, OwnerProcess], specs: list[TestbedSpec]) -> dict[str, Any]:
        from flwr.serverapp import Grid, ServerApp
        from flwr.simulation import run_simulation

        from flower_shim.app import make_client_app
        from protocol.public_client import PublicClientSettings

        names = list(processes)
        table = {}
        for index, (name, process) in enumerate(processes.items()):
            pki = process.directory / "pki"
            table[index] = (name, PublicClientSettings(target=f"127.0.0.1:{process.port}", ca_cert=pki / "ca.pem",
                                                       client_cert=pki / "client.pem", client_key=pki / "client.key",
                                                       server_name="localhost"))
        client_app = make_client_app(lambda context: table[int(context.node_config["partition-id"])])
        server_app = ServerApp()
        outcome: dict[str, Any] = {}

        @server_app.main()
        def main(grid: Grid, context: Any) -> None:
            try:
                outcome.update(self._train(grid, setup, processes, names))
            except BaseException as error:  # noqa: BLE001 - re-raised after the runtime has stopped
                outcome["error"] = error

        run_simulation(server_app=server_app, client_app=client_app, num_supernodes=len(names),
                       backend_config={"client_resources": {"num_cpus": 1, "num_gpus": 0.0},
                                       "init_args": {"num_cpus": 2, "include_dashboard": False}})
        if "error" in outcome:
            raise outcome["error"]
        if "result" not in outcome:
            raise RuntimeError("the Flower simulation ended before the trainer's ServerApp finished (see its log)")
        return outcome

    def _clients(self, grid: Any, names: list[str]) -> dict[str, Any]:
        from trainer_node.federation.client import FlowerOwnerClient

        deadline = time.monotonic() + self.federated.startup_timeout_s
        while len(node_ids := sorted(grid.get_node_ids())) < len(names):  # nodes register after main() starts
            if time.monotonic() > deadline:
                raise RuntimeError(f"only {len(node_ids)} of {len(names)} SuperNodes registered")
            time.sleep(0.2)
        clients = {}
        for node_id in node_ids:
            client = FlowerOwnerClient(grid, node_id, timeout_s=self.federated.message_timeout_s)
            client.name = client.owner_name()  # simulation: the shim's table says which owner it is
            clients[client.name] = client
        return {name: clients[name] for name in names}

    def _train(self, grid: Any, setup: Any, processes: dict[str, OwnerProcess], names: list[str]) -> dict[str, Any]:
        from trainer_node.feedback.selection import CheckpointSelector
        from trainer_node.training import feedback_settings

        cfg = self.config
        clients = self._clients(grid, names)
        # the deployment's settings ([feedback], and one release per owner kept back for [selection])
        feedback = connect_owners(clients, setup.trainer, feedback_settings(cfg), self.run_dir / "checkpoints_sent",
                                  self.aggregation())
        if setup.policy.uses_target_feedback:
            setup.trainer.feedback = feedback
        evaluation = PerOwnerTestEvaluation(feedback, owner_test_decoding(cfg))
        selector = (CheckpointSelector(feedback, cfg.selection.every, cfg.selection.max_candidates, cfg.run.steps)
                    if cfg.selection.every else None)  # over every owner, as the deployment's ServerApp does
        hook = StepCallbackHook(OwnerFeedbackHook(feedback, selector=selector),
                                lambda step: self._on_step(step, processes))
        cfg.save_resolved(self.run_dir)
        output = RunOutput(self.run_dir, cfg.run.steps, progress=self.opts.progress)
        result = run_loop(setup.trainer, output, Schedule(steps=cfg.run.steps, eval_every=cfg.run.eval_every),
                          evaluation, hook)
        budgets = {}
        for owner in feedback.owners:
            try:
                budgets[owner.name] = owner.feedback.client.budget()
            except FeedbackError:
                budgets[owner.name] = None  # a lost owner: its last known spend is in the feedback stats
        return {"result": result, "feedback": feedback, "budgets": budgets, "output": output,
                "trainer": setup.trainer, "domains": evaluation.domains}

    def aggregation(self) -> AggregationOptions:
        fed = self.federated
        base = fed.aggregation or self.config.owners or AggregationOptions()
        update: dict[str, Any] = {}
        if fed.aggregation_name is not None:
            update["name"] = fed.aggregation_name
        if fed.learn_from is not None:
            update.update(name="per_owner", owner=fed.learn_from)
        return AggregationOptions(**{**base.model_dump(), **update}) if update else base

    def _on_step(self, step: int, processes: dict[str, OwnerProcess]) -> None:
        if self.federated.on_step is not None:
            self.federated.on_step(step, processes)

    def _summarize(self, outcome: dict[str, Any], specs: list[TestbedSpec], started: float) -> dict[str, Any]:
        cfg = self.config
        result, feedback, budgets = outcome["result"], outcome["feedback"], outcome["budgets"]
        trainer, output = outcome["trainer"], outcome["output"]
        owners_summary = feedback.summary()
        per_owner = owners_summary["owners"]
        for owner, spec in zip(feedback.owners, specs, strict=True):
            entry = per_owner[owner.name]
            entry["target_domains"] = sorted({e.domain for e in spec.target})
            entry["target_accuracy_before"] = (result.initial or {}).get(f"accuracy/{owner.name}")
            entry["target_accuracy_after"] = (result.final or {}).get(f"accuracy/{owner.name}")
            for when, label in (("before", "initial"), ("after", "final")):
                entry[f"target_domain_accuracy_{when}"] = outcome["domains"].get(label, {}).get(owner.name)
            budget = budgets[owner.name]
            if budget is not None:
                entry["epsilon_spent"] = budget.epsilon_spent
                entry["epsilon_budget"] = budget.epsilon_budget if budget.dp_enabled else 0.0
        summary = {
            "method": cfg.policy.name, "testbed": cfg.data.testbed, "seed": cfg.run.seed,
            "steps": trainer.step_index, "transport": "flower-simulation", "num_owners": len(feedback.owners),
            "target_accuracy_before": (result.initial or {}).get("accuracy"),
            "target_accuracy_after": (result.final or {}).get("accuracy"),
            # every owner's own domains (disjoint: one owner per target domain), so the bench's
            # per-benchmark table and its domain-balanced score read a multi-owner run like any other
            "target_domain_accuracy_before": merged_domains(per_owner, "before"),
            "target_domain_accuracy_after": merged_domains(per_owner, "after"),
            "rollouts": trainer.rollouts_cumulative,
            "epsilon_spent": feedback.stats.epsilon_spent,  # the largest per-owner spend
            "epsilon_budget": max((o.get("epsilon_budget") or 0.0) for o in per_owner.values()),
            "feedback_queries": feedback.stats.queries, "feedback_failures": feedback.stats.failures,
            **owners_summary,
            **result.feedback.summary,
            "wall_seconds": round(time.perf_counter() - started, 2),
            **sampled_decoding_summary(cfg),
        }
        summary["feedback_queries"] = feedback.stats.queries
        if result.feedback.selection is not None:
            summary["selection"] = result.feedback.selection.to_json()
        output.close(extra=summary, print_table=False)
        merged = json.loads((self.run_dir / "summary.json").read_text())
        merged.update(summary)
        (self.run_dir / "summary.json").write_text(json.dumps(merged, indent=2, sort_keys=True, default=str) + "\n")
        print(format_owners(summary, self.run_dir))
        return merged


def merged_domains(per_owner: dict[str, dict[str, Any]], when: str) -> dict[str, float]:
    """{domain: accuracy} over the owners measured `when` ("before" | "after"); an owner lost before
    the end has no "after", so its domains are missing there (as its accuracy is)."""
    merged: dict[str, float] = {}
    for entry in per_owner.values():
        merged.update(entry.get(f"target_domain_accuracy_{when}") or {})
    return dict(sorted(merged.items()))


@dataclass
class StepCallbackHook:
    """OwnerFeedbackHook plus a per-step callback (the lab's chaos seam)."""

    inner: OwnerFeedbackHook
    callback: Callable[[int], None]

    def after_step(self, step: int, record: dict[str, Any]) -> None:
        self.inner.after_step(step, record)
        self.callback(step)

    def finish(self, step: int) -> Any:
        return self.inner.finish(step)


@dataclass
class PerOwnerTestEvaluation:
    """Each live owner scores the live model on its own TEST split (exact, uncharged: a simulation
    owner serves it); the record has accuracy/<owner> and the mean over the owners that answered."""

    feedback: MultiOwnerFeedback
    decoding: Any
    """lab.evaluation.owner_test_decoding(config): a DecodingSettings."""
    domains: dict[str, dict[str, dict[str, float]]] = field(default_factory=dict)
    """label -> owner -> {domain: accuracy}: each owner's per-domain test accuracy (its public
    test_domains), kept out of the eval record, whose accuracy/<key> entries are per owner."""

    def evaluate(self, label: str) -> dict[str, Any] | None:
        from protocol.generated.target_feedback.v1 import target_feedback_pb2 as pb

        record: dict[str, Any] = {"name": "target_test"}
        for owner in self.feedback.owners:
            if not owner.live:
                continue
            try:
                checkpoint = owner.feedback.upload_current(label)
                result = owner.feedback.client.evaluate([checkpoint], self.decoding, split=pb.SPLIT_TEST).results[0]
            except FeedbackError as error:
                log.warning("owner %r did not measure %s: %s", owner.name, label, error)
                continue
            record[f"accuracy/{owner.name}"] = result.accuracy
            self.domains.setdefault(label, {})[owner.name] = dict(sorted(result.domain_accuracy.items()))
        measured = [v for k, v in record.items() if k.startswith("accuracy/")]
        if not measured:
            return None
        record["accuracy"] = sum(measured) / len(measured)
        return record


def format_owners(s: dict[str, Any], run_dir: Path) -> str:
    lines = ["", (f"simulate: {s['method']} with {s['num_owners']} owners over Flower ({s['aggregation']}), "
                  f"testbed {s['testbed']!r}, seed {s['seed']}, {s['steps']} steps")]
    for name, owner in s["owners"].items():
        before, after = owner.get("target_accuracy_before"), owner.get("target_accuracy_after")
        acc = " -> ".join("n/a" if value is None else f"{value:.3f}" for value in (before, after))
        lost = f"  LOST at step {owner['lost_step']}: {owner['lost_reason']}" if owner["lost_step"] is not None else ""
        lines.append(f"  {name} ({', '.join(owner['target_domains'])}): test accuracy {acc} "
                     f"({sampled_decoding_words(s)}measured by its owner process), epsilon "
                     f"{owner['epsilon_spent']:.3f}, {owner['queries']} queries{lost}")
    lines += [f"  wall time              {s['wall_seconds']:.1f} s",
              f"  run directory          {run_dir}  (metrics.jsonl, summary.json)"]
    return "\n".join(lines)


def run_federated_simulation(opts: SimulateOptions, federated: FederatedOptions) -> dict[str, Any]:
    return FederatedSimulation(opts, federated).run()
