"""The starting checkpoint's digest: what the bench pairs runs on (rlvr_core/models/tiny_policy.py)."""

import json

import pytest

from rlvr_core.models.tiny_policy import build_tiny_policy, checkpoint_digest, random_tiny_policy
from rlvr_core.models.tiny_spec import TinyPolicySpec

TEXTS = ["how many a in banana", "3", "calculate 2 + 2", "4"]


def test_the_digest_follows_weights_and_tokenizer_not_config_files(tmp_path):
    a = random_tiny_policy(tmp_path / "a", TEXTS, seed=0)
    b = random_tiny_policy(tmp_path / "b", TEXTS, seed=0)
    c = random_tiny_policy(tmp_path / "c", TEXTS, seed=1)
    assert checkpoint_digest(a) == checkpoint_digest(b)  # the same build on one machine: the same bytes
    assert checkpoint_digest(a) != checkpoint_digest(c)
    config = json.loads((a / "config.json").read_text())
    (a / "config.json").write_text(json.dumps({**config, "transformers_version": "0.0"}))
    assert checkpoint_digest(a) == checkpoint_digest(b)  # a library version note is not another start
    with pytest.raises(FileNotFoundError, match="no \\*.safetensors"):
        checkpoint_digest(tmp_path)


def test_the_build_record_notes_the_digest_and_the_cpu_kernels(tmp_path):
    spec = TinyPolicySpec(vocab_size=512, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2,
                          intermediate_size=64, max_position=128, sft_steps=2)
    directory = build_tiny_policy(spec, TEXTS, [("how many a in banana\nAnswer:", " 3")], tmp_path, progress=False)
    record = json.loads((tmp_path / f"{directory.name}.build.json").read_text())
    assert record["checkpoint_digest"] == checkpoint_digest(directory)
    assert record["cpu_capability"]  # e.g. "AVX512": another instruction set builds other weights
