"""LoRA training (trainer_node/lora.py): config edge, the PEFT wrap, adapter candidates, checkpoints."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from safetensors import safe_open

from protocol.adapter_rules import ADAPTER_CONFIG_FILE, ADAPTER_WEIGHTS_FILE
from protocol.validation import validate_checkpoint_dir
from rlvr_core.engines.registry import build_engine
from rlvr_core.models.loading import load_policy
from tests.trainer_node.grpo_helpers import (
    SAMPLING,
    make_model_dir,
    make_settings,
    render,
    toy_pool,
    toy_reward,
)
from trainer_node.config import ConfigError, parse_config
from trainer_node.feedback.adapters import AdapterCandidateWriter
from trainer_node.feedback.candidates import CandidateWriter, candidate_writer
from trainer_node.grpo.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from trainer_node.grpo.trainer import GRPOTrainer
from trainer_node.lora import LoraSettings, apply_lora, is_lora_model, merged_copy
from trainer_node.policies.base import build_policy

peft = pytest.importorskip("peft")

TINY = {"model": {"tiny": True}}
SETTINGS = LoraSettings(r=4, alpha=8.0, target_modules=["q_proj", "v_proj"])


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_model_dir(tmp_path_factory.mktemp("lora"))


def lora_trainer(model_dir, settings: LoraSettings = SETTINGS, **grpo) -> GRPOTrainer:
    torch.manual_seed(0)
    model, tokenizer = load_policy(model_dir, "cpu", torch.float32)
    model = apply_lora(model, settings)
    pool = toy_pool()
    policy = build_policy({"name": "uniform", "batch_size": 4, "rollouts_per_prompt": 4}, pool,
                          np.random.default_rng(3))
    return GRPOTrainer(model=model, tokenizer=tokenizer, engine=build_engine("transformers", model, tokenizer),
                       policy=policy, pool=pool, render=render, reward_fn=toy_reward,
                       settings=make_settings(**grpo), sampling=SAMPLING)


# --- config edge ------------------------------------------------------------------------------

def _error(lora: dict) -> str:
    with pytest.raises(ConfigError) as info:
        parse_config({"model": {"tiny": True, "lora": lora}})
    return str(info.value)


def test_lora_section_loads_with_defaults():
    config = parse_config({"model": {"tiny": True, "lora": {}}})
    assert config.model.lora == LoraSettings()
    assert parse_config(TINY).model.lora is None


@pytest.mark.parametrize("lora, field", [
    ({"r": 0}, "model.lora.r"),
    ({"r": 257}, "model.lora.r"),
    ({"alpha": 0}, "model.lora.alpha"),
    ({"alpha": float("inf")}, "model.lora.alpha"),
    ({"target_modules": []}, "model.lora.target_modules"),
    ({"target_modules": ["q-proj"]}, "model.lora.target_modules"),
    ({"target_modules": ["q_proj", "q_proj"]}, "model.lora.target_modules"),
    ({"target_modules": ["lm_head"]}, "model.lora.target_modules"),
    ({"dropout": 0.1}, "model.lora.dropout"),
    ({"rank": 4}, "model.lora.rank"),
])
def test_values_the_owner_would_refuse_fail_at_config_load_naming_the_field(lora, field):
    assert field in _error(lora)


def test_an_engine_without_lora_is_refused_at_config_load():
    with pytest.raises(ConfigError, match="model.lora"):
        parse_config({"model": {"tiny": True, "lora": {}}, "engine": {"name": "trl"},
                      "policy": {"name": "l2rr", "estimator": "release_difference"}})


# --- the PEFT wrap -----------------------------------------------------------------------------

def test_only_the_adapter_trains_and_the_optimizer_holds_only_it(model_dir):
    trainer = lora_trainer(model_dir)
    assert is_lora_model(trainer.model)
    trained = [n for n, p in trainer.model.named_parameters() if p.requires_grad]
    assert trained and all(".lora_A." in n or ".lora_B." in n for n in trained)
    held = {id(p) for group in trainer.optimizer.param_groups for p in group["params"]}
    assert held == {id(p) for p in trainer.model.parameters() if p.requires_grad}
    frozen = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if not p.requires_grad}
    lora = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}
    for _ in range(2):
        trainer.train_step()
    after = dict(trainer.model.named_parameters())
    assert all(torch.equal(after[n], v) for n, v in frozen.items())  # the base never moves
    assert any(not torch.equal(after[n], v) for n, v in lora.items())  # the adapter does


def test_apply_lora_refuses_what_the_owner_cannot_apply(model_dir):
    model, _ = load_policy(model_dir, "cpu", torch.float32)
    with pytest.raises(ConfigError, match=r"model\.lora\.target_modules: .*no module named 'w_proj'"):
        apply_lora(model, LoraSettings(target_modules=["w_proj"]))
    with pytest.raises(ConfigError, match=r"model\.lora\.target_modules: 'rotary_emb' is not a linear layer"):
        apply_lora(model, LoraSettings(target_modules=["rotary_emb"]))
    from transformers import GPT2Config, GPT2LMHeadModel

    gpt2 = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=64, n_positions=32))
    with pytest.raises(ConfigError, match="model.lora: .*GPT2LMHeadModel"):  # Conv1D: stored transposed
        apply_lora(gpt2, LoraSettings(target_modules=["c_attn"]))


# --- adapter candidates -----------------------------------------------------------------------

def test_adapter_candidates_are_the_base_once_plus_an_adapter_the_owner_accepts(model_dir, tmp_path):
    trainer = lora_trainer(model_dir)
    writer = candidate_writer(trainer.model, trainer.tokenizer, tmp_path / "w")
    assert isinstance(writer, AdapterCandidateWriter)
    first = writer.write(trainer.current_state_dict(), "base")
    checked = validate_checkpoint_dir(first.directory)  # the owner's whole upload rule
    assert checked.adapter is not None and checked.adapter.rank == 4 and checked.adapter.scale == 2.0
    assert {m.module.rsplit(".", 1)[-1] for m in checked.adapter.modules} == {"q_proj", "v_proj"}
    # the tensor names are PEFT's own (save_pretrained writes the same)
    peft_dir = tmp_path / "peft"
    trainer.model.save_pretrained(str(peft_dir))
    with safe_open(str(peft_dir / ADAPTER_WEIGHTS_FILE), "pt") as a, \
            safe_open(str(first.directory / ADAPTER_WEIGHTS_FILE), "pt") as b:
        assert sorted(a.keys()) == sorted(b.keys())
    trainer.train_step()
    groups = trainer.policy.training_groups(0, trainer.sample_and_rollout(1))
    candidates = trainer.lookahead_state_dicts(groups, [[1.0] * len(groups), [0.0] + [1.0] * (len(groups) - 1)])
    for candidate in candidates:  # the lookahead stepped only the adapter; frozen tensors are the live ones
        live = trainer.model.state_dict(keep_vars=True)
        for name, tensor in candidate.items():
            if ".lora_" not in name:
                assert tensor.data_ptr() == live[name].data_ptr(), name
    written = [writer.write(state, f"cand{i}") for i, state in enumerate(candidates)]
    for other in written:  # only the adapter differs from the first checkpoint's files
        changed = {name for name, digest in other.digests.items() if first.digests[name] != digest}
        assert changed == {ADAPTER_WEIGHTS_FILE}
        validate_checkpoint_dir(other.directory)
    assert written[0].digests[ADAPTER_WEIGHTS_FILE] != written[1].digests[ADAPTER_WEIGHTS_FILE]
    adapter_size = first.sizes[ADAPTER_WEIGHTS_FILE]
    assert adapter_size < 0.1 * writer.base_bytes
    assert json.loads((first.directory / ADAPTER_CONFIG_FILE).read_text())["r"] == 4


def test_a_full_parameter_model_keeps_the_per_tensor_writer(model_dir, tmp_path):
    model, tokenizer = load_policy(model_dir, "cpu", torch.float32)
    assert isinstance(candidate_writer(model, tokenizer, tmp_path), CandidateWriter)


# --- checkpoints ---------------------------------------------------------------------------------

def test_checkpoint_holds_the_adapter_and_a_merged_folder_and_resumes(model_dir, tmp_path):
    trainer = lora_trainer(model_dir)
    trainer.train_step()
    checkpoint = save_checkpoint(trainer, tmp_path / "ck")
    assert sorted(p.name for p in (checkpoint / "adapter").iterdir()) == [ADAPTER_CONFIG_FILE, ADAPTER_WEIGHTS_FILE]
    # model/ is a plain folder: the merged weights give the LoRA model's logits
    merged, _ = load_policy(checkpoint / "model", "cpu", torch.float32)
    ids = torch.tensor([[5, 9, 13, 17]])
    with torch.no_grad():
        assert torch.allclose(merged(input_ids=ids).logits, trainer.model(input_ids=ids).logits, atol=1e-5)
    # and the adapter folder loads with PEFT on the base
    base, _ = load_policy(model_dir, "cpu", torch.float32)
    loaded = peft.PeftModel.from_pretrained(base, str(checkpoint / "adapter"))
    with torch.no_grad():
        assert torch.allclose(loaded(input_ids=ids).logits, trainer.model(input_ids=ids).logits, atol=1e-5)
    straight = trainer.train_step()
    resumed = lora_trainer(model_dir)
    load_checkpoint(resumed, checkpoint)
    again = resumed.train_step()
    assert again["loss"] == pytest.approx(straight["loss"], abs=1e-6)
    live = {n: p for n, p in trainer.model.named_parameters() if p.requires_grad}
    assert all(torch.allclose(p, live[n], atol=1e-6) for n, p in resumed.model.named_parameters() if p.requires_grad)


def test_resume_refuses_a_checkpoint_of_the_other_kind(model_dir, tmp_path):
    from tests.trainer_node.grpo_helpers import make_trainer

    full = save_checkpoint(make_trainer(model_dir), tmp_path / "full")
    with pytest.raises(CheckpointError, match="full-parameter run"):
        load_checkpoint(lora_trainer(model_dir), full)
    lora = save_checkpoint(lora_trainer(model_dir), tmp_path / "lora")
    with pytest.raises(CheckpointError, match="LoRA run"):
        load_checkpoint(make_trainer(model_dir), lora)
    other = lora_trainer(model_dir, LoraSettings(r=2, target_modules=["q_proj", "v_proj"]))
    before = {n: p.detach().clone() for n, p in other.model.named_parameters()}
    with pytest.raises(CheckpointError, match="shape"):
        load_checkpoint(other, lora)
    assert all(torch.equal(p, before[n]) for n, p in other.model.named_parameters())  # nothing changed


def test_merged_copy_leaves_the_live_model_wrapped(model_dir):
    trainer = lora_trainer(model_dir)
    merged = merged_copy(trainer.model)
    assert not is_lora_model(merged) and is_lora_model(trainer.model)
