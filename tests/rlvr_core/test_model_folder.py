"""The trainer's own model folder (rlvr_core/models/model_folder.py): what save_pretrained and the hub
write loads; pickles never; the upload set built from it passes the owner's strict rule."""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import pytest
import torch

from protocol.validation import validate_checkpoint_dir
from rlvr_core.models.loading import UnsafeCheckpointError, save_policy
from rlvr_core.models.model_folder import check_uploadable, inspect_model_folder, load_model_folder
from rlvr_core.tasks.rendering import Rendering

from .model_folders import hub_folder, pickle_only_folder, save_pretrained_folder, sharded_folder


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("folders")
    return {"save_pretrained": save_pretrained_folder(root), "hub": hub_folder(root),
            "sharded": sharded_folder(root), "pickle_only": pickle_only_folder(root)}


@pytest.mark.parametrize("kind", ["save_pretrained", "hub", "sharded"])
def test_transformers_and_hub_folders_load_and_their_upload_set_passes_the_owner_rule(folders, kind, tmp_path):
    model, tokenizer = load_model_folder(folders[kind])
    assert not model.training and tokenizer.padding_side == "left"
    ids = torch.tensor([tokenizer("What is 2 plus 3? Answer:")["input_ids"]])
    with torch.no_grad():
        assert model(input_ids=ids).logits.shape[-1] == model.config.vocab_size
    upload = save_policy(model, tokenizer, tmp_path / "upload")
    names = sorted(p.name for p in upload.iterdir())
    assert "chat_template.jinja" not in names and "pytorch_model.bin" not in names
    assert "chat_template" not in json.loads((upload / "tokenizer_config.json").read_text())
    validate_checkpoint_dir(upload)  # the owner's upload rule, strict
    check_uploadable(model, tokenizer)


def test_the_chat_template_of_a_save_pretrained_folder_comes_along(folders):
    _, tokenizer = load_model_folder(folders["save_pretrained"])
    rendering = Rendering.from_tokenizer(tokenizer, "{prompt}")
    assert rendering is not None and rendering.render("hi") == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_hub_extras_are_ignored_and_a_pickle_beside_safetensors_is_only_warned_about(folders, caplog):
    folder = inspect_model_folder(folders["hub"])
    assert folder.weights == ("model.safetensors",) and folder.tokenizer_source == "tokenizer.json"
    assert {"README.md", "LICENSE", "banner.png", ".gitattributes"} <= set(folder.ignored)
    assert any("pytorch_model.bin" in w and "never loaded" in w for w in folder.warnings)
    with caplog.at_level("WARNING", logger="rlvr_core.models"):
        load_model_folder(folders["hub"])
    assert "pickle files are never loaded" in caplog.text


def test_a_sharded_folder_reads_every_shard_of_its_index(folders):
    folder = inspect_model_folder(folders["sharded"])
    assert len(folder.weights) > 1 and all(w.startswith("model-") for w in folder.weights)


def test_a_pickle_only_folder_is_refused_naming_the_conversion(folders, monkeypatch):
    def forbidden(*args, **kwargs):
        raise AssertionError("torch.load must never run")

    monkeypatch.setattr(torch, "load", forbidden)
    with pytest.raises(UnsafeCheckpointError, match=r"pickle files only \(pytorch_model.bin\).*save_pretrained"):
        load_model_folder(folders["pickle_only"])


def test_vocab_and_merges_without_tokenizer_json_are_converted(folders, tmp_path):
    folder = tmp_path / "gpt2_style"
    shutil.copytree(folders["hub"], folder)
    (folder / "tokenizer.json").unlink()
    assert inspect_model_folder(folder).tokenizer_source == "vocab.json + merges.txt"
    _, converted = load_model_folder(folder)
    _, original = load_model_folder(folders["hub"])
    text = "What is 4 plus 5? Answer:"
    assert converted(text)["input_ids"] == original(text)["input_ids"]


def test_sentencepiece_only_is_refused_saying_how_when_sentencepiece_is_missing(folders, tmp_path, monkeypatch):
    folder = tmp_path / "sp"
    shutil.copytree(folders["save_pretrained"], folder)
    (folder / "tokenizer.json").unlink()
    (folder / "tokenizer.model").write_bytes(b"\x0a\x00")
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "sentencepiece" else real(name, *a))
    with pytest.raises(UnsafeCheckpointError, match=r"tokenizer.model \(sentencepiece\).*pip install sentencepiece"):
        inspect_model_folder(folder)


def test_a_sentencepiece_tokenizer_is_converted_when_sentencepiece_is_installed(tmp_path):
    spm = pytest.importorskip("sentencepiece", reason="sentencepiece converts tokenizer.model (optional)")
    from transformers import LlamaConfig, LlamaForCausalLM

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(f"the sum of {i} and {i + 1} is {2 * i + 1}" for i in range(300)))
    spm.SentencePieceTrainer.train(input=str(corpus), model_prefix=str(tmp_path / "spm"), vocab_size=100,
                                   model_type="bpe", bos_id=1, eos_id=2, unk_id=0, pad_id=-1)
    folder = tmp_path / "llama"
    config = LlamaConfig(vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64,
                         bos_token_id=1, eos_token_id=2)
    LlamaForCausalLM(config).save_pretrained(str(folder))
    shutil.copy(tmp_path / "spm.model", folder / "tokenizer.model")
    (folder / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "LlamaTokenizer", "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}))
    model, tokenizer = load_model_folder(folder)
    assert tokenizer("the sum of 3")["input_ids"] and tokenizer.eos_token == "</s>"
    check_uploadable(model, tokenizer)


@pytest.mark.parametrize("problem", ["auto_map", "no_config", "missing_shard", "no_tokenizer", "not_a_dir"])
def test_what_the_own_folder_rule_refuses(folders, tmp_path, problem):
    folder = tmp_path / problem
    shutil.copytree(folders["sharded"], folder)
    expected = {"auto_map": "auto_map", "no_config": "no config.json", "missing_shard": "is missing",
                "no_tokenizer": "no tokenizer", "not_a_dir": "not a directory"}[problem]
    if problem == "auto_map":
        config = json.loads((folder / "config.json").read_text())
        config["auto_map"] = {"AutoModelForCausalLM": "modeling_evil.EvilModel"}
        (folder / "config.json").write_text(json.dumps(config))
    elif problem == "no_config":
        (folder / "config.json").unlink()
    elif problem == "missing_shard":
        min(folder.glob("model-*.safetensors")).unlink()
    elif problem == "no_tokenizer":
        (folder / "tokenizer.json").unlink()
    else:
        folder = tmp_path / "nothing"
    with pytest.raises(UnsafeCheckpointError, match=expected):
        inspect_model_folder(folder)


def test_a_model_the_owner_would_refuse_is_named_before_any_upload(folders):
    model, tokenizer = load_model_folder(folders["save_pretrained"])
    tokenizer.add_tokens(["<|extra|>"])  # an id past the embedding: the owner refuses it at upload
    with pytest.raises(UnsafeCheckpointError, match="the target owner would refuse.*embedding"):
        check_uploadable(model, tokenizer)
