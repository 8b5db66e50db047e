"""`trainer-node simulate`: the whole two-party system on one machine.

1. build (or load from cache) the tiny policy from SOURCE data only;
2. the owner's own init writes an owner setup (config, fresh mTLS PKI, the testbed's
   target splits); `target-owner-node serve` runs as a separate process on a free loopback
   port. Only that process reads the target data;
3. GRPO trains with the chosen data policy (L2RR by default). Policies that learn from the
   target get an OwnerFeedback context: lookahead candidates are uploaded and evaluated by
   the owner in one DP release per query, paced so the budget lasts the run;
4. the owner measures target TEST accuracy before and after (an owner-enabled split that
   is never used for learning), and the run directory gets metrics, plots and summary.json.

Steps 3-4 are the trainer's one run loop (trainer_node/loop.py) with the lab's hooks.
"""

from __future__ import annotations

import json
import logging
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lab.base_rates import base_rates, uncommon_accuracy
from lab.configs import simulate_defaults_path
from lab.evaluation import (
    OwnerTestEvaluation,
    domain_accuracy,
    owner_test_decoding,
    sampled_decoding_summary,
    sampled_decoding_words,
)
from lab.owner_process import OwnerProcess, OwnerProcessError, init_owner, query_batch_size
from lab.policies import fill_simulation_options
from rlvr_core.configuration import load_toml
from rlvr_core.models.tiny_policy import checkpoint_digest
from trainer_node.config import TrainConfig, parse_config, with_overrides
from trainer_node.feedback.client import TargetFeedbackClient
from trainer_node.feedback.hook import OwnerFeedbackHook
from trainer_node.feedback.selection import CheckpointSelector
from trainer_node.integrations.support import TRAINING_ENGINES
from trainer_node.loop import Schedule
from trainer_node.run_output import RunOutput
from trainer_node.training import build_training, connect_feedback

log = logging.getLogger("lab.simulate")

SUMMARY_KEYS = (
    "method", "testbed", "seed", "steps", "target_accuracy_before", "target_accuracy_after",
    "rollouts", "epsilon_spent", "epsilon_budget", "wall_seconds",
)

# The simulated owner's privacy settings (a real owner's defaults are target_owner_node.config's
# PrivacyConfig: epsilon 4, q 0.1, 500 releases). With ~270 held-out rows, q = 0.5 and 150
# planned single-candidate releases at epsilon 8, each released accuracy has noise std ~0.03.
SIMULATION_EPSILON = 8.0
SIMULATION_SAMPLE_RATE = 0.5
SIMULATION_PLANNED_RELEASES = 150


@dataclass(frozen=True)
class SimulateOptions:
    method: str | None = None          # a registered data policy; default from the config (l2rr)
    testbed: str | None = None
    seed: int | None = None
    steps: int | None = None
    out: Path | None = None
    no_dp: bool = False
    config: Path | None = None         # a TOML overriding the embedded defaults
    epsilon: float = SIMULATION_EPSILON  # the owner's privacy settings (see above)
    sample_rate: float = SIMULATION_SAMPLE_RATE
    planned_releases: int = SIMULATION_PLANNED_RELEASES
    progress: bool = True


def default_config_path() -> Path:
    return simulate_defaults_path()


# Diagnostics that exist only in simulation, where the trainer could see the target set.
TARGET_MIX = "target_mix"  # uniform GRPO on source + the owner's feedback split


def target_mix_pool(data: Any) -> tuple[Any, ...]:
    """What target_mix adds to the RL pool: the owner's feedback split (never the test split)."""
    return tuple(data.feedback)


def method_overrides(method: str) -> dict[str, Any]:
    """What `--method NAME` sets: a registered data policy, or a registered update-seam rule
    (DataFlex-RL's selection and reweighting configurations) on uniform sampling. Resolved
    through the registries, so a plug-in policy or rule works the same way."""
    from trainer_node.grpo.update_seam import SEAMS
    from trainer_node.policies.base import POLICIES
    from trainer_node.policies.options import DEFAULT_POLICY

    if method in POLICIES:
        return {"policy.name": method}
    for seam, registry in SEAMS.items():
        if method in registry:
            return {"policy.name": DEFAULT_POLICY, f"grpo.{seam}": {"name": method}}
    raise ValueError(f"--method {method!r} is neither a data policy nor an update rule")


def method_names() -> list[str]:
    """Every name `--method` accepts: data policies, update-seam rules, the target-mix diagnostic."""
    from trainer_node.grpo.update_seam import SEAMS
    from trainer_node.policies.base import policy_names

    return [*policy_names(), *(name for registry in SEAMS.values() for name in registry.names()), TARGET_MIX]


def resolve_config(opts: SimulateOptions) -> TrainConfig:
    """The run's config: the TOML (embedded defaults unless --config), the command's flags,
    then the options only a simulation knows (lab/policies: the oracle's target composition)."""
    overrides: dict[str, Any] = {}
    if opts.method == TARGET_MIX:
        overrides["policy.name"] = "uniform"
        overrides["data.train_on_feedback_split"] = True
    elif opts.method is not None:
        overrides.update(method_overrides(opts.method))
    if opts.testbed is not None:
        overrides["data.testbed"] = opts.testbed
    if opts.seed is not None:
        overrides["run.seed"] = opts.seed
    if opts.steps is not None:
        overrides["run.steps"] = opts.steps
    if opts.out is not None:
        overrides["run.out_dir"] = str(opts.out)
    path = Path(opts.config or default_config_path())
    raw = with_overrides(load_toml(path), overrides)
    return parse_config(fill_simulation_options(raw), source=str(path), base_dir=path.resolve().parent)


class Simulation:
    """One simulated run; `run()` returns the summary dict (also written to summary.json)."""

    def __init__(self, opts: SimulateOptions):
        self.opts = opts
        self.config = resolve_config(opts)
        self.run_dir = Path(self.config.run.out_dir)

    def run(self) -> dict[str, Any]:
        started = time.perf_counter()
        cfg, opts = self.config, self.opts
        self.run_dir.mkdir(parents=True, exist_ok=True)
        owner_dir = self.run_dir / "owner"
        if owner_dir.exists():
            shutil.rmtree(owner_dir)  # fresh certificates and a fresh budget for every run
        # builds or loads the tiny policy (source data only)
        setup = build_training(cfg, extend_pool=target_mix_pool if cfg.data.train_on_feedback_split else None)
        init_owner(owner_dir, cfg.data.testbed, dp=not opts.no_dp, test_split=True, epsilon=opts.epsilon,
                   sample_rate=opts.sample_rate, planned_releases=opts.planned_releases,
                   max_prompt_tokens=prompt_width(setup.tokenizer, setup.data, setup.template),
                   batch_size=query_batch_size(len(setup.data.feedback), opts.sample_rate, not opts.no_dp),
                   feedback_verifier=cfg.simulated_owner.feedback_verifier,
                   dtype=None if cfg.simulated_owner.dtype == "auto" else cfg.simulated_owner.dtype)

        trainer = setup.trainer
        with (OwnerProcess(owner_dir, **cfg.simulated_owner.process_options(cfg.run.seed)) as owner,
              TargetFeedbackClient(owner.client_settings()) as client):
            feedback = connect_feedback(setup, client, self.run_dir)
            selector = (CheckpointSelector(feedback, cfg.selection.every, cfg.selection.max_candidates, cfg.run.steps)
                        if cfg.selection.every else None)
            hook = OwnerFeedbackHook(feedback, selector=selector, health_check=owner.check_alive)
            evaluation = OwnerTestEvaluation(client, feedback, owner_test_decoding(cfg), owner.check_alive)
            cfg.save_resolved(self.run_dir)
            uncommon = self._uncommon(setup)
            output = RunOutput(self.run_dir, cfg.run.steps, progress=opts.progress)
            # No checkpoints: a simulated run is measured, not resumed.
            engine = TRAINING_ENGINES.get(cfg.engine.name)()  # the project's own loop, or TRL's (integrations/)
            result = engine.run(setup, output, Schedule(steps=cfg.run.steps, eval_every=cfg.run.eval_every),
                                evaluation, hook, feedback)
            selection, selected_test = result.feedback.selection, None
            if selection is not None:
                selected_test = evaluation.evaluate_checkpoint(selection.chosen.checkpoint_id, "target_test_selected")
                output.log_eval({"step": trainer.step_index, "rollouts_cumulative": trainer.rollouts_cumulative,
                                 **selected_test})
            budget = client.budget()
        uncommon_after = self._uncommon(setup)

        before, after = result.initial, result.final
        summary = {
            "method": cfg.policy.name,
            "testbed": cfg.data.testbed,
            "seed": cfg.run.seed,
            "steps": trainer.step_index,
            "target_accuracy_before": before["accuracy"],
            "target_accuracy_after": after["accuracy"],
            "target_domain_accuracy_before": domain_accuracy(before),
            "target_domain_accuracy_after": domain_accuracy(after),
            "rollouts": trainer.rollouts_cumulative,
            "epsilon_spent": budget.epsilon_spent,
            "epsilon_budget": budget.epsilon_budget if budget.dp_enabled else 0.0,
            "dp_enabled": budget.dp_enabled,
            "feedback_queries": feedback.stats.queries,
            "feedback_failures": feedback.stats.failures,
            "feedback_candidates": feedback.stats.candidates_evaluated,
            "feedback_uploaded_bytes": feedback.stats.uploaded_bytes,  # what the owner did not hold yet
            "releases": budget.releases_made,
            **feedback.stats.background_summary(),  # what the asynchronous queries' thread did
            "initial_checkpoint_sha256": checkpoint_digest(setup.model_dir),  # runs pair only from one start
            # Is the gain in the skill or in the answer base rate? (lab/base_rates.py)
            "base_rates": base_rates(setup.data.test),
            "target_accuracy_uncommon_before": uncommon,
            "target_accuracy_uncommon_after": uncommon_after,
            "wall_seconds": round(time.perf_counter() - started, 2),
        }
        if cfg.data.train_on_feedback_split:
            summary["diagnostic"] = TARGET_MIX
        summary.update(sampled_decoding_summary(cfg))
        if cfg.simulated_owner.feedback_verifier is not None:  # the owner's test split stays exact
            summary["owner_feedback_verifier"] = cfg.simulated_owner.feedback_verifier
        rules = {seam: getattr(cfg.grpo, seam).name for seam in ("coefficients", "selection", "reweighting")
                 if getattr(cfg.grpo, seam) is not None}
        if rules:
            summary["update_rules"] = rules
        if selection is not None:
            summary["selection"] = selection.to_json()
            summary["target_accuracy_selected"] = selected_test["accuracy"]
            summary["target_domain_accuracy_selected"] = domain_accuracy(selected_test)
        output.close(extra=summary, print_table=False)
        # RunOutput's summary.json has the training statistics; ours adds the run-level keys.
        merged = json.loads((self.run_dir / "summary.json").read_text())
        merged.update(summary)
        (self.run_dir / "summary.json").write_text(json.dumps(merged, indent=2, sort_keys=True) + "\n")
        print(format_summary(merged, self.run_dir))
        return merged


    def _uncommon(self, setup: Any) -> float:
        return uncommon_accuracy(setup.engine, setup.data.test, setup.template, self.config.rollout.max_new_tokens)


def prompt_width(tokenizer: Any, data: Any, template: str, multiple: int = 16) -> int:
    """The owner's public prompt width for a simulation: the longest target prompt in the
    trainer's tokens, rounded up. Only a simulation, which generates the target testbed
    itself, can measure it; a real owner sets `evaluation.max_prompt_tokens` from its task card."""
    from rlvr_core.tasks.prompting import render_prompt

    prompts = [render_prompt(e.prompt, template) for e in (*data.feedback, *data.test)]
    longest = max(len(ids) for ids in tokenizer(prompts, add_special_tokens=False)["input_ids"])
    return -(-longest // multiple) * multiple


def format_summary(s: dict[str, Any], run_dir: Path) -> str:
    delta = s["target_accuracy_after"] - s["target_accuracy_before"]
    eps = (f"{s['epsilon_spent']:.3f} of {s['epsilon_budget']:.3f}" if s["dp_enabled"] else "DP off (exact releases)")
    lines = [
        "",
        (f"simulate: {s['method']}"
         + "".join(f" + {seam} {name}" for seam, name in s.get("update_rules", {}).items())
         + f" on testbed {s['testbed']!r}, seed {s['seed']}, {s['steps']} steps"),
        (f"  target test accuracy   {s['target_accuracy_before']:.3f} -> {s['target_accuracy_after']:.3f}"
         f"  ({delta:+.3f}, {sampled_decoding_words(s)}measured by the owner process)"),
        f"  rollouts spent         {s['rollouts']}",
    ]
    if "base_rates" in s:
        lines.append(f"  answer base rate       {s['base_rates']['commonest_answer_accuracy']:.3f} (always the commonest "
                     f"answer); on the other answers {s['target_accuracy_uncommon_before']:.3f} -> "
                     f"{s['target_accuracy_uncommon_after']:.3f} (local)")
    if "owner_feedback_verifier" in s:
        lines.append(f"  owner feedback grader  {s['owner_feedback_verifier']} (the test split: exact)")
    if "selection" in s:
        sel = s["selection"]
        lines.append(f"  selected checkpoint    step {sel['selected_step']} of {sel['candidate_steps']} by target "
                     f"feedback; its test accuracy {s['target_accuracy_selected']:.3f}")
    lines += [
        f"  feedback queries       {s['feedback_queries']} ({s['feedback_failures']} failed)",
        f"  epsilon spent          {eps}",
        f"  wall time              {s['wall_seconds']:.1f} s",
    ]
    if s.get("time/loop_s"):
        lines.append(f"  training loop          {loop_split(s)}")
    lines.append(f"  run directory          {run_dir}  (metrics.jsonl, summary.json, *.png)")
    return "\n".join(lines)


def loop_split(s: dict[str, Any]) -> str:
    """Where the training loop's time went (summary.json time/*, cpu/*), as one line."""
    loop = s["time/loop_s"]
    shares = ", ".join(f"{name} {s.get(f'time/{name}_s', 0.0) / loop:.0%}" for name in ("generation", "update"))
    text = f"{loop:.1f} s: {shares}, feedback phases {s['time/feedback_share']:.1%}"
    if s.get("cpu/loop_s") is not None:
        text += f"; training thread on CPU {s['cpu/loop_s'] / loop:.0%} (time_per_phase.png)"
    return text


def run_simulation(opts: SimulateOptions) -> dict[str, Any]:
    return Simulation(opts).run()


__all__ = ["SUMMARY_KEYS", "OwnerProcessError", "SimulateOptions", "run_simulation"]
