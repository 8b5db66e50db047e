"""A LoRA run end to end: `simulate` with L2RR lookahead queries whose candidates are adapters.

The acceptance test of LoRA candidates (issue 14, goal 2): the owner process validates and
applies every adapter (a refused or failed query would count as a failure), and the bytes the
client's upload accounting says each query sent are exactly adapters: the base folder travels
once, with the run's first evaluation, never with a query.
"""

from __future__ import annotations

import json

import pytest
import torch

from lab.owner_process import OwnerProcess, init_owner
from rlvr_core.models.loading import load_policy
from tests.trainer_node.grpo_helpers import make_model_dir
from trainer_node.cli import main

pytest.importorskip("peft")

LORA = '[model.lora]\nr = 4\nalpha = 8\ntarget_modules = ["q_proj", "v_proj"]\n'


def _config(tmp_path, run_dir, model_dir, steps, extra=""):
    config = tmp_path / "sim.toml"
    config.write_text(f"""
[model]
path = "{model_dir}"
{LORA}
[data]
testbed = "small"
eval_size = 0
grader = {{ name = "noisy_flip", flip_rate = 0.45 }}  # a random tiny model scores 0: noisy rewards give groups
[policy]
name = "l2rr"
batch_size = 4
rollouts_per_prompt = 4
max_staleness = 0
[rollout]
max_new_tokens = 4
[run]
steps = {steps}
out_dir = "{run_dir}"
eval_every = 0
{extra}
""")
    return config


def _adapter_and_base_bytes(model_dir, tmp_path) -> tuple[int, int]:
    from trainer_node.feedback.adapters import AdapterCandidateWriter
    from trainer_node.lora import LoraSettings, apply_lora

    model, tokenizer = load_policy(model_dir, "cpu", torch.float32)
    model = apply_lora(model, LoraSettings(r=4, alpha=8, target_modules=["q_proj", "v_proj"]))
    writer = AdapterCandidateWriter(model, tokenizer, tmp_path / "sizes")
    written = writer.write(model.state_dict(keep_vars=True), "one")
    return written.sizes["adapter_model.safetensors"], writer.base_bytes


def test_simulate_with_lora_sends_only_adapters_per_query(tmp_path):
    model_dir = make_model_dir(tmp_path)
    run_dir = tmp_path / "run"
    config = _config(tmp_path, run_dir, model_dir, steps=2)
    assert main(["simulate", "--config", str(config), "--no-progress", "--epsilon", "20"]) == 0
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["feedback_failures"] == 0 and summary["feedback_queries"] >= 1
    assert summary["feedback_candidates"] > summary["feedback_queries"]  # lookahead candidates were scored
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    last = [r for r in records if r["kind"] == "train"][-1]
    adapter, base = _adapter_and_base_bytes(model_dir, tmp_path)
    query_bytes = last["feedback_query_uploaded_bytes"]
    # every byte a query sent is an adapter's: one per checkpoint of the query (base + candidates)
    assert query_bytes % adapter == 0
    assert summary["feedback_queries"] * adapter <= query_bytes <= summary["feedback_candidates"] * adapter
    assert query_bytes / summary["feedback_queries"] < 0.1 * base  # goal 2's bound, on the tiny policy
    # the base folder went once, with the evaluations' uploads
    assert base < summary["feedback_uploaded_bytes"] - query_bytes < 2 * base


def test_train_with_lora_against_an_owner_leaves_adapter_and_merged_checkpoints(tmp_path):
    owner_dir = tmp_path / "owner"
    init_owner(owner_dir, "small", dp=True, sample_rate=1.0, planned_releases=50)
    model_dir = make_model_dir(tmp_path)
    run_dir = tmp_path / "run"
    with OwnerProcess(owner_dir) as owner:
        settings = owner.client_settings()
        config = _config(tmp_path, run_dir, model_dir, steps=2, extra=f"""
[feedback]
target = "{settings.target}"
ca_cert = "{settings.ca_cert}"
client_cert = "{settings.client_cert}"
client_key = "{settings.client_key}"
server_name = "localhost"
""")
        assert main(["train", "--config", str(config), "--no-progress"]) == 0
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["feedback_failures"] == 0 and 0.0 <= summary["target_feedback_accuracy"] <= 1.0
    final = run_dir / "checkpoints" / "step_000002"
    assert {p.name for p in (final / "adapter").iterdir()} == {"adapter_config.json", "adapter_model.safetensors"}
    merged, _ = load_policy(final / "model", "cpu", torch.float32)  # a plain folder: the merged model
    assert not any(".lora_" in name for name in merged.state_dict())
