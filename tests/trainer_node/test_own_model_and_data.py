"""A real organization's first day, end to end: `trainer-node train` with L2RR against a live owner (mTLS,
two organizations' CAs, the real evaluation worker, DP on) on the trainer's own model folders and its
own prompt sets, with a verifier of its own installed from a package.

Each model folder is written by transformers (save_pretrained, a hub snapshot, sharded weights) and
trains with feedback; a pickle-only folder is refused naming the conversion. Each prompt set (JSONL,
Parquet, verl's RL parquet) trains with feedback, scored by the acme_last_number plug-in. The owner
declares a chat rendering (chatml); the trainer renders its prompts the same way.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlvr_core.tasks.io import write_examples
from tests.deploy.conftest import heldout_examples, make_two_orgs, owner_config
from tests.plugin_install import install_verifier_plugin, verifiers_from
from tests.rlvr_core.model_folders import (
    hub_folder,
    pickle_only_folder,
    save_pretrained_folder,
    sharded_folder,
)
from trainer_node.cli import main

pa = pytest.importorskip("pyarrow")
parquet = pytest.importorskip("pyarrow.parquet")


@pytest.fixture(scope="module")
def owner(tmp_path_factory):
    """An owner node with the real worker, trusting the trainer org's CA, rendering with chatml."""
    from target_owner_node import logs
    from target_owner_node.config import parse_config
    from target_owner_node.server import start_server

    root = tmp_path_factory.mktemp("owner")
    orgs = make_two_orgs(root / "orgs")
    write_examples(root / "heldout.jsonl", heldout_examples())
    raw = owner_config(root / "storage", root, orgs, data={"chat_format": "chatml"},
                       privacy={"epsilon_budget": 8.0, "planned_releases": 400},
                       evaluation={"timeout_s": 300, "max_prompt_tokens": 64, "batch_size": 16})
    logs.configure(enabled=False)
    running = start_server(parse_config(raw, root))
    try:
        yield running, orgs
    finally:
        running.shutdown(grace_s=0, drain_delay_s=0)


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("models")
    return {"save_pretrained": save_pretrained_folder(root), "hub": hub_folder(root),
            "sharded": sharded_folder(root), "pickle_only": pickle_only_folder(root)}


def feedback_section(owner) -> str:
    running, orgs = owner
    return f"""
[feedback]
target = "localhost:{running.port}"
ca_cert = "{orgs.owner_ca_cert}"
client_cert = "{orgs.client_cert}"
client_key = "{orgs.client_key}"
"""


def run_config(tmp_path: Path, model: Path, data: str, owner) -> Path:
    config = tmp_path / "train.toml"
    config.write_text(f"""
[model]
path = "{model}"
[data]
eval_size = 2
{data}
[policy]
name = "l2rr"
batch_size = 2
rollouts_per_prompt = 2
lookahead_max_clusters = 1
[rollout]
max_new_tokens = 4
[run]
steps = 1
out_dir = "{tmp_path / 'run'}"
{feedback_section(owner)}
""")
    return config


MINI_TESTBED = """
name = "mini"
seed = 3
feedback_fraction = 0.5
[[source]]
task = "basic_arithmetic"
domain = "add"
size = 8
config = { min_terms = 2, max_terms = 2, min_digits = 1, max_digits = 1, operators = ["+"] }
[[target]]
task = "basic_arithmetic"
domain = "add"
size = 4
config = { min_terms = 2, max_terms = 2, min_digits = 1, max_digits = 2, operators = ["+"] }
"""


def trained_with_feedback(tmp_path: Path) -> dict:
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["feedback_queries"] >= 1 and summary["feedback_failures"] == 0, summary
    assert "chat format 'chatml'" in summary["rendering"], "prompts rendered as the owner publishes"
    return summary


@pytest.mark.parametrize("kind", ["save_pretrained", "hub", "sharded"])
def test_a_transformers_model_folder_trains_with_feedback(owner, folders, kind, tmp_path):
    (tmp_path / "mini.toml").write_text(MINI_TESTBED)
    config = run_config(tmp_path, folders[kind], 'testbed = "mini.toml"', owner)
    assert main(["train", "--config", str(config), "--no-progress"]) == 0
    trained_with_feedback(tmp_path)


def test_a_pickle_only_folder_is_refused_before_training(owner, folders, tmp_path, capsys):
    (tmp_path / "mini.toml").write_text(MINI_TESTBED)
    config = run_config(tmp_path, folders["pickle_only"], 'testbed = "mini.toml"', owner)
    assert main(["train", "--config", str(config), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "model.path" in err and "pickle files only" in err and "save_pretrained" in err
    assert "Traceback" not in err and not (tmp_path / "run" / "summary.json").exists()


@pytest.fixture(scope="module")
def plugin_site(tmp_path_factory):
    return install_verifier_plugin(tmp_path_factory.mktemp("plugin"))


def _rows(n: int = 8) -> list[dict]:
    return [{"question": f"What is {i} plus {i + 2}?", "result": 2 * i + 2, "topic": "small" if i < 4 else "big"}
            for i in range(n)]


def _verl_rows(n: int = 8) -> list[dict]:
    return [{"data_source": "small" if i < 4 else "big",
             "prompt": [{"role": "system", "content": "Reply with the number."},
                        {"role": "user", "content": f"What is {i} plus {i + 2}?"}],
             "ability": "math", "reward_model": {"style": "rule", "ground_truth": str(2 * i + 2)},
             "extra_info": {"index": i, "split": "train"}} for i in range(n)]


@pytest.mark.parametrize("layout", ["jsonl", "parquet", "verl"])
def test_own_prompt_sets_train_with_feedback_and_a_plugin_verifier(
    owner, folders, plugin_site, monkeypatch, tmp_path, layout
):
    if layout == "jsonl":
        path = tmp_path / "prompts.jsonl"
        path.write_text("".join(json.dumps(row) + "\n" for row in _rows()))
    else:
        path = tmp_path / f"prompts-{layout}.parquet"
        parquet.write_table(pa.Table.from_pylist(_verl_rows() if layout == "verl" else _rows()), path)
    columns = "" if layout == "verl" else 'columns = { prompt = "question", answer = "result", cluster = "topic" }'
    data = f"""
[data.prompts]
path = "{path.name}"
verifier = "acme_last_number"
{columns}
"""
    with verifiers_from(plugin_site, monkeypatch):
        config = run_config(tmp_path, folders["save_pretrained"], data, owner)
        assert main(["train", "--config", str(config), "--no-progress"]) == 0
    trained_with_feedback(tmp_path)
    resolved = json.loads((tmp_path / "run" / "resolved_config.json").read_text())
    assert resolved["data"]["prompts"]["path"] == str(path)  # resolved against the config file's folder
