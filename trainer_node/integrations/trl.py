"""L2RR and target feedback inside TRL's GRPOTrainer (the `trl` extra; TRL is imported only in `run`).

Thin glue over integrations/core.py, at the three places TRL 1.16.0 leaves open:

- the sampler: `_get_train_sampler` returns `QRepeatSampler` instead of TRL's RepeatSampler,
  with RepeatSampler's layout (each round's B distinct prompts, each repeated G =
  num_generations times in a row, the round repeated num_iterations * steps_per_generation
  times, because TRL generates once per block and reads the other batches of the block only
  to skip them). Rounds come from core.GlobalIndexStream: the same stream on every rank, from
  the shared seed and q, which rank 0 broadcasts after each update (TRL and accelerate never
  synchronise a sampler's weights).
- the rewards: the reward function TRL calls is the project's verifier (our trainer's reward_fn),
  wrapped to record (row id, reward) of every completion; the dataset's `row_id` column reaches
  it because GRPOConfig.remove_unused_columns is False. The records of all ranks are gathered
  at the step's end.
- the callback (`on_step_end`, after the optimizer step): rank 0's EngineRun sees the step's
  groups (waste signal) and, when the pacer allows a query, the model TRL has just trained is
  saved in HF format (save_model, on every rank, then wait_for_everyone) and released by the
  owner as one checkpoint through ReleaseFeedback: the same client, pacer and DP ledger as our
  own trainer. L2RR's estimator must be one that needs no candidates (release_difference): the
  config check refuses the others at load.

The run is reported as our own loop's (trainer_node/loop.py's LoopResult, RunOutput records),
so `train` and `simulate` print the same summaries whatever the engine.
"""

from __future__ import annotations

import logging
import math
import os
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from pydantic import Field

from rlvr_core.configuration import OptionsSection
from trainer_node.integrations.core import EngineRun, GlobalIndexStream, ReleaseFeedback, cluster_ids
from trainer_node.integrations.support import TRAINING_ENGINES, TrainingEngine

log = logging.getLogger("trainer_node.integrations.trl")


class TrlOptions(OptionsSection):
    """GRPOConfig fields the project does not already set from [policy], [grpo], [rollout] and [run]."""

    loss_type: Literal["grpo", "dr_grpo", "dapo", "bnpo", "cispo", "sapo", "luspo", "vespo"] = Field(
        default="dapo", description="TRL's loss aggregation (GRPOConfig.loss_type; TRL's default 'dapo' is "
        "token-level normalisation, not DAPO's dynamic sampling, which TRL 1.16.0 does not have)."
    )
    beta: float = Field(default=0.0, ge=0, description="KL coefficient (0: no reference model, TRL's default).")
    num_iterations: int = Field(default=1, ge=1, description="Updates per generation (mu).")
    scale_rewards: Literal["group", "batch", "none"] = Field(
        default="group", description="How TRL scales advantages (GRPOConfig.scale_rewards)."
    )
    mask_truncated_completions: bool = Field(
        default=False, description="Exclude truncated completions from the loss (DAPO's overlong filter)."
    )


class QRepeatSampler(torch.utils.data.Sampler):
    """TRL's RepeatSampler layout over core.GlobalIndexStream rounds, drawn lazily (q may move between rounds)."""

    def __init__(self, stream: GlobalIndexStream, q: np.ndarray, mini_repeat_count: int, repeat_count: int,
                 rounds: int, first_round: int = 0):
        self.stream = stream
        self.q = np.asarray(q, dtype=np.float64)
        self.mini_repeat_count = mini_repeat_count
        self.repeat_count = repeat_count
        self.rounds = rounds
        self.next_round = first_round
        self.drawn: list[list[int]] = []  # every round drawn so far, in order (tests, logs)

    def __iter__(self):
        for _ in range(self.rounds):
            chunk = self.stream.round(self.next_round, self.q)
            self.next_round += 1
            self.drawn.append(chunk)
            for _ in range(self.repeat_count):
                for index in chunk:
                    for _ in range(self.mini_repeat_count):
                        yield index

    def __len__(self) -> int:
        return self.rounds * self.stream.prompts_per_round * self.mini_repeat_count * self.repeat_count

    def set_epoch(self, epoch: int) -> None:
        """Rounds are numbered across epochs, not restarted."""


class RewardRecorder:
    """The reward function TRL calls: the project's reward (the configured grader's first draw, as our
    own rollouts score it, else the verifier), recording (row id, reward) per completion."""

    __name__ = "target_feedback_reward"  # TRL names its reward metrics after the function

    def __init__(self, examples: Any, reward_fn: Any, grader: Any = None, seed: int = 0):
        self.examples = examples
        self.reward_fn = reward_fn
        self.grader = grader
        self.seed = seed
        self.records: list[tuple[int, float]] = []

    def __call__(self, prompts, completions, row_id, trainer_state=None, **kwargs) -> list[float]:
        from rlvr_core.verifiers.draws import DrawKey

        step = int(getattr(trainer_state, "global_step", 0))
        texts = [c if isinstance(c, str) else c[-1]["content"] for c in completions]
        seen: dict[int, int] = {}
        rewards = []
        for text, row in zip(texts, (int(i) for i in row_id)):
            example = self.examples[row]
            sample = seen[row] = seen.get(row, -1) + 1
            if self.grader is not None:  # keyed like our rollouts: (seed of the step, row, sample)
                key = DrawKey.of(self.seed * 1_000_003 + step, example.id, sample)
                rewards.append(float(self.grader(text, example, key, 1)[0]))
            else:
                rewards.append(float(self.reward_fn(text, example)))
        self.records.extend(zip((int(i) for i in row_id), rewards))
        return rewards

    def take(self) -> list[tuple[int, float]]:
        records, self.records = self.records, []
        return records


def _gather(accelerator: Any, records: list[tuple[int, float]]) -> list[tuple[int, float]]:
    if accelerator.num_processes == 1:
        return records
    from accelerate.utils import gather_object

    return [tuple(r) for r in gather_object(records)]


def _broadcast_q(accelerator: Any, q: np.ndarray) -> np.ndarray:
    """Rank 0's q on every rank, bit for bit (the streams must agree)."""
    if accelerator.num_processes == 1:
        return q
    import torch
    from accelerate.utils import broadcast

    tensor = torch.as_tensor(q, dtype=torch.float64, device=accelerator.device)
    return broadcast(tensor, from_process=0).cpu().numpy()


def _broadcast_flag(accelerator: Any, flag: bool) -> bool:
    if accelerator.num_processes == 1:
        return flag
    from accelerate.utils import broadcast_object_list

    return bool(broadcast_object_list([flag], from_process=0)[0])


@TRAINING_ENGINES.register("trl", options=TrlOptions)
class TrlEngine(TrainingEngine):
    """TRL's GRPOTrainer with the L2RR sampler, reward recorder and feedback callback."""

    lookahead_candidates = False
    any_policy = False
    extra = "trl"

    @classmethod
    def process_rank(cls) -> int:
        # torchrun and `accelerate launch` set RANK in every process before it starts.
        return int(os.environ.get("RANK", "0") or 0)

    def run(self, setup, output, schedule, evaluation, hook, feedback):
        return run_trl(setup, output, schedule, evaluation, hook, feedback)


def grpo_config(setup: Any, out_dir: Path, options: TrlOptions, world_size: int = 1) -> Any:
    """The GRPOConfig of a run: batch shape from [policy], lengths and sampling from [rollout], the optimizer
    and PPO clip range from [grpo] (constant lr, as our loop); the rest from [engine.options]."""
    from trl import GRPOConfig

    cfg = setup.config
    group = cfg.policy.rollouts_per_prompt
    prompts = min(cfg.policy.batch_size, len(setup.pool))
    if (prompts * group) % world_size:
        raise ValueError(f"policy.batch_size * policy.rollouts_per_prompt ({prompts * group}) must divide over "
                         f"{world_size} processes")
    return GRPOConfig(
        output_dir=str(out_dir), use_cpu=cfg.run.device == "cpu", bf16=False, gradient_checkpointing=False,
        per_device_train_batch_size=prompts * group // world_size, num_generations=group,
        max_completion_length=cfg.rollout.max_new_tokens, temperature=cfg.rollout.temperature,
        top_p=cfg.rollout.top_p, learning_rate=cfg.grpo.lr, lr_scheduler_type="constant",  # as our loop
        weight_decay=cfg.grpo.weight_decay, adam_beta1=cfg.grpo.betas[0], adam_beta2=cfg.grpo.betas[1],
        adam_epsilon=cfg.grpo.adam_eps, max_grad_norm=cfg.grpo.max_grad_norm, epsilon=cfg.grpo.eps_low,
        epsilon_high=cfg.grpo.eps_high, max_steps=cfg.run.steps, logging_steps=1,
        save_strategy="no", report_to="none", dataloader_num_workers=0, seed=cfg.run.seed,
        loss_type=options.loss_type, beta=options.beta, num_iterations=options.num_iterations,
        scale_rewards=options.scale_rewards, mask_truncated_completions=options.mask_truncated_completions,
        disable_tqdm=True,
    )


def run_trl(setup: Any, output: Any, schedule: Any, evaluation: Any, hook: Any, owner_feedback: Any) -> Any:
    """One run of TRL's GRPOTrainer with the project's sampler and feedback (module docstring)."""
    import time

    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOTrainer

    from trainer_node.loop import FeedbackOutcome, LoopResult

    cfg = setup.config
    if owner_feedback is not None and not hasattr(owner_feedback, "release_checkpoints"):
        raise ValueError("engine.name = 'trl' takes one owner ([feedback]); several [[feedback.owners]] run on "
                         "engine 'trainer_node'")
    options = cfg.engine.options if isinstance(cfg.engine.options, TrlOptions) else TrlOptions()
    pool, policy, ours = setup.pool, setup.policy, setup.trainer
    run_dir = Path(cfg.run.out_dir)
    render = setup.rendering.render_example if setup.rendering is not None else None
    prompts = [render(e) if render else setup.template.replace("{prompt}", e.prompt) for e in pool.examples]
    dataset = Dataset.from_dict({"prompt": prompts, "row_id": list(range(len(pool)))})
    recorder = RewardRecorder(pool.examples, ours.reward_fn, ours.grader, cfg.run.seed)
    args = grpo_config(setup, run_dir / "trl", options)
    checkpoint_dir = run_dir / "feedback_checkpoint"
    saved = {"step": -1}
    holder: dict[str, Any] = {}

    def current_checkpoint() -> Path:
        trainer = holder["trainer"]
        if saved["step"] != trainer.state.global_step:  # single process: save here (all ranks did before)
            trainer.save_model(str(checkpoint_dir))
            saved["step"] = trainer.state.global_step
        return checkpoint_dir

    release = (ReleaseFeedback(owner_feedback, current_checkpoint, engine="trl")
               if owner_feedback is not None and policy.uses_target_feedback else None)
    run = EngineRun(policy, pool, release)
    cluster_of, names = cluster_ids(pool)
    prompts_per_round = min(cfg.policy.batch_size, len(pool))
    stream = GlobalIndexStream(cluster_of, len(names), prompts_per_round, cfg.run.seed)

    class L2rrGRPOTrainer(GRPOTrainer):
        def _get_train_sampler(self, dataset=None):
            repeat = self.num_iterations * self.args.steps_per_generation
            if self.args.generation_batch_size // self.num_generations != prompts_per_round:
                raise ValueError("the generation batch must hold policy.batch_size prompts")
            # A couple of rounds beyond max_steps: the dataloader reads ahead.
            self.q_sampler = QRepeatSampler(stream, run.q(), self.num_generations, repeat,
                                            rounds=math.ceil(cfg.run.steps / max(self.args.steps_per_generation, 1))
                                            + 4)
            return self.q_sampler

    state = {"rollouts": 0, "step_started": time.perf_counter()}

    class FeedbackCallback(TrainerCallback):
        def on_step_end(self, args, trl_state, control, **kwargs):
            trainer = holder["trainer"]
            accelerator = trainer.accelerator
            step = trl_state.global_step - 1  # the step whose update just ran
            records = _gather(accelerator, recorder.take())
            main = accelerator.is_main_process
            due = main and release is not None and release.should_query(step)
            if _broadcast_flag(accelerator, due):
                trainer.save_model(str(checkpoint_dir))  # every rank: the gathers of FSDP/DeepSpeed run inside
                accelerator.wait_for_everyone()
                saved["step"] = trainer.state.global_step
            record: dict[str, Any] = {"step": step}
            if main:
                rows = [r for r, _ in records]
                rewards = [x for _, x in records]
                counts = run.observe(step, rows, rewards)
                record.update({f"policy_{k}" if k == "step" else k: v for k, v in run.end_step(step).items()})
                state["rollouts"] += len(records)
                ours.rollouts_cumulative = state["rollouts"]
                record.update(reward_mean=float(np.mean(rewards)) if rewards else None,
                              rollouts_step=len(records), rollouts_cumulative=state["rollouts"],
                              zero_variance_groups=sum(counts.values()))
            trainer.q_sampler.q = _broadcast_q(accelerator, run.q())
            ours.step_index = step + 1
            if main:
                if hook is not None:
                    hook.after_step(step + 1, record)
                now = time.perf_counter()
                record["step_seconds"] = now - state["step_started"]
                state["step_started"] = now
                output.log_step(record)
                if schedule.evaluates_after(step + 1):
                    measure(f"step{step + 1}")

    def measure(label: str) -> dict[str, Any] | None:
        if not holder["trainer"].accelerator.is_main_process:
            return None  # rank 0 measures, as it logs and talks to the owner
        result = evaluation.evaluate(label)
        if result is None:
            return None
        result = {"step": ours.step_index, "rollouts_cumulative": ours.rollouts_cumulative, **result}
        output.log_eval(result)
        return result

    callback = FeedbackCallback()
    trainer = L2rrGRPOTrainer(model=setup.model, reward_funcs=[recorder], args=args, train_dataset=dataset,
                              processing_class=setup.tokenizer, callbacks=[callback])
    holder["trainer"] = trainer
    from transformers.trainer_callback import PrinterCallback, ProgressCallback

    for noisy in (PrinterCallback, ProgressCallback):  # RunOutput logs and shows progress, as for our loop
        trainer.remove_callback(noisy)
    initial = measure("initial")
    state["step_started"] = time.perf_counter()
    trainer.train()
    run.finish(ours.step_index)
    final = measure("final")
    final_checkpoint = None
    if schedule.checkpoint_dir is not None:
        final_checkpoint = Path(schedule.checkpoint_dir) / f"trl_step_{ours.step_index}"  # HF format, not resumable
        trainer.save_model(str(final_checkpoint))
    # The run's last release (and its charge) happens once, on the process that talks to the owner.
    main = trainer.accelerator.is_main_process
    outcome = hook.finish(ours.step_index) if hook is not None and main else FeedbackOutcome()
    for extra in outcome.evals:
        output.log_eval({"step": ours.step_index, "rollouts_cumulative": ours.rollouts_cumulative, **extra})
    return LoopResult(initial, final, final_checkpoint, outcome)
