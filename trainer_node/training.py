"""Assemble a GRPO run from a TrainConfig and drive it: the `train` subcommand's body.

`build_training` wires testbed -> source pool -> model -> engine -> policy -> trainer and is
reusable (simulate/bench add a FeedbackContext via `feedback=`). `run_training` is the loop:
eval at start, steps with periodic eval/checkpoints, final eval + checkpoint, summary.
`train` never touches target data: the testbed's feedback and test splits are not used here.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rlvr_core.tasks.example import Example
from trainer_node.config import ConfigError, ModelConfig, TrainConfig
from trainer_node.evaluation import flatten_accuracy, local_accuracy
from trainer_node.grpo.checkpoint import checkpoint_name, latest_checkpoint, load_checkpoint, save_checkpoint
from trainer_node.grpo.trainer import GRPOTrainer, StepCallback
from trainer_node.policies.base import DataPolicy, FeedbackContext, SourcePool, build_policy
from trainer_node.run_output import RunOutput

log = logging.getLogger("trainer_node.training")

EVAL_SEED = 1234  # fixed so every eval of a run (and across runs) decodes the same way


@dataclass
class TrainingSetup:
    config: TrainConfig
    testbed: Any                 # rlvr_core TestbedSpec
    data: Any                    # rlvr_core TestbedData (source, feedback, test)
    template: str
    pool: SourcePool
    eval_examples: tuple[Example, ...]
    model_dir: Path
    model: torch.nn.Module
    tokenizer: Any
    engine: Any
    policy: DataPolicy
    trainer: GRPOTrainer


def split_source(source: tuple[Example, ...], eval_size: int, seed: int) -> tuple[tuple[Example, ...], tuple[Example, ...]]:
    """(pool, held-out eval slice); the slice depends on the testbed seed only, not the run seed."""
    if eval_size >= len(source):
        raise ConfigError(f"data.eval_size ({eval_size}) must be smaller than the source split ({len(source)})")
    order = np.random.default_rng(seed).permutation(len(source))
    held = set(order[:eval_size].tolist())
    pool = tuple(e for i, e in enumerate(source) if i not in held)
    evals = tuple(source[i] for i in sorted(held))
    return pool, evals


def tiny_policy_inputs(examples: tuple[Example, ...], template: str) -> tuple[list[str], list[tuple[str, str]]]:
    """Tokenizer texts (prompts + answers) and SFT pairs (rendered prompt -> ' answer')."""
    from rlvr_core.tasks.prompting import render_prompt

    texts = [e.prompt for e in examples] + [e.answer for e in examples]
    pairs = [(render_prompt(e.prompt, template), " " + e.answer) for e in examples]
    return texts, pairs


def resolve_model_dir(model: ModelConfig, train_examples: tuple[Example, ...], template: str) -> Path:
    """A local model directory: the configured path, or the (cached) tiny policy."""
    if model.path is not None:
        if not Path(model.path).is_dir():
            raise ConfigError(f"model.path: {model.path} is not a directory; point it at a local model dir")
        return Path(model.path)
    from rlvr_core.models.tiny_policy import build_tiny_policy

    texts, pairs = tiny_policy_inputs(train_examples, template)
    return Path(build_tiny_policy(model.tiny_spec, texts, pairs, model.cache_dir))  # typed at config load


def build_training(
    config: TrainConfig,
    *,
    feedback: FeedbackContext | None = None,
    on_step_end: StepCallback | None = None,
    reward_fn: Callable[[str, Example], float] | None = None,
) -> TrainingSetup:
    from rlvr_core.engines.base import SamplingParams
    from rlvr_core.engines.registry import build_engine
    from rlvr_core.models.loading import load_policy
    from rlvr_core.tasks.prompting import render_prompt
    from rlvr_core.tasks.testbed import build_testbed_data, cluster_of, load_testbed

    torch.manual_seed(config.run.seed)
    if config.run.device == "cpu":
        # A tiny model on a shared CPU: one thread beats spinning OpenMP threads, especially
        # beside a local owner process (rlvr_core/models/threads.py).
        torch.set_num_threads(1)
    try:
        testbed = load_testbed(config.data.testbed)
    except ValueError as error:  # TestbedError names the file and field
        raise ConfigError(f"data.testbed: {error}") from None
    data = build_testbed_data(testbed)
    template = testbed.prompt_template
    pool_examples, eval_examples = split_source(tuple(data.source), config.data.eval_size, int(testbed.seed))
    # The tiny policy's warm-up: the testbed's warm-up split when it has one, else the RL pool.
    model_dir = resolve_model_dir(config.model, data.warmup or pool_examples, template)
    if config.data.train_on_feedback_split:  # the target-mix diagnostic (simulate only)
        pool_examples = pool_examples + tuple(data.feedback)
    pool = SourcePool(examples=pool_examples, clusters=tuple(cluster_of(e) for e in pool_examples))

    dtype = getattr(torch, config.model.dtype)
    model, tokenizer = load_policy(model_dir, config.run.device, dtype)
    engine = build_engine(config.rollout.engine, model, tokenizer, device=config.run.device,
                          **config.rollout.engine_kwargs())
    try:
        # The options were typed at config load; only what needs the pool can still fail here.
        policy = build_policy(config.policy, pool, np.random.default_rng(config.run.seed))
    except ValueError as error:  # what only the pool can tell, e.g. oracle weights naming unknown domains
        raise ConfigError(f"policy: {error}") from None
    if reward_fn is None:
        from rlvr_core.verifiers import score_example as reward_fn
    trainer = GRPOTrainer(
        model=model,
        tokenizer=tokenizer,
        engine=engine,
        policy=policy,
        pool=pool,
        render=lambda example: render_prompt(example.prompt, template),
        reward_fn=reward_fn,
        settings=config.grpo,
        sampling=SamplingParams(max_new_tokens=config.rollout.max_new_tokens,
                                temperature=config.rollout.temperature, top_p=config.rollout.top_p,
                                seed=config.run.seed),
        device=config.run.device,
        feedback=feedback,
        on_step_end=on_step_end,
    )
    return TrainingSetup(config, testbed, data, template, pool, eval_examples, model_dir, model, tokenizer,
                         engine, policy, trainer)


def evaluate_source(setup: TrainingSetup) -> dict[str, float] | None:
    """Greedy accuracy on the held-out source slice (None when data.eval_size = 0)."""
    if not setup.eval_examples:
        return None
    result = local_accuracy(
        setup.engine, setup.eval_examples, setup.template, setup.config.rollout.max_new_tokens, seed=EVAL_SEED
    )
    return flatten_accuracy(result)


def run_training(config: TrainConfig, *, resume: Path | None = None, progress: bool = True) -> dict[str, Any]:
    """Train for config.run.steps steps (continuing a checkpoint when `resume` is given)."""
    if config.data.train_on_feedback_split:
        raise ConfigError("data.train_on_feedback_split: a simulation-only diagnostic; `train` never reads "
                          "target data. Use `trainer-node simulate --method target_mix`, or set it to false")
    if config.selection.every:
        raise ConfigError("selection.every: checkpoint selection by target feedback runs in `simulate` "
                          "(and `bench`); set it to 0 for `train`")
    setup = build_training(config)
    trainer = setup.trainer
    run_dir = Path(config.run.out_dir)
    feedback = connect_feedback(setup, run_dir) if config.feedback is not None else None
    config.save_resolved(run_dir)
    if resume is not None:
        checkpoint = latest_checkpoint(resume)
        load_checkpoint(trainer, checkpoint)
        log.info("resumed from %s at step %d", checkpoint, trainer.step_index)
    steps = config.run.steps
    output = RunOutput(run_dir, steps, start_step=trainer.step_index, progress=progress)

    def log_eval() -> None:
        accuracy = evaluate_source(setup)
        if accuracy is not None:
            output.log_eval({"name": "source_eval", "step": trainer.step_index,
                             "rollouts_cumulative": trainer.rollouts_cumulative, **accuracy})

    if trainer.step_index == 0:
        log_eval()
    while trainer.step_index < steps:
        output.log_step(trainer.train_step())
        done = trainer.step_index
        if done < steps and config.run.eval_every and done % config.run.eval_every == 0:
            log_eval()
        if done < steps and config.run.save_every and done % config.run.save_every == 0:
            save_checkpoint(trainer, run_dir / "checkpoints" / checkpoint_name(done))
    log_eval()
    final = save_checkpoint(trainer, run_dir / "checkpoints" / checkpoint_name(trainer.step_index))
    extra = {"final_checkpoint": str(final), "model_dir": str(setup.model_dir)}
    if feedback is not None:
        if config.feedback.final_release:
            final_target = feedback.release_current(trainer.step_index)
            if final_target is not None:
                output.log_eval({"name": "target_feedback", "step": trainer.step_index,
                                 "rollouts_cumulative": trainer.rollouts_cumulative, "accuracy": final_target})
                extra["target_feedback_accuracy"] = final_target
        extra.update(feedback_queries=feedback.stats.queries, feedback_failures=feedback.stats.failures,
                     epsilon_spent=feedback.stats.epsilon_spent)
        feedback.client.close()
    return output.close(extra=extra)


def connect_feedback(setup: TrainingSetup, run_dir: Path):
    """Connect to the configured target owner and hand the policy an OwnerFeedback context.

    Policies that do not learn from the target ignore it. An unreachable owner is not fatal:
    training goes on with the policy's last state, and the log says so.
    """
    from protocol.generated.target_feedback.v1 import target_feedback_pb2 as pb
    from trainer_node.feedback.client import FeedbackError, TargetFeedbackClient
    from trainer_node.feedback.context import OwnerFeedback
    from trainer_node.feedback.pacing import BudgetPacer

    cfg = setup.config
    fb = cfg.feedback
    client = TargetFeedbackClient(fb.client_settings())
    try:
        dp_enabled = client.info().privacy.enabled
    except FeedbackError as error:
        log.warning("target owner not reachable at start (%s); training goes on and retries later", error)
        dp_enabled = True
    feedback = OwnerFeedback(
        client,
        setup.trainer,
        BudgetPacer(total_steps=cfg.run.steps, min_interval=fb.min_interval, dp_enabled=dp_enabled),
        pb.DecodingSettings(max_new_tokens=cfg.rollout.max_new_tokens, samples_per_prompt=fb.samples_per_prompt,
                            temperature=fb.temperature, seed=cfg.run.seed),
        run_dir / "checkpoints_sent",
    )
    if setup.policy.uses_target_feedback:
        setup.trainer.feedback = feedback
    else:
        log.info("policy %r does not use target feedback; the owner is not queried", setup.policy.name)
    return feedback
