"""Assemble a GRPO run from a TrainConfig and drive it: the `train` subcommand's body.

`build_training` wires source data -> model -> rendering -> engine -> policy -> trainer and is
reusable (the lab builds its simulated runs with it). The source data is a testbed or the
trainer's own prompt set ([data.prompts]); the model is the tiny policy or the trainer's own
folder, loaded with the looser own-folder rule (rlvr_core/models/model_folder.py).

`run_training` is `train`: with a [feedback] section it first checks the owner (files, TLS,
GetInfo, GetBudget: trainer_node/feedback/preflight.py) and stops at once, with the setting to
fix, when the owner is misconfigured, refuses this trainer or, with `feedback.required`
(the default), cannot be reached; then it renders prompts as the owner publishes (so both
parties score the same text), checks that the owner would accept this model's checkpoints,
and drives the one run loop (trainer_node/loop.py) with the owner's feedback hook. Without
[feedback] no owner is contacted and progress is measured on a held-out slice of the source.
`train` never touches target data.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from rlvr_core.tasks.example import Example
from rlvr_core.tasks.rendering import Rendering, RenderingError
from trainer_node.config import ConfigError, DataConfig, FeedbackConfig, ModelConfig, TrainConfig
from trainer_node.evaluation import flatten_accuracy, local_accuracy
from trainer_node.grpo.checkpoint import latest_checkpoint, load_checkpoint
from trainer_node.grpo.trainer import GRPOTrainer, StepCallback
from trainer_node.integrations.support import TRAINING_ENGINES
from trainer_node.loop import Schedule
from trainer_node.policies.base import DataPolicy, FeedbackContext, SourcePool, build_policy, policy_class
from trainer_node.run_output import RunOutput

if TYPE_CHECKING:
    from trainer_node.feedback.context import OwnerClient, OwnerFeedback
    from trainer_node.feedback.preflight import OwnerStatus

log = logging.getLogger("trainer_node.training")

EVAL_SEED = 1234  # fixed so every eval of a run (and across runs) decodes the same way


@dataclass
class TrainingSetup:
    config: TrainConfig
    testbed: Any                 # rlvr_core TestbedSpec, or None with [data.prompts]
    data: Any                    # rlvr_core TestbedData (source, feedback, test); only source with [data.prompts]
    template: str                # the plain prompt template (the lab's owner renders with it)
    pool: SourcePool
    eval_examples: tuple[Example, ...]
    model_dir: Path
    model: torch.nn.Module
    tokenizer: Any
    engine: Any
    policy: DataPolicy
    trainer: GRPOTrainer
    rendering: Rendering | None = None  # how prompts become model input (rlvr_core.tasks.rendering)


@dataclass(frozen=True)
class SourceData:
    """The trainer's source: a testbed's build, or its own prompt set, and each example's cluster."""

    testbed: Any
    data: Any
    template: str
    clusters: Mapping[str, str]  # example id -> cluster (own prompts); testbeds use cluster_of

    def cluster(self, example: Example) -> str:
        from rlvr_core.tasks.testbed import cluster_of

        return self.clusters.get(example.id) or cluster_of(example)


def load_source(data: DataConfig) -> SourceData:
    """The testbed, or the [data.prompts] set; ConfigError naming the file, row and column."""
    from rlvr_core.tasks.prompting import DEFAULT_PROMPT_TEMPLATE
    from rlvr_core.tasks.testbed import TestbedData, build_testbed_data, load_testbed

    if data.prompts is not None:
        from rlvr_core.tasks.prompt_data import PromptDataError, read_prompt_set

        try:
            prompt_set = read_prompt_set(data.prompts)
        except PromptDataError as error:
            raise ConfigError(f"data.prompts: {error}") from None
        return SourceData(None, TestbedData(source=prompt_set.examples, feedback=(), test=()),
                          data.prompt_template or DEFAULT_PROMPT_TEMPLATE, prompt_set.cluster_of())
    try:
        testbed = load_testbed(data.testbed)
    except ValueError as error:  # TestbedError names the file and field
        raise ConfigError(f"data.testbed: {error}") from None
    return SourceData(testbed, build_testbed_data(testbed), data.prompt_template or testbed.prompt_template, {})


def choose_rendering(mode: str, template: str, owner: Rendering | None, tokenizer: Any = None) -> Rendering:
    """data.rendering: the owner's published rendering, the tokenizer's chat template, or the template."""
    own = Rendering.from_tokenizer(tokenizer, template) if tokenizer is not None else None
    if mode == "owner" or (mode == "auto" and owner is not None):
        if owner is None:
            raise ConfigError("data.rendering: 'owner' renders prompts as the target owner publishes, which needs a "
                              "[feedback] owner that answered at start; choose 'auto', 'tokenizer' or 'template'")
        return owner
    if mode == "tokenizer":
        if own is None:
            raise ConfigError("data.rendering: 'tokenizer' needs a tokenizer with a chat template (chat_template.jinja "
                              "or tokenizer_config.json); this model has none. Choose 'template' or 'auto'")
        return own
    if mode == "auto" and own is not None:
        return own
    return Rendering(template)


def check_renderable(rendering: Rendering, examples: Sequence[Example]) -> None:
    """Every source prompt renders (a chat turn history needs a chat rendering); ConfigError naming the row."""
    for example in examples:
        try:
            rendering.check_example(example)
        except RenderingError as error:
            raise ConfigError(f"data: prompt {example.id!r} cannot be rendered with {rendering.describe()}: "
                              f"{error}") from None


def split_source(source: tuple[Example, ...], eval_size: int, seed: int) -> tuple[tuple[Example, ...], tuple[Example, ...]]:
    """(pool, held-out eval slice); the slice depends on the testbed seed only, not the run seed."""
    if eval_size >= len(source):
        raise ConfigError(f"data.eval_size ({eval_size}) must be smaller than the source split ({len(source)})")
    order = np.random.default_rng(seed).permutation(len(source))
    held = set(order[:eval_size].tolist())
    pool = tuple(e for i, e in enumerate(source) if i not in held)
    evals = tuple(source[i] for i in sorted(held))
    return pool, evals


def tiny_policy_inputs(
    examples: tuple[Example, ...], rendering: Rendering | str
) -> tuple[list[str], list[tuple[str, str]]]:
    """Tokenizer texts (prompts + answers) and SFT pairs (rendered prompt -> ' answer')."""
    from rlvr_core.tasks.rendering import as_rendering

    rendering = as_rendering(rendering)
    texts = [e.prompt for e in examples] + [e.answer for e in examples]
    pairs = [(rendering.render_example(e), " " + e.answer) for e in examples]
    return texts, pairs


def resolve_model_dir(model: ModelConfig, train_examples: tuple[Example, ...], rendering: Rendering | str) -> Path:
    """A local model directory: the configured path, or the (cached) tiny policy."""
    if model.path is not None:
        if not Path(model.path).is_dir():
            raise ConfigError(f"model.path: {model.path} is not a directory; point it at a local model folder")
        return Path(model.path)
    from rlvr_core.models.tiny_policy import build_tiny_policy

    texts, pairs = tiny_policy_inputs(train_examples, rendering)
    return Path(build_tiny_policy(model.tiny_spec, texts, pairs, model.cache_dir))  # typed at config load


def source_grader(choice: str | dict[str, Any], testbed: Any) -> Any:
    """data.grader: the grader of the rollouts, or None (each row's verifier, one score)."""
    from rlvr_core.verifiers.graders import make_grader

    if isinstance(choice, dict):
        return make_grader(choice)
    if choice == "testbed" and testbed is not None and testbed.source_grader is not None:
        return make_grader(testbed.source_grader)
    return None


def load_model(model_dir: Path, device: str, dtype_name: str) -> tuple[Any, Any]:
    """The trainer's own model folder (the looser rule); its refusals are config errors naming model.path."""
    from rlvr_core.models.loading import UnsafeCheckpointError
    from rlvr_core.models.model_folder import load_model_folder

    try:
        return load_model_folder(model_dir, device, getattr(torch, dtype_name))
    except UnsafeCheckpointError as error:
        raise ConfigError(f"model.path: {error}") from None


def build_training(
    config: TrainConfig,
    *,
    feedback: FeedbackContext | None = None,
    on_step_end: StepCallback | None = None,
    reward_fn: Callable[[str, Example], float] | None = None,
    extend_pool: Callable[[Any], Sequence[Example]] | None = None,
    owner_rendering: Rendering | None = None,
) -> TrainingSetup:
    """`extend_pool(testbed_data)` returns examples to add to the RL pool (after the tiny
    policy's warm-up data is chosen): the lab's target-mix diagnostic, the one caller that may
    train on target data. `train` has none, so `data.train_on_feedback_split` is refused.
    `owner_rendering` is what the owner published in GetInfo (data.rendering chooses)."""
    from rlvr_core.engines.base import SamplingParams
    from rlvr_core.engines.registry import build_engine

    torch.manual_seed(config.run.seed)
    if config.run.device == "cpu":
        from rlvr_core.models.memory import keep_freed_memory

        # A tiny model on a shared CPU: one thread beats spinning OpenMP threads, especially
        # beside a local owner process (rlvr_core/models/threads.py).
        torch.set_num_threads(1)
        keep_freed_memory()  # each step reuses its activation buffers (rlvr_core/models/memory.py)
    source = load_source(config.data)
    data, template = source.data, source.template
    split_seed = int(source.testbed.seed) if source.testbed is not None else 0  # never the run seed
    pool_examples, eval_examples = split_source(tuple(data.source), config.data.eval_size, split_seed)
    mode = config.data.rendering
    if config.model.tiny:  # built here, without a chat template: the rendering is known before the model
        rendering = choose_rendering(mode, template, owner_rendering)
        check_renderable(rendering, pool_examples + eval_examples)
        # The tiny policy's warm-up: the testbed's warm-up split when it has one, else the RL pool.
        model_dir = resolve_model_dir(config.model, data.warmup or pool_examples, rendering)
        model, tokenizer = load_model(model_dir, config.run.device, config.model.dtype)
    else:
        model_dir = resolve_model_dir(config.model, pool_examples, template)
        model, tokenizer = load_model(model_dir, config.run.device, config.model.dtype)
        rendering = choose_rendering(mode, template, owner_rendering, tokenizer)
        check_renderable(rendering, pool_examples + eval_examples)
    if config.model.lora is not None:  # before the engine and the trainer see it: both use the wrapped model
        from trainer_node.lora import apply_lora

        model = apply_lora(model, config.model.lora)
        trained = sum(p.numel() for p in model.parameters() if p.requires_grad)
        log.info("LoRA r=%d on %s: %d trainable parameters", config.model.lora.r,
                 ", ".join(config.model.lora.target_modules), trained)
    log.info("prompts are rendered with %s", rendering.describe())
    if config.data.train_on_feedback_split and extend_pool is None:
        raise ConfigError(_TARGET_MIX_REFUSED)
    if extend_pool is not None:
        pool_examples = pool_examples + tuple(extend_pool(data))
    pool = SourcePool(examples=pool_examples, clusters=tuple(source.cluster(e) for e in pool_examples))

    engine = build_engine(config.rollout.engine, model, tokenizer, device=config.run.device,
                          **config.rollout.engine_kwargs())
    try:
        # The options were typed at config load; only what needs the pool can still fail here.
        policy = build_policy(config.policy, pool, np.random.default_rng(config.run.seed))
    except ValueError as error:  # what only the pool can tell, e.g. oracle weights naming unknown domains
        raise ConfigError(f"policy: {error}") from None
    grader = source_grader(config.data.grader, source.testbed) if reward_fn is None else None
    if reward_fn is None:
        from rlvr_core.verifiers import score_example as reward_fn
    trainer = GRPOTrainer(
        model=model,
        tokenizer=tokenizer,
        engine=engine,
        policy=policy,
        pool=pool,
        render=rendering.render_example,
        reward_fn=reward_fn,
        settings=config.grpo,
        sampling=SamplingParams(max_new_tokens=config.rollout.max_new_tokens,
                                temperature=config.rollout.temperature, top_p=config.rollout.top_p,
                                seed=config.run.seed),
        device=config.run.device,
        feedback=feedback,
        on_step_end=on_step_end,
        grader=grader,
    )
    return TrainingSetup(config, source.testbed, data, template, pool, eval_examples, model_dir, model, tokenizer,
                         engine, policy, trainer, rendering)


def evaluate_source(setup: TrainingSetup) -> dict[str, float] | None:
    """Greedy accuracy on the held-out source slice (None when data.eval_size = 0)."""
    if not setup.eval_examples:
        return None
    result = local_accuracy(
        setup.engine, setup.eval_examples, setup.rendering or setup.template, setup.config.rollout.max_new_tokens,
        seed=EVAL_SEED,
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


def check_trainable(config: TrainConfig, selects_checkpoints: bool = False) -> None:
    """Refuse what only the lab may run: it needs knowledge of the target a trainer lacks.
    `selects_checkpoints`: the caller runs [selection] and reports its choice (the Flower deployment's
    ServerApp); `train` does not yet, so it refuses selection.every."""
    if config.data.train_on_feedback_split:
        raise ConfigError(_TARGET_MIX_REFUSED)
    if config.selection.every and not selects_checkpoints:
        raise ConfigError("selection.every: checkpoint selection by target feedback runs in `simulate` "
                          "(and `bench`); set it to 0 for `train`")
    if config.simulated_owner.feedback_verifier is not None:
        raise ConfigError("simulated_owner.feedback_verifier: sets the verifier of the owner `simulate` starts; "
                          "a real owner chooses its own (its data.feedback_verifier). Remove it for `train`")
    if policy_class(config.policy.name).simulation_only:
        raise ConfigError(f"policy.name: {config.policy.name!r} is a simulation-only diagnostic (it needs what "
                          "only a simulation knows of the target); `train` cannot run it. Use "
                          f"`trainer-node simulate --method {config.policy.name}`, or choose another policy")


def start_owner(config: TrainConfig) -> OwnerStatus | None:
    """Check the [feedback] owner before anything is built (None without [feedback], or with several
    owners: see start_owners).

    Raises OwnerStartError naming the setting when the owner is misconfigured or refuses this
    trainer, and when it is unreachable unless `feedback.required = false` (then a warning)."""
    from trainer_node.feedback.preflight import OwnerStartError, OwnerUnreachable, check_owner

    fb = config.feedback
    if not isinstance(fb, FeedbackConfig):
        return None
    try:
        status = check_owner(fb.client_settings())
    except OwnerUnreachable as error:
        if fb.required:
            raise OwnerStartError(f"{error}. Training needs its owner (feedback.required = true); set "
                                  "feedback.required = false to train on without it") from None
        log.warning("%s; feedback.required = false: training goes on, feedback queries retry later", error)
        return None
    _log_owner("feedback", status)
    return status


def _log_owner(where: str, status: OwnerStatus) -> None:
    from trainer_node.feedback.preflight import OwnerStartError, describe_owner

    try:
        Rendering.from_info(status.info)
    except RenderingError as error:
        raise OwnerStartError(f"{where}.target: the owner publishes a rendering this trainer cannot reproduce "
                              f"({error}); ask the owner to fix data.chat_format / chat_template_path") from None
    for line in describe_owner(status):
        log.info("%s%s", "" if where == "feedback" else f"{where}: ", line)


@dataclass(frozen=True)
class OwnersAtStart:
    """[[feedback.owners]] after the start checks: the owners that passed, and why each other one failed."""

    passed: dict[str, OwnerStatus]
    failed: dict[str, str]
    places: dict[str, str] = field(default_factory=dict)
    """owner name -> where it is configured (`feedback.owners[1]`), for errors that name it."""

    def rendering(self) -> Rendering | None:
        """The published rendering prompts follow. Prompts are rendered once, for every owner, so
        every owner that passed must publish the same one: an owner that scores another rendering
        would score text the policy never trains on. OwnerStartError names the first that differs."""
        from trainer_node.feedback.preflight import OwnerStartError

        renderings = {name: Rendering.from_info(status.info) for name, status in self.passed.items()}
        if not renderings:
            return None
        first, rendering = next(iter(renderings.items()))
        for name, other in renderings.items():
            if other != rendering:
                raise OwnerStartError(
                    f"{self.places.get(name, f'owner {name!r}')}: owner {name!r} publishes the rendering "
                    f"{other.describe()}, but {self.places.get(first, f'owner {first!r}')} ({first!r}) publishes "
                    f"{rendering.describe()}; prompts are rendered once for all owners, so they must publish one "
                    "rendering: ask the owners to align data.chat_format / chat_template_path / prompt_template, "
                    "or train with each in its own run")
        return rendering


def start_owners(config: TrainConfig) -> OwnersAtStart | None:
    """Check each of several owners ([[feedback.owners]]) as `start_owner` checks one; None otherwise.

    An owner that fails (misconfigured, refusing, unreachable) is left out of the run, with a warning
    naming its fields (`feedback.owners[1].ca_cert: ...`). With none passing: OwnerStartError naming each
    owner's failure when `feedback.required` (the default) or when any failure is a misconfiguration;
    with `required = false` and every owner unreachable, training goes on without feedback."""
    from trainer_node.config import OwnersFeedbackConfig
    from trainer_node.feedback.preflight import OwnerStartError, OwnerUnreachable, check_owner, located

    fb = config.feedback
    if not isinstance(fb, OwnersFeedbackConfig):
        return None
    passed: dict[str, OwnerStatus] = {}
    failed: dict[str, str] = {}
    places = {owner.name: where for (where, _), owner in zip(fb.owner_entries(), fb.owners, strict=True)}
    misconfigured = False
    for (where, _), owner in zip(fb.owner_entries(), fb.owners, strict=True):
        try:
            status = check_owner(fb.client_settings_for(owner))
            _log_owner(where, status)
        except OwnerStartError as error:
            failed[owner.name] = str(located(error, where))
            misconfigured |= not isinstance(error, OwnerUnreachable)
            log.warning("target owner %r left out at start: %s", owner.name, failed[owner.name])
            continue
        passed[owner.name] = status
    if not passed and (fb.required or misconfigured):
        reasons = "; ".join(f"{name}: {reason}" for name, reason in failed.items())
        rule = ("at least one owner must pass (feedback.required = true; false trains on without feedback when "
                "every owner is unreachable)" if fb.required else "a misconfigured owner stops the run")
        raise OwnerStartError(f"no target owner passed the start checks, {rule}. {reasons}")
    if not passed:
        log.warning("no target owner reachable at start; feedback.required = false: training goes on without "
                    "feedback")
    elif failed:
        log.warning("training with %s; left out: %s", ", ".join(passed), ", ".join(failed))
    return OwnersAtStart(passed, failed, places)


def check_owner_accepts_model(setup: TrainingSetup, info: Any = None) -> None:
    """The owner's upload rule on this model's upload set, before the first step (ConfigError otherwise).

    A LoRA run's upload set is the base folder + an adapter (trainer_node/feedback/adapters.py): it
    is written and run through the owner's whole folder rule, adapter included; and an owner whose
    GetInfo (`info`, when known) does not advertise LoRA adapters would refuse every query."""
    from rlvr_core.models.loading import UnsafeCheckpointError
    from rlvr_core.models.model_folder import check_uploadable
    from trainer_node.lora import is_lora_model

    if not is_lora_model(setup.model):
        try:
            check_uploadable(setup.model, setup.tokenizer)
        except UnsafeCheckpointError as error:
            raise ConfigError(f"model: {error}") from None
        return
    if info is not None and not info.delta_support.lora_adapters:
        raise ConfigError("model.lora: the target owner does not accept LoRA adapters (its GetInfo does not "
                          "advertise delta_support.lora_adapters); remove [model.lora] to send full checkpoints")
    import tempfile

    from protocol.refusal import CheckpointValidationError
    from protocol.validation import validate_checkpoint_dir
    from trainer_node.feedback.adapters import AdapterCandidateWriter

    with tempfile.TemporaryDirectory(prefix="upload-check-") as scratch:
        writer = AdapterCandidateWriter(setup.model, setup.tokenizer, Path(scratch))
        written = writer.write(setup.trainer.current_state_dict(), "check")
        try:
            validate_checkpoint_dir(written.directory)
        except CheckpointValidationError as error:
            raise ConfigError(f"model.lora: the target owner would refuse this run's adapter checkpoints: "
                              f"{error}") from None


def run_training(config: TrainConfig, *, resume: Path | None = None, progress: bool = True) -> dict[str, Any]:
    """Train for config.run.steps steps (continuing a checkpoint when `resume` is given)."""
    from trainer_node.feedback.client import TargetFeedbackClient
    from trainer_node.feedback.hook import OwnerFeedbackHook

    check_trainable(config)
    engine = TRAINING_ENGINES.get(config.engine.name)
    if resume is not None and not engine.resumable:
        raise ConfigError(f"--resume: training engine {config.engine.name!r} does not resume this project's "
                          "checkpoints; start a fresh run")
    owner = start_owner(config)
    several = start_owners(config)
    rank = engine.process_rank()
    rendering = several.rendering() if several else (Rendering.from_info(owner.info) if owner else None)
    setup = build_training(config, owner_rendering=rendering)
    trainer = setup.trainer
    run_dir = rank_output_dir(Path(config.run.out_dir), rank)
    feedback = hook = None
    if isinstance(config.feedback, FeedbackConfig):
        check_owner_accepts_model(setup, owner.info if owner is not None else None)
        feedback = connect_feedback(setup, TargetFeedbackClient(config.feedback.client_settings()), run_dir)
        hook = OwnerFeedbackHook(feedback, final_release=config.feedback.final_release)
    elif several is not None and several.passed:
        check_owner_accepts_model(setup)
        feedback = connect_several(setup, several, run_dir)
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
        result = engine().run(setup, output, schedule, SourceEvaluation(setup), hook, feedback)
    finally:
        if feedback is not None:
            feedback.client.close()
    extra = {"final_checkpoint": str(result.final_checkpoint), "model_dir": str(setup.model_dir),
             "rendering": setup.rendering.describe() if setup.rendering else None, **result.feedback.summary}
    if several is not None:  # each owner's releases, spend and loss (none passing: every one left out)
        extra.update(feedback.summary() if feedback is not None else
                     {"owners": {name: {"lost_step": 0, "lost_reason": why} for name, why in several.failed.items()},
                      "owners_lost": [{"owner": n, "step": 0, "reason": why} for n, why in several.failed.items()]})
    return output.close(extra=extra, print_table=rank == 0)


def rank_output_dir(run_dir: Path, rank: int) -> Path:
    """Where a process of a multi-process launch writes the project's run files (metrics.jsonl,
    summary.json, the feedback state): rank 0 the run folder, another rank a folder of its own
    inside it, so no rank truncates or overwrites rank 0's summary. The engine's own shared
    folders (TRL's output_dir, the feedback checkpoint) stay under config.run.out_dir."""
    return run_dir if rank == 0 else run_dir / f"rank{rank}"


def feedback_settings(config: TrainConfig) -> Any:
    """Decoding and pacing of every owner's queries, from [feedback] (greedy, one sample, every step without)."""
    from trainer_node.feedback.context import FeedbackSettings

    fb = config.feedback
    return FeedbackSettings(
        total_steps=config.run.steps, max_new_tokens=config.rollout.max_new_tokens, seed=config.run.seed,
        reserve_queries=1 if config.selection.every else 0,
        **({"samples_per_prompt": fb.samples_per_prompt, "temperature": fb.temperature,
            "min_interval": fb.min_interval} if fb is not None else {}),
    )


def connect_several(setup: TrainingSetup, owners: OwnersAtStart, run_dir: Path) -> Any:
    """A MultiOwnerFeedback (trainer_node/feedback/owners.py) over direct mTLS clients to the owners that
    passed the start checks; one OwnerFeedback, pacer and budget each. The aggregation ([owners], or the
    owners' weights) is taken over the owners that passed: a mixture renormalized over them."""
    from trainer_node.feedback.aggregation import AggregationOptions
    from trainer_node.feedback.client import TargetFeedbackClient
    from trainer_node.feedback.owners import connect_owners
    from trainer_node.feedback.preflight import OwnerStartError

    cfg = setup.config
    fb = cfg.feedback
    options = fb.aggregation(cfg.owners)
    if options.mixture:
        options = AggregationOptions(**{**options.model_dump(), "mixture": {
            name: weight for name, weight in options.mixture.items() if name in owners.passed}})
    clients = {owner.name: TargetFeedbackClient(fb.client_settings_for(owner))
               for owner in fb.owners if owner.name in owners.passed}
    try:
        feedback = connect_owners(clients, setup.trainer, feedback_settings(cfg), run_dir / "checkpoints_sent",
                                  options, left_out=owners.failed)
    except ValueError as error:  # the aggregation cannot run on the owners left (e.g. per_owner's owner failed)
        for client in clients.values():
            client.close()
        raise OwnerStartError(f"{error}, with {', '.join(owners.failed)} left out at start "
                              f"({'; '.join(f'{n}: {why}' for n, why in owners.failed.items())})") from None
    if setup.policy.uses_target_feedback:
        setup.trainer.feedback = feedback
    return feedback


def connect_feedback(setup: TrainingSetup, client: OwnerClient, run_dir: Path) -> OwnerFeedback:
    """An OwnerFeedback over `client` (trainer_node/feedback/context.py's one wiring), handed to
    the policy when it learns from the target; `train` and the lab both call this.

    Decoding and pacing come from [feedback] when present (else greedy, one sample, every
    step), one release is kept back for checkpoint selection when [selection] is on. Once
    training runs, an owner that stops answering is not fatal: training goes on with the
    policy's last state (`run_training` has checked the owner at start).
    """
    from trainer_node.feedback.context import connect_owner_feedback

    cfg = setup.config
    fb = cfg.feedback
    feedback = connect_owner_feedback(client, setup.trainer, feedback_settings(cfg), run_dir / "checkpoints_sent")
    if setup.policy.uses_target_feedback:
        setup.trainer.feedback = feedback
    else:
        final = fb is not None and fb.final_release
        log.info("policy %r does not learn from target feedback: its sampler never queries the owner%s",
                 setup.policy.name, "; the owner is asked once, for the final checkpoint's accuracy (one charged "
                 "release; feedback.final_release = false skips it)" if final else "")
    return feedback
