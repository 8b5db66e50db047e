"""The verl adapter driven through verl's own interface, on CPU, in verl's environment
(scripts/verl_env.sh; skipped where verl is not installed).

What runs here is verl's: RLHFDataset on a parquet file in verl's RL layout, verl's sampler
construction (`main_ppo_v0.create_rl_sampler`, which route 1's TaskRunner replaces), its
StatefulDataLoader + collate_fn, DataProto batches built as `RayPPOTrainer.fit` builds them
(uid, repeat(interleave), union of the rollout), verl's own GRPO `compute_advantage`, and the
trainer's per-step hook call (`train_dataset.on_batch_end(batch=batch)` on verl >= 0.8,
`sampler.update(batch=batch)` on verl <= 0.7.1). What does not run: ray workers, FSDP, the
vLLM/SGLang rollout and `fit` itself (they need GPUs); the rollout's tensors are made up here.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import numpy as np
import pytest

verl = pytest.importorskip("verl")

import torch
from omegaconf import OmegaConf
from torchdata.stateful_dataloader import StatefulDataLoader
from verl import DataProto
from verl.trainer.ppo.ray_trainer import compute_advantage
from verl.utils.dataset.rl_dataset import RLHFDataset, collate_fn

from trainer_node.integrations import verl as adapter

CLUSTERS = ("algebra", "geometry", "counting")
ROWS, ROUND, N = 24, 4, 4  # dataset rows, prompts per round (gen_batch_size), responses per prompt
RESPONSE_LEN = 6


@pytest.fixture(scope="module")
def train_file(tmp_path_factory) -> Path:
    import pandas as pd

    folder = tmp_path_factory.mktemp("verl_data")
    rows = pd.DataFrame({
        "data_source": [CLUSTERS[i % 3] for i in range(ROWS)],
        "prompt": [[{"role": "user", "content": f"question {i}"}] for i in range(ROWS)],
        "ability": ["math"] * ROWS,
        "reward_model": [{"style": "rule", "ground_truth": str(i)} for i in range(ROWS)],
        "extra_info": [{"index": 100 + i, "split": "train"} for i in range(ROWS)],  # ids, not positions
    })
    rows.to_parquet(folder / "train.parquet")
    return folder / "train.parquet"


@pytest.fixture(scope="module")
def tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = Tokenizer(models.WordLevel({"<eos>": 0, "<unk>": 1}, unk_token="<unk>"))
    words.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=words, eos_token="<eos>", pad_token="<eos>", unk_token="<unk>")


def data_config(tmp_path: Path, **l2rr):
    return OmegaConf.create({
        "train_batch_size": ROUND, "gen_batch_size": ROUND, "seed": 0, "shuffle": True,
        "dataloader_num_workers": 0, "prompt_key": "prompt", "max_prompt_length": 64,
        "max_response_length": 8, "filter_overlong_prompts": False, "truncation": "error",
        "return_raw_chat": False, "cache_dir": str(tmp_path / "cache"),
        **({"l2rr": l2rr} if l2rr else {}),
    })


def dataset_for(train_file: Path, tokenizer, config) -> RLHFDataset:
    return RLHFDataset(data_files=[str(train_file)], tokenizer=tokenizer, config=config)


def verl_sampler(config, dataset):
    """The sampler verl's legacy TaskRunner builds, with route 1's factory installed (verl >= 0.8),
    or verl <= 0.7.1's own data.sampler.class_path loader."""
    if adapter.CURRICULUM_HOOK:
        from verl.trainer.main_ppo import create_rl_sampler

        config = OmegaConf.merge(config, {"sampler": {"class_path": "pkg://trainer_node.integrations.verl",
                                                      "class_name": "L2RRSampler"}})
        return create_rl_sampler(config, dataset)
    from verl.trainer import main_ppo_v0

    adapter.install_sampler_factory(main_ppo_v0)
    return main_ppo_v0.create_rl_sampler(config, dataset)


def step_batch(batch_dict, accuracy_of_row) -> DataProto:
    """One step's batch as RayPPOTrainer.fit builds it, rewards from `accuracy_of_row(index, k)`."""
    batch = DataProto.from_single_dict(batch_dict)
    batch.non_tensor_batch["uid"] = np.array([str(uuid.uuid4()) for _ in range(len(batch.batch))], dtype=object)
    batch = batch.repeat(repeat_times=N, interleave=True)
    rows = len(batch)
    batch = batch.union(DataProto.from_dict(tensors={
        "prompts": torch.zeros(rows, 8, dtype=torch.long),
        "responses": torch.ones(rows, RESPONSE_LEN, dtype=torch.long),
        "response_mask": torch.ones(rows, RESPONSE_LEN, dtype=torch.long),
        "input_ids": torch.zeros(rows, 8 + RESPONSE_LEN, dtype=torch.long),
        "attention_mask": torch.ones(rows, 8 + RESPONSE_LEN, dtype=torch.long),
        "position_ids": torch.arange(8 + RESPONSE_LEN).expand(rows, -1).clone(),
    }))
    index = batch.non_tensor_batch["index"]
    acc = torch.tensor([accuracy_of_row(int(i), k % N) for k, i in enumerate(index)], dtype=torch.float32)
    scores = torch.zeros(rows, RESPONSE_LEN)
    scores[:, -1] = acc  # verl puts the sequence score on the last response token
    batch.batch["token_level_scores"] = scores
    batch.batch["token_level_rewards"] = scores
    batch.non_tensor_batch["acc"] = acc.numpy()
    batch = compute_advantage(batch, adv_estimator="grpo", num_repeat=N, norm_adv_by_std_in_grpo=True)
    perm = torch.randperm(rows, generator=torch.Generator().manual_seed(len(index)))
    return batch[perm]  # balance_batch reorders the rows: the adapter must group by row, not position


def run_hook(dataset, sampler, batch) -> None:
    """What RayPPOTrainer.fit does after each step (0.9.1 ray_trainer.py:1818; 0.7.1: 1599 and 1625)."""
    if adapter.CURRICULUM_HOOK and isinstance(sampler, adapter.SAMPLER_BASE):
        sampler.update(batch=batch)
    if hasattr(dataset, "on_batch_end"):
        dataset.on_batch_end(batch=batch)


def cluster_of_row(row: int) -> str:
    return CLUSTERS[(row - 100) % 3]


def algebra_is_solved(row: int, k: int) -> float:
    """algebra: every response right (zero variance, wasted); the others: half right."""
    return 1.0 if cluster_of_row(row) == "algebra" else float(k % 2)


# --- the index stream ---------------------------------------------------------------------------


def test_verl_builds_the_sampler_and_its_dataloader_yields_the_cores_rounds(train_file, tokenizer, tmp_path):
    config = data_config(tmp_path, seed=5)
    dataset = dataset_for(train_file, tokenizer, config)
    sampler = verl_sampler(config, dataset)
    assert isinstance(sampler, adapter.L2RRSampler)
    if adapter.CURRICULUM_HOOK:  # verl <= 0.7.1: its trainer calls update() behind this isinstance check
        from verl.experimental.dataset.sampler import AbstractCurriculumSampler

        assert isinstance(sampler, AbstractCurriculumSampler) and not hasattr(dataset, "on_batch_end")
    else:  # without data.l2rr verl keeps its own sampler
        from verl.trainer import main_ppo_v0

        plain = main_ppo_v0.create_rl_sampler(data_config(tmp_path), dataset_for(train_file, tokenizer,
                                                                                 data_config(tmp_path)))
        assert not isinstance(plain, adapter.L2RRSampler)
    loader = StatefulDataLoader(dataset=dataset, batch_size=ROUND, num_workers=0, drop_last=True,
                                collate_fn=collate_fn, sampler=sampler)
    assert len(loader) == ROWS // ROUND  # one epoch = as many steps as verl's RandomSampler gives
    q = sampler.run.q()
    for number, batch in enumerate(loader):
        expected = sampler.stream.round(number, q)
        assert [int(i) - 100 for i in batch["index"]] == expected  # positions through extra_info.index
        assert len(set(expected)) == ROUND
    again = adapter.L2RRSampler(dataset_for(train_file, tokenizer, config), config)
    assert list(again) == [i for r in range(ROWS // ROUND) for i in sampler.stream.round(r, q)]  # (seed, round)


def test_bad_configs_are_refused_naming_the_key(train_file, tokenizer, tmp_path):
    config = data_config(tmp_path)
    config.dataloader_num_workers = 2
    with pytest.raises(ValueError, match="data.dataloader_num_workers"):
        adapter.L2RRSampler(dataset_for(train_file, tokenizer, config), OmegaConf.merge(config, {"l2rr": {}}))
    config = data_config(tmp_path, policy={"name": "l2rr", "estimator": "lookahead"})
    with pytest.raises(ValueError, match="policy.estimator: 'lookahead' needs lookahead candidates"):
        adapter.L2RRSampler(dataset_for(train_file, tokenizer, config), config)
    config = data_config(tmp_path, policy={"name": "dapo"})
    with pytest.raises(ValueError, match="policy.name: 'dapo' chooses its prompts itself"):
        adapter.L2RRSampler(dataset_for(train_file, tokenizer, config), config)
    with pytest.raises(ValueError, match=r"(?s)data.l2rr: .*reward_kye.*did you mean 'reward_key'"):
        adapter.read_options(OmegaConf.create({"l2rr": {"reward_kye": "acc"}}))
    launch = OmegaConf.create({"trainer": {"use_v1": True}, "data": {"l2rr": {}}})
    with pytest.raises(ValueError, match="trainer.use_v1 must be False"):
        adapter.check_launch_config(launch)


# --- the observe path ---------------------------------------------------------------------------


@pytest.mark.parametrize("reward_key", ["token_level_scores", "acc"])
def test_update_counts_zero_variance_groups_per_cluster_from_verl_batches(train_file, tokenizer, tmp_path,
                                                                           reward_key):
    config = data_config(tmp_path, reward_key=reward_key)
    dataset = dataset_for(train_file, tokenizer, config)
    sampler = verl_sampler(config, dataset)
    loader = StatefulDataLoader(dataset=dataset, batch_size=ROUND, num_workers=0, drop_last=True,
                                collate_fn=collate_fn, sampler=sampler)
    seen = {name: 0 for name in CLUSTERS}
    for step, batch_dict in zip(range(3), loader):
        for i in batch_dict["index"]:
            seen[cluster_of_row(int(i))] += 1
        run_hook(dataset, sampler, step_batch(batch_dict, algebra_is_solved))
        counts = {name: sampler.last_metrics[f"zero_variance_groups/{name}"] for name in CLUSTERS}
        assert sampler.steps == step + 1
    assert sampler.run.groups_seen == 3 * ROUND
    assert sampler.run.zero_variance_groups == seen["algebra"]  # every algebra group, nothing else
    assert counts["geometry"] == counts["counting"] == 0
    state = loader.state_dict()  # torchdata keeps the sampler's own state (verl writes it to data.pt)
    assert json.loads(json.dumps(state["_sampler_iter_state"]["sampler_state"]["rounds_drawn"])) == 3


def test_a_resumed_dataloader_draws_the_round_it_would_have_drawn(train_file, tokenizer, tmp_path):
    """verl saves train_dataloader.state_dict() in data.pt and loads it on resume: torchdata keeps the
    sampler's own state_dict (rounds drawn, steps, the policy's q), so the run goes on where it was."""

    def fresh():
        config = data_config(tmp_path, seed=3)
        dataset = dataset_for(train_file, tokenizer, config)
        sampler = verl_sampler(config, dataset)
        return sampler, dataset, StatefulDataLoader(dataset=dataset, batch_size=ROUND, num_workers=0,
                                                    drop_last=True, collate_fn=collate_fn, sampler=sampler)

    sampler, dataset, loader = fresh()
    batches = iter(loader)
    for _ in range(2):
        run_hook(dataset, sampler, step_batch(next(batches), algebra_is_solved))
    state = loader.state_dict()
    third = [int(i) for i in next(batches)["index"]]
    rest = [[int(i) for i in batch["index"]] for batch in batches]
    resumed, _, loader2 = fresh()
    loader2.load_state_dict(state)
    again = [[int(i) for i in batch["index"]] for batch in loader2]
    assert again == [third, *rest] and len(again) == ROWS // ROUND - 2  # the rest of the epoch, no more
    assert resumed.steps == 2 and resumed.run.policy.state_dict() == sampler.run.policy.state_dict()


def test_a_batch_that_does_not_match_the_dataset_is_refused(train_file, tokenizer, tmp_path):
    config = data_config(tmp_path, seed=1)
    dataset = dataset_for(train_file, tokenizer, config)
    sampler = verl_sampler(config, dataset)
    batch_dict = next(iter(StatefulDataLoader(dataset=dataset, batch_size=ROUND, collate_fn=collate_fn,
                                              sampler=sampler)))
    batch = step_batch(batch_dict, algebra_is_solved)
    batch.non_tensor_batch["index"] = np.full(len(batch), 7, dtype=object)
    with pytest.raises(ValueError, match="index 7 is not an extra_info.index"):
        sampler.update(batch)
    with pytest.raises(ValueError, match="data.l2rr.reward_key: the batch has no 'score'"):
        adapter.batch_rewards(step_batch(batch_dict, algebra_is_solved), sampler.position_of, "score")


# --- feedback from the checkpoints verl saves, against a real owner process -----------------------


def save_verl_checkpoint(root: Path, step: int, model_dir: Path) -> None:
    """What verl's checkpoint manager leaves with save_contents including hf_model (rank 0): the HF
    folder beside FSDP shards and pickled optimizer state, then the iteration marker."""
    import shutil

    actor = root / f"global_step_{step}" / "actor"
    shutil.copytree(model_dir, actor / "huggingface")
    (actor / "model_world_size_1_rank_0.pt").write_bytes(b"not uploaded")
    (actor / "huggingface" / "training_args.bin").write_bytes(b"pickle: never uploaded")
    (root / "latest_checkpointed_iteration.txt").write_text(str(step))


def test_feedback_releases_verls_latest_hf_checkpoint_and_moves_q(train_file, tokenizer, tmp_path):
    """Acceptance: three verl steps against a real target-owner process (DP on): each query uploads
    verl's latest HF checkpoint (its allowlisted files only) and is released once; epsilon is
    charged and q moves once two releases differ."""
    from lab.owner_process import OwnerProcess, init_owner
    from tests.trainer_node.grpo_helpers import make_model_dir

    owner_dir = tmp_path / "owner"
    init_owner(owner_dir, "small", dp=True, sample_rate=1.0, planned_releases=20)
    model_dir = make_model_dir(tmp_path)
    checkpoints = tmp_path / "verl_ckpt"
    with OwnerProcess(owner_dir) as owner:
        settings = owner.client_settings()
        feedback = {"target": settings.target, "ca_cert": str(settings.ca_cert),
                    "client_cert": str(settings.client_cert), "client_key": str(settings.client_key),
                    "server_name": "localhost"}
        config = data_config(tmp_path, checkpoint_dir=str(checkpoints), total_steps=3, feedback=feedback,
                             policy={"name": "l2rr", "estimator": "release_difference", "eta_q": 5.0,
                                     "max_staleness": 0})  # synchronous: 3 steps, 3 releases
        dataset = dataset_for(train_file, tokenizer, config)
        sampler = verl_sampler(config, dataset)
        loader = StatefulDataLoader(dataset=dataset, batch_size=ROUND, num_workers=0, drop_last=True,
                                    collate_fn=collate_fn, sampler=sampler)
        q_start = sampler.run.q().copy()
        batches = iter(loader)
        for step in range(3):
            q_now = sampler.run.q().copy()
            batch_dict = next(batches)  # drawn after the last step's update: no round is prefetched
            assert [int(i) - 100 for i in batch_dict["index"]] == sampler.stream.round(step, q_now)
            save_verl_checkpoint(checkpoints, step + 1, model_dir)  # fit saves before the hook runs
            run_hook(dataset, sampler, step_batch(batch_dict, algebra_is_solved))
        sampler.run.finish(sampler.steps)
        stats = sampler.run.feedback.stats
        owner.check_alive()
    assert stats.queries >= 2 and stats.failures == 0
    assert stats.epsilon_spent > 0 and stats.uploaded_bytes > 0
    assert not (checkpoints / "l2rr_feedback" / "staged").exists() or not any(
        (checkpoints / "l2rr_feedback" / "staged").iterdir())  # staged copies are removed after upload
    assert not np.allclose(sampler.run.q(), q_start)


# --- route 1's launch: verl's own Hydra config and TaskRunner ---------------------------------------

PAPER_OVERRIDES = [  # docs/SCALE.md's launch command (the paper's setting), minus the data paths
    "algorithm.adv_estimator=grpo", "data.train_batch_size=256", "data.gen_batch_size=384",
    "data.max_prompt_length=1024", "data.max_response_length=3072", "data.dataloader_num_workers=0",
    "actor_rollout_ref.model.path=Qwen/Qwen2.5-Math-1.5B", "actor_rollout_ref.rollout.name=vllm",
    "actor_rollout_ref.rollout.n=8", "actor_rollout_ref.actor.strategy=fsdp2",
    "actor_rollout_ref.actor.ppo_mini_batch_size=64", "actor_rollout_ref.actor.clip_ratio_high=0.28",
    "actor_rollout_ref.actor.loss_agg_mode=token-mean", "actor_rollout_ref.actor.use_kl_loss=False",
    "actor_rollout_ref.actor.checkpoint.save_contents=[model,optimizer,extra,hf_model]",
    "trainer.n_gpus_per_node=8", "trainer.nnodes=1", "trainer.save_freq=10", "trainer.total_training_steps=300",
    "trainer.use_v1=False", "+data.l2rr.policy.name=l2rr", "+data.l2rr.policy.estimator=release_difference",
    "+data.l2rr.checkpoint_dir=${trainer.default_local_dir}", "+data.l2rr.total_steps=${trainer.total_training_steps}",
]


def test_the_documented_launch_config_composes_with_verls_hydra_config():
    from hydra import compose, initialize_config_dir
    from verl.trainer import main_ppo

    if adapter.CURRICULUM_HOOK:
        pytest.skip("route 1 is verl >= 0.8's; verl <= 0.7.1 loads the class through data.sampler")
    with initialize_config_dir(config_dir=str(Path(main_ppo.__file__).parent / "config"), version_base=None):
        config = compose(config_name="ppo_trainer", overrides=PAPER_OVERRIDES)
    adapter.check_launch_config(config)
    options = adapter.read_options(config.data)
    assert options.checkpoint_dir == config.trainer.default_local_dir and options.total_steps == 300
    assert options.policy == {"name": "l2rr", "estimator": "release_difference"}
    runner = adapter.l2rr_task_runner()  # a ray actor class; building it starts no ray cluster
    from verl.trainer import main_ppo_v0

    assert issubclass(runner.__ray_actor_class__, main_ppo_v0.TaskRunner.__ray_actor_class__)


def test_the_entry_point_refuses_verls_v1_trainer_before_starting_ray(tmp_path, monkeypatch, capsys):
    if adapter.CURRICULUM_HOOK:
        pytest.skip("route 1 is verl >= 0.8's")
    monkeypatch.chdir(tmp_path)  # Hydra writes its outputs/ folder here
    monkeypatch.setattr(adapter, "l2rr_task_runner", lambda: pytest.fail("ray must not start"))
    with pytest.raises(SystemExit):
        adapter.main(["trainer.use_v1=True", "+data.l2rr.policy.name=l2rr"])
    assert "trainer.use_v1 must be False" in capsys.readouterr().err
