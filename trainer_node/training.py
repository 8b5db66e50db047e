"""Assemble a GRPO run from a TrainConfig and drive it: the `train` subcommand's body.

`build_training` wires testbed -> source pool -> model -> engine -> policy -> trainer and is
reusable (the lab builds its simulated runs with it). `connect_feedback` hands the run an
owner's feedback. `run_training` drives the one run loop (trainer_node/loop.py) with the
source-slice evaluation and, when [feedback] names an owner, the owner's feedback hook.
`train` never touches target data: the testbed's feedback and test splits are not used here.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from rlvr_core.tasks.example import Example
from trainer_node.config import ConfigError, ModelConfig, TrainConfig
from trainer_node.evaluation import flatten_accuracy, local_accuracy
from trainer_node.grpo.checkpoint import latest_checkpoint, load_checkpoint
from trainer_node.grpo.trainer import GRPOTrainer, StepCallback
from trainer_node.loop import Schedule, run_loop
from trainer_node.policies.base import DataPolicy, FeedbackContext, SourcePool, build_policy, policy_class
from trainer_node.run_output import RunOutput

if TYPE_CHECKING:
    from trainer_node.feedback.context import OwnerClient, OwnerFeedback

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
    extend_pool: Callable[[Any], Sequence[Example]] | None = None,
) -> TrainingSetup:
    """`extend_pool(testbed_data)` returns examples to add to the RL pool (after the tiny
    policy's warm-up data is chosen): the lab's target-mix diagnostic, the one caller that may
    train on target data. `train` has none, so `data.train_on_feedback_split` is refused."""
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
    if config.data.train_on_feedback_split and extend_pool is None:
        raise ConfigError(_TARGET_MIX_REFUSED)
    if extend_pool is not None:
        pool_examples = pool_examples + tuple(extend_pool(data))
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


@dataclass
class SourceEvaluation:
    """`train`'s EvaluationHook (trainer_node/loop.py): the held-out source slice."""

    setup: TrainingSetup

    def evaluate(self, label: str) -> dict[str, Any] | None:
        accuracy = evaluate_source(self.setup)
        return None if accuracy is None else {"name": "source_eval", **accuracy}


_TARGET_MIX_REFUSED = (
    "data.train_on_feedback_split: a simulation-only diagnostic; `train` never reads target data. "
    "Use `trainer-node simulate --method target_mix`, or set it to false"
)


def check_trainable(config: TrainConfig) -> None:
    """Refuse what only the lab may run: it needs knowledge of the target a trainer lacks."""
    if config.data.train_on_feedback_split:
        raise ConfigError(_TARGET_MIX_REFUSED)
    if config.selection.every:
        raise ConfigError("selection.every: checkpoint selection by target feedback runs in `simulate` "
                          "(and `bench`); set it to 0 for `train`")
    if policy_class(config.policy.name).simulation_only:
        raise ConfigError(f"policy.name: {config.policy.name!r} is a simulation-only diagnostic (it needs what "
                          "only a simulation knows of the target); `train` cannot run it. Use "
                          f"`trainer-node simulate --method {config.policy.name}`, or choose another policy")


def run_training(config: TrainConfig, *, resume: Path | None = None, progress: bool = True) -> dict[str, Any]:
    """Train for config.run.steps steps (continuing a checkpoint when `resume` is given)."""
    from trainer_node.feedback.client import TargetFeedbackClient
    from trainer_node.feedback.hook import OwnerFeedbackHook

    check_trainable(config)
    setup = build_training(config)
    trainer = setup.trainer
    run_dir = Path(config.run.out_dir)
    feedback = hook = None
    if config.feedback is not None:
        feedback = connect_feedback(setup, TargetFeedbackClient(config.feedback.client_settings()), run_dir)
        hook = OwnerFeedbackHook(feedback, final_release=config.feedback.final_release)
    config.save_resolved(run_dir)
    if resume is not None:
        checkpoint = latest_checkpoint(resume)
        load_checkpoint(trainer, checkpoint)
        log.info("resumed from %s at step %d", checkpoint, trainer.step_index)
    output = RunOutput(run_dir, config.run.steps, start_step=trainer.step_index, progress=progress)
    schedule = Schedule(steps=config.run.steps, eval_every=config.run.eval_every,
                        save_every=config.run.save_every, checkpoint_dir=run_dir / "checkpoints")
    try:
        result = run_loop(trainer, output, schedule, SourceEvaluation(setup), hook)
    finally:
        if feedback is not None:
            feedback.client.close()
    extra = {"final_checkpoint": str(result.final_checkpoint), "model_dir": str(setup.model_dir),
             **result.feedback.summary}
    return output.close(extra=extra)


def connect_feedback(setup: TrainingSetup, client: OwnerClient, run_dir: Path) -> OwnerFeedback:
    """An OwnerFeedback over `client` (trainer_node/feedback/context.py's one wiring), handed to
    the policy when it learns from the target; `train` and the lab both call this.

    Decoding and pacing come from [feedback] when present (else greedy, one sample, every
    step), one release is kept back for checkpoint selection when [selection] is on. An
    unreachable owner is not fatal: training goes on with the policy's last state.
    """
    from trainer_node.feedback.context import FeedbackSettings, connect_owner_feedback

    cfg = setup.config
    fb = cfg.feedback
    settings = FeedbackSettings(
        total_steps=cfg.run.steps, max_new_tokens=cfg.rollout.max_new_tokens, seed=cfg.run.seed,
        reserve_queries=1 if cfg.selection.every else 0,
        **({"samples_per_prompt": fb.samples_per_prompt, "temperature": fb.temperature,
            "min_interval": fb.min_interval} if fb is not None else {}),
    )
    feedback = connect_owner_feedback(client, setup.trainer, settings, run_dir / "checkpoints_sent")
    if setup.policy.uses_target_feedback:
        setup.trainer.feedback = feedback
    else:
        log.info("policy %r does not learn from target feedback; its sampler ignores the owner", setup.policy.name)
    return feedback
