"""`trainer-node simulate`: the whole two-party system on one machine.

1. build (or load from cache) the tiny policy from SOURCE data only;
2. `target-owner-node init` writes an owner setup (config, fresh mTLS PKI, the testbed's
   target splits); `target-owner-node serve` runs as a separate process on a free loopback
   port. Only that process reads the target data;
3. GRPO trains with the chosen data policy (L2RR by default). Policies that learn from the
   target get an OwnerFeedback context: lookahead candidates are uploaded and evaluated by
   the owner in one DP release per query, paced so the budget lasts the run;
4. the owner measures target TEST accuracy before and after (an owner-enabled split that
   is never used for learning), and the run directory gets metrics, plots and summary.json.
"""

from __future__ import annotations

import json
import logging
import shutil
import time
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from protocol.generated.target_feedback.v1 import target_feedback_pb2 as pb
from trainer_node.config import TrainConfig, load_config
from trainer_node.feedback.client import TargetFeedbackClient
from trainer_node.feedback.context import OwnerFeedback
from trainer_node.feedback.pacing import BudgetPacer
from trainer_node.feedback.selection import CheckpointSelector
from trainer_node.owner_process import OwnerProcess, OwnerProcessError, init_owner
from trainer_node.run_output import RunOutput

log = logging.getLogger("trainer_node.simulate")

SUMMARY_KEYS = (
    "method", "testbed", "seed", "steps", "target_accuracy_before", "target_accuracy_after",
    "rollouts", "epsilon_spent", "epsilon_budget", "wall_seconds",
)
TEST_SEED = 20261130  # one decoding seed for every test-split evaluation


@dataclass(frozen=True)
class SimulateOptions:
    method: str | None = None          # a registered data policy; default from the config (l2rr)
    testbed: str | None = None
    seed: int | None = None
    steps: int | None = None
    out: Path | None = None
    no_dp: bool = False
    config: Path | None = None         # a TOML overriding the embedded defaults
    # The owner's privacy settings. With ~270 held-out rows, q = 0.5 and 150 planned
    # single-candidate releases at epsilon 8, each released accuracy has noise std ~0.03.
    epsilon: float = 8.0
    sample_rate: float = 0.5
    planned_releases: int = 150
    progress: bool = True


def default_config_path() -> Path:
    return Path(str(resources.files("trainer_node") / "configs" / "simulate_default.toml"))


# Diagnostics that exist only in simulation, where the trainer could see the target set.
TARGET_MIX = "target_mix"  # uniform GRPO on source + the owner's feedback split


def resolve_config(opts: SimulateOptions) -> TrainConfig:
    overrides: dict[str, Any] = {}
    if opts.method == TARGET_MIX:
        overrides["policy.name"] = "uniform"
        overrides["data.train_on_feedback_split"] = True
    elif opts.method is not None:
        overrides["policy.name"] = opts.method
    if opts.testbed is not None:
        overrides["data.testbed"] = opts.testbed
    if opts.seed is not None:
        overrides["run.seed"] = opts.seed
    if opts.steps is not None:
        overrides["run.steps"] = opts.steps
    if opts.out is not None:
        overrides["run.out_dir"] = str(opts.out)
    config = load_config(opts.config or default_config_path(), overrides)
    if config.policy.name == "oracle" and "domain_weights" not in config.policy.options:
        config = _with_oracle_weights(config)
    return config


def _with_oracle_weights(config: TrainConfig) -> TrainConfig:
    """The oracle diagnostic samples source domains in the target's composition, which only
    a simulation knows (from the testbed file)."""
    from trainer_node.policies.oracle import target_domain_weights

    weights = target_domain_weights(config.data.testbed)
    policy = config.policy.model_copy(update={"options": {**config.policy.options, "domain_weights": weights}})
    return config.model_copy(update={"policy": policy})


class Simulation:
    """One simulated run; `run()` returns the summary dict (also written to summary.json)."""

    def __init__(self, opts: SimulateOptions):
        self.opts = opts
        self.config = resolve_config(opts)
        self.run_dir = Path(self.config.run.out_dir)

    def run(self) -> dict[str, Any]:
        from trainer_node.training import build_training

        started = time.perf_counter()
        cfg = self.config
        self.run_dir.mkdir(parents=True, exist_ok=True)
        owner_dir = self.run_dir / "owner"
        if owner_dir.exists():
            shutil.rmtree(owner_dir)  # fresh certificates and a fresh budget for every run
        setup = build_training(cfg)  # builds or loads the tiny policy (source data only)
        extra = [
            "--epsilon", str(self.opts.epsilon), "--sample-rate", str(self.opts.sample_rate),
            "--planned-releases", str(self.opts.planned_releases),
            "--max-prompt-tokens", str(prompt_width(setup.tokenizer, setup.data, setup.template)),
        ]
        init_owner(owner_dir, cfg.data.testbed, dp=not self.opts.no_dp, extra_args=extra, test_split=True)

        trainer = setup.trainer
        select = cfg.selection.every > 0
        with OwnerProcess(owner_dir) as owner, TargetFeedbackClient(owner.client_settings()) as client:
            info = client.info()
            feedback = OwnerFeedback(
                client,
                trainer,
                BudgetPacer(total_steps=cfg.run.steps, dp_enabled=info.privacy.enabled,
                            reserve_queries=1 if select else 0),
                pb.DecodingSettings(
                    max_new_tokens=cfg.rollout.max_new_tokens, samples_per_prompt=1, temperature=0.0,
                    seed=cfg.run.seed,
                ),
                self.run_dir / "checkpoints_sent",
            )
            if setup.policy.uses_target_feedback:
                trainer.feedback = feedback
            selector = (CheckpointSelector(feedback, cfg.selection.every, cfg.selection.max_candidates, cfg.run.steps)
                        if select else None)
            cfg.save_resolved(self.run_dir)
            output = RunOutput(self.run_dir, cfg.run.steps, progress=self.opts.progress)

            def test_eval(label: str, checkpoint_id: str | None = None, name: str = "target_test") -> dict[str, Any]:
                owner.check_alive()
                checkpoint_id = checkpoint_id or feedback.upload_current(label)
                decoding = pb.DecodingSettings(
                    max_new_tokens=cfg.rollout.max_new_tokens, samples_per_prompt=1, temperature=0.0, seed=TEST_SEED
                )
                result = client.evaluate([checkpoint_id], decoding, split=pb.SPLIT_TEST).results[0]
                record = {
                    "name": name, "step": trainer.step_index,
                    "rollouts_cumulative": trainer.rollouts_cumulative, "accuracy": result.accuracy,
                    **{f"accuracy/{d}": a for d, a in sorted(result.domain_accuracy.items())},
                }
                output.log_eval(record)
                return record

            before = test_eval("initial")
            while trainer.step_index < cfg.run.steps:
                record = trainer.train_step()
                owner.check_alive()
                record.update(
                    feedback_queries=feedback.stats.queries,
                    feedback_failures=feedback.stats.failures,
                    epsilon_spent=feedback.stats.epsilon_spent,
                )
                output.log_step(record)
                done = trainer.step_index
                if selector is not None:
                    selector.after_step(done)
                if cfg.run.eval_every and done < cfg.run.steps and done % cfg.run.eval_every == 0:
                    test_eval(f"step{done}")
            after = test_eval("final")
            selection = selected_test = None
            if selector is not None:
                selection = selector.select()
                if selection is not None:
                    selected_test = test_eval("selected", selection.chosen.checkpoint_id, "target_test_selected")
            budget = client.budget()

        summary = {
            "method": cfg.policy.name,
            "testbed": cfg.data.testbed,
            "seed": cfg.run.seed,
            "steps": trainer.step_index,
            "target_accuracy_before": before["accuracy"],
            "target_accuracy_after": after["accuracy"],
            "target_domain_accuracy_before": {k.split("/", 1)[1]: v for k, v in before.items() if k.startswith("accuracy/")},
            "target_domain_accuracy_after": {k.split("/", 1)[1]: v for k, v in after.items() if k.startswith("accuracy/")},
            "rollouts": trainer.rollouts_cumulative,
            "epsilon_spent": budget.epsilon_spent,
            "epsilon_budget": budget.epsilon_budget if budget.dp_enabled else 0.0,
            "dp_enabled": budget.dp_enabled,
            "feedback_queries": feedback.stats.queries,
            "feedback_failures": feedback.stats.failures,
            "releases": budget.releases_made,
            "wall_seconds": round(time.perf_counter() - started, 2),
        }
        if cfg.data.train_on_feedback_split:
            summary["diagnostic"] = TARGET_MIX
        if selection is not None:
            summary["selection"] = selection.to_json()
            summary["target_accuracy_selected"] = selected_test["accuracy"]
            summary["target_domain_accuracy_selected"] = {
                k.split("/", 1)[1]: v for k, v in selected_test.items() if k.startswith("accuracy/")}
        output.close(extra=summary, print_table=False)
        # RunOutput's summary.json has the training statistics; ours adds the run-level keys.
        merged = json.loads((self.run_dir / "summary.json").read_text())
        merged.update(summary)
        (self.run_dir / "summary.json").write_text(json.dumps(merged, indent=2, sort_keys=True) + "\n")
        print(format_summary(summary, self.run_dir))
        return merged


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
        f"simulate: {s['method']} on testbed {s['testbed']!r}, seed {s['seed']}, {s['steps']} steps",
        (f"  target test accuracy   {s['target_accuracy_before']:.3f} -> {s['target_accuracy_after']:.3f}"
         f"  ({delta:+.3f}, measured by the owner process)"),
        f"  rollouts spent         {s['rollouts']}",
    ]
    if "selection" in s:
        sel = s["selection"]
        lines.append(f"  selected checkpoint    step {sel['selected_step']} of {sel['candidate_steps']} by target "
                     f"feedback; its test accuracy {s['target_accuracy_selected']:.3f}")
    lines += [
        f"  feedback queries       {s['feedback_queries']} ({s['feedback_failures']} failed)",
        f"  epsilon spent          {eps}",
        f"  wall time              {s['wall_seconds']:.1f} s",
        f"  run directory          {run_dir}  (metrics.jsonl, summary.json, *.png)",
    ]
    return "\n".join(lines)


def run_simulation(opts: SimulateOptions) -> dict[str, Any]:
    return Simulation(opts).run()


__all__ = ["SUMMARY_KEYS", "OwnerProcessError", "SimulateOptions", "run_simulation"]
