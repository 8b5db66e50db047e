"""verl adapter: L2RR's sampler and target feedback inside verl's own PPO/GRPO loop (the `verl` extra).

Thin glue over the engine-neutral core (core.py): `L2RRSampler` is the dataloader sampler verl's
trainer iterates, and its `update(batch)` feeds the step's per-sample scores to the core.

Which verl versions, which route (docs/SCALE.md, "verl"):
- verl 0.8.0 - 0.9.1 (current): verl removed its sampler plug-in (`data.sampler.class_path`,
  `AbstractCurriculumSampler`) in 0.8.0. What remains is the legacy trainer's
  `RayPPOTrainer(train_sampler=...)` and its per-step dataset hook `train_dataset.on_batch_end(batch)`.
  `python -m trainer_node.integrations.verl <hydra overrides>` runs verl's own `main_ppo` with
  `trainer.use_v1=False` and a TaskRunner that builds this sampler when `data.l2rr` is set; the
  sampler hands the dataset its `update` as `on_batch_end`. The V1 trainer (verl's default) is
  not supported: its dataloader sampler is hard-wired (`create_rl_sampler`).
- verl <= 0.7.1: the class subclasses `verl.experimental.dataset.sampler.AbstractCurriculumSampler`,
  so `data.sampler.class_path=pkg://trainer_node.integrations.verl data.sampler.class_name=L2RRSampler`
  loads it with verl's own `main_ppo`, and verl calls `update(batch=batch)` after every step.
Both routes need `data.dataloader_num_workers=0` (a worker process would hold a copy of q).

`update(batch)` reads, per response: the sequence score `batch.batch["token_level_scores"].sum(-1)`
(or a `non_tensor_batch` key such as verl's `acc`, option `reward_key`), and the prompt's row
through `non_tensor_batch["index"]` (verl's `extra_info.index`, which verl's preprocessors set to
the row's position; it must be unique). Responses are grouped by the row (one per prompt in a
round, so the same groups as verl's `uid`; `balance_batch` reorders rows but never splits them
from their index), and the core counts zero-variance groups per cluster.

Feedback: verl saves HF-format checkpoints to `{default_local_dir}/global_step_N/actor/huggingface`
when `actor_rollout_ref.actor.checkpoint.save_contents` includes `hf_model`; the latest one
(`latest_checkpointed_iteration.txt`) is what the core uploads and releases as ONE checkpoint.
verl offers releases of its current model only: estimators that need lookahead candidates are
refused when the sampler is built (support.py).

verl is imported only inside the functions that need it: this module imports without verl
(the class then subclasses torch's Sampler), so the project's main environment can load it.
"""

from __future__ import annotations

import importlib.util
import logging
from collections.abc import Callable, Mapping, Sequence, Sized
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import Field
from torch.utils.data import Sampler

from rlvr_core.configuration import Section, validate_options
from rlvr_core.tasks.example import Example
from rlvr_core.tasks.prompt_data import lookup_column
from trainer_node.integrations.core import EngineRun, GlobalIndexStream, ReleaseFeedback, cluster_ids
from trainer_node.integrations.support import EngineSupport, check_engine_support
from trainer_node.policies.base import SourcePool, build_policy, parse_policy_options

log = logging.getLogger("trainer_node.integrations.verl")

VERL = EngineSupport(engine="verl", lookahead_candidates=False, any_policy=False)
"""verl's trainer owns its step: releases of its current model only, no lookahead candidates, and
prompts drawn through the core's index stream (policies that draw from a cluster distribution)."""


def _sampler_base() -> type:
    """verl <= 0.7.1's curriculum sampler base when installed (route 3), else torch's Sampler."""
    if importlib.util.find_spec("verl") is not None:
        try:
            from verl.experimental.dataset.sampler import AbstractCurriculumSampler
        except ImportError:  # verl >= 0.8.0 removed it (verl PR #6302)
            pass
        else:
            return AbstractCurriculumSampler
    return Sampler


SAMPLER_BASE = _sampler_base()
CURRICULUM_HOOK = SAMPLER_BASE is not Sampler
"""True when verl itself calls `sampler.update(batch)` (verl <= 0.7.1); else the dataset hook carries it."""


class VerlL2RROptions(Section):
    """`data.l2rr` in verl's config (Hydra: `+data.l2rr.<key>=...`)."""

    policy: dict[str, Any] = Field(
        default_factory=lambda: {"name": "l2rr", "estimator": "release_difference"},
        description="The data policy's options, as [policy] in a trainer-node config (name and its options).",
    )
    seed: int = Field(default=0, ge=0, description="Seed of the index stream (rounds are keyed by (seed, round)).")
    cluster_column: str = Field(
        default="data_source", description="The row column (dotted path) that names L2RR's cluster, e.g. "
        "'extra_info.cluster'; verl's `data_source` by default.",
    )
    reward_key: str = Field(
        default="token_level_scores", description="Per-response reward: 'token_level_scores' (summed over "
        "tokens, verl's sequence score) or a non_tensor_batch key the reward function returns (e.g. 'acc').",
    )
    checkpoint_dir: str | None = Field(
        default=None, description="verl's trainer.default_local_dir (e.g. '${trainer.default_local_dir}'), "
        "where the HF checkpoints the feedback uploads are saved.",
    )
    feedback: dict[str, Any] | None = Field(
        default=None, description="The target owner: a trainer-node [feedback] table (target, ca_cert, "
        "client_cert, client_key, pacing and decoding; absolute paths). None = no feedback.",
    )
    total_steps: int | None = Field(
        default=None, gt=0, description="The run's steps (verl's trainer.total_training_steps): the budget "
        "pacer spreads the owner's releases over them. Needed with feedback.",
    )


def read_options(data_config: Any) -> VerlL2RROptions:
    """`data.l2rr` (an OmegaConf node, a mapping or absent) as typed options; errors name the key."""
    raw = _plain(_get(data_config, "l2rr")) or {}
    if not isinstance(raw, Mapping):
        raise TypeError(f"data.l2rr must be a mapping of options, got {type(raw).__name__}")
    try:
        return validate_options(VerlL2RROptions, dict(raw), part="data.l2rr")
    except ValueError as error:  # pydantic's ValidationError: locations inside data.l2rr
        raise ValueError(f"data.l2rr: {error}") from None


def _get(config: Any, key: str, default: Any = None) -> Any:
    getter = getattr(config, "get", None)
    return getter(key, default) if callable(getter) else getattr(config, key, default)


def _plain(value: Any) -> Any:
    """An OmegaConf node as plain containers (interpolations resolved); anything else unchanged."""
    if type(value).__module__.startswith("omegaconf"):
        from omegaconf import OmegaConf

        return OmegaConf.to_container(value, resolve=True)
    return value


def _rows(dataset: Any) -> Sequence[Mapping[str, Any]]:
    """verl's RLHFDataset keeps its (already filtered) rows in `.dataframe` (a datasets.Dataset)."""
    rows = getattr(dataset, "dataframe", None)
    if rows is None:
        raise ValueError("the verl dataset has no `dataframe` (rows): use verl's RLHFDataset or a subclass")
    return rows


def pool_from_dataset(dataset: Any, cluster_column: str) -> tuple[SourcePool, dict[int, int]]:
    """The SourcePool of verl's dataset rows, in the dataset's order (so a pool index IS the position
    verl's dataloader fetches), and {extra_info.index: position} to read a batch's rows back."""
    examples: list[Example] = []
    clusters: list[str] = []
    position_of: dict[int, int] = {}
    for position in range(len(dataset)):
        row = _rows(dataset)[position]
        index = lookup_column(row, "extra_info.index")
        if isinstance(index, bool) or not isinstance(index, (int, np.integer)):
            raise TypeError(f"row {position}: extra_info.index must be an integer row id (verl's preprocessors "
                             "write the row's position); L2RR reads a batch's rows through it")
        if int(index) in position_of:
            raise ValueError(f"row {position}: extra_info.index {int(index)} repeats row "
                             f"{position_of[int(index)]}; it must be unique")
        position_of[int(index)] = position
        cluster = lookup_column(row, cluster_column)
        cluster = "all" if cluster is None else str(cluster)
        answer = lookup_column(row, "reward_model.ground_truth")
        examples.append(Example(id=str(int(index)), prompt=_prompt_text(row.get("prompt")),
                                answer="" if answer is None else str(answer), domain=cluster))
        clusters.append(cluster)
    if not examples:
        raise ValueError("the verl dataset holds no rows")
    return SourcePool(tuple(examples), tuple(clusters)), position_of


def _prompt_text(prompt: Any) -> str:
    """The last message's content of verl's chat prompt (for logs only; verl renders prompts itself)."""
    if isinstance(prompt, str):
        return prompt
    try:
        return str(list(prompt)[-1]["content"])
    except (TypeError, KeyError, IndexError):
        return ""


def batch_rewards(batch: Any, position_of: Mapping[int, int], reward_key: str) -> tuple[list[int], list[float]]:
    """(dataset position, reward) of every response in a verl DataProto batch after its reward step."""
    non_tensor = batch.non_tensor_batch
    if "index" not in non_tensor:
        raise ValueError("batch.non_tensor_batch has no 'index' (verl's extra_info.index of each row)")
    if reward_key in non_tensor:
        rewards = np.asarray(non_tensor[reward_key], dtype=np.float64)
    elif reward_key in batch.batch.keys():  # noqa: SIM118 - a TensorDict: `in` on it is not key lookup
        rewards = batch.batch[reward_key].float().sum(-1).cpu().numpy().astype(np.float64)
    else:
        raise ValueError(f"data.l2rr.reward_key: the batch has no {reward_key!r} (tensors: "
                         f"{sorted(batch.batch.keys())}; non-tensor keys: {sorted(non_tensor)})")
    positions = []
    for index in non_tensor["index"]:
        if int(index) not in position_of:
            raise ValueError(f"batch row index {int(index)} is not an extra_info.index of the training dataset")
        positions.append(position_of[int(index)])
    if "uid" in non_tensor:  # each prompt's group (verl's uid) must be exactly one row
        pairs = set(zip(non_tensor["uid"].tolist(), positions))
        if len({uid for uid, _ in pairs}) != len(pairs):
            raise ValueError("one verl group (uid) holds responses of several rows; extra_info.index is not a row id")
    return positions, rewards.tolist()


def latest_hf_checkpoint(checkpoint_dir: str | Path) -> Path:
    """The HF folder of verl's latest checkpoint: global_step_N/actor/huggingface, N from
    latest_checkpointed_iteration.txt. Raises FileNotFoundError naming the setting to fix."""
    root = Path(checkpoint_dir)
    marker = root / "latest_checkpointed_iteration.txt"
    if not marker.is_file():
        raise FileNotFoundError(f"{marker}: verl has saved no checkpoint yet (trainer.save_freq)")
    step = marker.read_text().strip()
    if not step.isdigit():
        raise FileNotFoundError(f"{marker}: holds no step number")
    folder = root / f"global_step_{step}" / "actor" / "huggingface"
    if not any(folder.glob("*.safetensors")):
        raise FileNotFoundError(
            f"{folder}: no safetensors weights; add hf_model to actor_rollout_ref.actor.checkpoint.save_contents "
            "(or merge with `python -m verl.model_merger merge --backend fsdp`)"
        )
    return folder


def connect_feedback(options: VerlL2RROptions, max_new_tokens: int, client: Any = None) -> ReleaseFeedback:
    """The core's ReleaseFeedback over the owner `data.l2rr.feedback` names (or `client`, any
    OwnerClient), uploading verl's latest HF checkpoint; the same client, pacer and decoding wiring
    as trainer-node's own runs (connect_owner_feedback)."""
    from trainer_node.config import FeedbackConfig
    from trainer_node.feedback.context import FeedbackSettings, connect_owner_feedback

    if options.checkpoint_dir is None or options.total_steps is None:
        raise ValueError("data.l2rr.checkpoint_dir and data.l2rr.total_steps are needed with data.l2rr.feedback "
                         "(e.g. '${trainer.default_local_dir}' and '${trainer.total_training_steps}')")
    try:
        section = validate_options(FeedbackConfig, dict(options.feedback or {}), part="data.l2rr.feedback")
    except ValueError as error:
        raise ValueError(f"data.l2rr.feedback: {error}") from None
    if client is None:
        from trainer_node.feedback.client import TargetFeedbackClient

        client = TargetFeedbackClient(section.client_settings())
    settings = FeedbackSettings(total_steps=options.total_steps, max_new_tokens=max_new_tokens, seed=options.seed,
                                samples_per_prompt=section.samples_per_prompt, temperature=section.temperature,
                                min_interval=section.min_interval)
    checkpoints = Path(options.checkpoint_dir)
    owner = connect_owner_feedback(client, None, settings, checkpoints / "l2rr_feedback")
    return ReleaseFeedback(owner, lambda: latest_hf_checkpoint(checkpoints), engine=VERL.engine)


def build_run(pool: SourcePool, options: VerlL2RROptions, data_config: Any = None) -> EngineRun:
    """The core's EngineRun for verl: the policy from `data.l2rr.policy`, checked against what verl
    offers (no lookahead candidates) before anything runs, and the owner when `data.l2rr.feedback` is set."""
    typed = parse_policy_options(options.policy)
    check_engine_support(typed, VERL)
    policy = build_policy(typed, pool, np.random.default_rng(options.seed))
    feedback = None
    if options.feedback is not None:
        feedback = connect_feedback(options, int(_get(data_config, "max_response_length", 1024)))
    return EngineRun(policy, pool, feedback)


class L2RRSampler(SAMPLER_BASE):  # type: ignore[misc, valid-type]
    """verl's dataloader sampler: rounds of `gen_batch_size` (else `train_batch_size`) distinct rows
    from the core's index stream, drawn lazily so the step's q update shapes the next round.

    `L2RRSampler(data_source=dataset, data_config=config.data)` is verl's sampler signature
    (`create_rl_sampler` in verl <= 0.7.1). `run` (an EngineRun) replaces the one `data.l2rr` builds.
    """

    def __init__(self, data_source: Sized, data_config: Any, run: EngineRun | None = None) -> None:
        workers = _get(data_config, "dataloader_num_workers", 8)
        if workers != 0:
            raise ValueError(f"data.dataloader_num_workers is {workers}; L2RR's sampler needs 0 (a dataloader "
                             "worker would draw from a stale copy of q)")
        self.options = read_options(data_config)
        self.pool, self.position_of = pool_from_dataset(data_source, self.options.cluster_column)
        self.run = run if run is not None else build_run(self.pool, self.options, data_config)
        self.batch_size = int(_get(data_config, "gen_batch_size") or _get(data_config, "train_batch_size"))
        cluster_of, names = cluster_ids(self.pool)
        self.stream = GlobalIndexStream(cluster_of, len(names), self.batch_size, self.options.seed)
        self.rounds_per_epoch = len(self.pool) // self.batch_size  # verl's epoch length, as RandomSampler's
        self.rounds_drawn = 0
        self.steps = 0
        self.last_metrics: dict[str, float] = {}
        if not CURRICULUM_HOOK:  # verl >= 0.8: the legacy trainer's per-step dataset hook
            if getattr(data_source, "on_batch_end", None) is not None:
                raise ValueError("the verl dataset already has on_batch_end; L2RR's sampler needs that hook")
            data_source.on_batch_end = self.update

    def __iter__(self):
        """One epoch's rounds; an epoch ends at a multiple of rounds_per_epoch, so a run resumed
        mid-epoch (torchdata restores state_dict) finishes that epoch, not a fresh one."""
        while True:
            number = self.rounds_drawn
            self.rounds_drawn += 1  # before yielding: a resumed run never redraws a round it trained on
            yield from self.stream.round(number, self.run.q())
            if self.rounds_drawn % self.rounds_per_epoch == 0:
                return

    def __len__(self) -> int:
        return self.rounds_per_epoch * self.batch_size

    def update(self, batch: Any) -> None:
        """One verl step's batch (after rewards and advantages): observe, then let the policy learn."""
        positions, rewards = batch_rewards(batch, self.position_of, self.options.reward_key)
        step = self.steps
        counts = self.run.observe(step, positions, rewards)
        metrics = dict(self.run.end_step(step))
        metrics.update({f"zero_variance_groups/{name}": float(count) for name, count in counts.items()})
        self.last_metrics = metrics
        self.steps += 1
        log.info("L2RR step %d: %s", step, metrics)

    def state_dict(self) -> dict[str, Any]:
        """Saved by torchdata's StatefulDataLoader into verl's data.pt (q lives in the policy's state)."""
        return {"rounds_drawn": self.rounds_drawn, "steps": self.steps, "policy": self.run.policy.state_dict()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.rounds_drawn = int(state["rounds_drawn"])
        self.steps = int(state["steps"])
        self.run.policy.load_state_dict(dict(state["policy"]))


# -- route 1 (verl 0.8.0 - 0.9.1): verl's main_ppo with a TaskRunner that builds this sampler --------

def l2rr_sampler_factory(default: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
    """verl's `create_rl_sampler(data_config, dataset)`, building L2RRSampler when `data.l2rr` is set."""

    def create_rl_sampler(data_config: Any, dataset: Any) -> Any:
        if _get(data_config, "l2rr") is None:
            return default(data_config, dataset)
        return L2RRSampler(data_source=dataset, data_config=data_config)

    create_rl_sampler.l2rr_default = default  # type: ignore[attr-defined]
    return create_rl_sampler


def install_sampler_factory(module: Any) -> None:
    """Point `module.create_rl_sampler` (verl.trainer.main_ppo_v0's) at l2rr_sampler_factory, once."""
    current = module.create_rl_sampler
    if getattr(current, "l2rr_default", None) is None:
        module.create_rl_sampler = l2rr_sampler_factory(current)


def l2rr_task_runner() -> Any:
    """verl's legacy TaskRunner (a ray actor) whose run() builds L2RRSampler inside the actor's process."""
    import ray
    from verl.trainer import main_ppo_v0

    base = main_ppo_v0.TaskRunner.__ray_actor_class__

    class L2RRTaskRunner(base):  # type: ignore[misc, valid-type]
        def run(self, config: Any) -> Any:
            from verl.trainer import main_ppo_v0 as runner_module

            install_sampler_factory(runner_module)
            return super().run(config)

    return ray.remote(L2RRTaskRunner)


def check_launch_config(config: Any) -> None:
    """What route 1 needs of verl's config, checked before ray starts; errors name the key."""
    if _get(config.trainer, "use_v1", True):
        raise ValueError("trainer.use_v1 must be False: L2RR's sampler plugs into verl's legacy RayPPOTrainer "
                         "(the V1 trainer's dataloader sampler is not pluggable)")
    if _get(config.data, "l2rr") is None:
        raise ValueError("data.l2rr is not set (e.g. +data.l2rr.policy.name=l2rr); without it this is plain verl")
    read_options(config.data)


def main(argv: Sequence[str] | None = None) -> None:
    """`python -m trainer_node.integrations.verl <verl hydra overrides>` (docs/SCALE.md, "verl"). UNVERIFIED
    end to end: verl's trainer needs GPUs (ray workers with FSDP and a vLLM/SGLang rollout)."""
    import sys

    import hydra
    from verl.trainer import main_ppo
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config

    config_dir = str(Path(main_ppo.__file__).parent / "config")

    @hydra.main(config_path=config_dir, config_name="ppo_trainer", version_base=None)
    def run(config: Any) -> None:
        check_launch_config(config)
        main_ppo.auto_set_device(config)
        validate_config(config=config, use_reference_policy=need_reference_policy(config),
                        use_critic=need_critic(config))
        main_ppo.run_ppo(config, task_runner_class=l2rr_task_runner())

    if argv is not None:
        sys.argv = [sys.argv[0], *argv]
    run()


if __name__ == "__main__":
    main()
