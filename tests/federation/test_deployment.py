"""A real Flower deployment (issue 17): `flwr run flower-app` against a local SuperLink (TLS, SuperNode
authentication) and two SuperNodes, each configured with its own owner's `target-owner-node serve`
(--node-config: address and the trainer's client certificate); the trainer is the ServerApp, the
owners' ClientApp is the shim. A short training run finishes with feedback from both owners.

The fast variant runs the same ServerApp code (`run_deployment`) and the same shim, resolving its
owner from a deployment's node_config, on an in-process grid against two in-process owner servers:
no SuperLink and no processes, so seconds instead of minutes.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import pytest

from lab.federation import owner_testbeds, write_testbed
from lab.owner_process import OwnerProcess, init_owner
from rlvr_core.tasks.testbed import load_testbed
from tests.deploy.conftest import StubScorer, in_process_owner, owner_config
from tests.trainer_node.conftest import data_dir, orgs  # noqa: F401 - fixtures
from tests.trainer_node.grpo_helpers import make_model_dir
from trainer_node.federation.local_deployment import LocalDeployment, OwnerSite
from trainer_node.federation.server_app import DeploymentOptions, run_deployment

TESTBED = Path(__file__).with_name("three_owners.toml")
OWNERS = ("owner0", "owner1")


def train_config(tmp_path: Path, run_dir: Path, steps: int = 2) -> Path:
    """A `train` config without [feedback]: over Flower the owners are the run's SuperNodes."""
    config = tmp_path / "train.toml"
    config.write_text(f"""
[model]
path = "{make_model_dir(tmp_path)}"
[data]
testbed = "{TESTBED}"
eval_size = 0
[policy]
name = "l2rr"
batch_size = 2
rollouts_per_prompt = 2
[rollout]
max_new_tokens = 4
[run]
steps = {steps}
out_dir = "{run_dir}"
eval_every = 0
""")
    return config


def check_summary(summary: dict) -> None:
    assert summary["transport"] == "flower" and summary["num_owners"] == 2
    assert set(summary["owners"]) == set(OWNERS) and summary["owners_lost"] == []
    for name in OWNERS:
        owner = summary["owners"][name]
        assert owner["queries"] >= 1, owner  # at least the final release, charged by that owner
        assert owner["epsilon_spent"] > 0 and owner["lost_step"] is None
        assert isinstance(owner["last_accuracy"], float)  # a DP-noised release from that owner's node


@contextlib.contextmanager
def two_owner_grid(organisations, heldout_dir, tmp_path, nodes=(11, 22)):
    """Two in-process owners (stub scores 0.2 and 0.8) behind the deployment ClientApp, on `nodes`."""
    from flower_shim.app import make_client_app, settings_from_node_config
    from trainer_node.federation.loopback_grid import LoopbackGrid

    ours, _ = organisations
    with in_process_owner(owner_config(tmp_path / "a", heldout_dir, ours), tmp_path, StubScorer(0.2)) as a, \
            in_process_owner(owner_config(tmp_path / "b", heldout_dir, ours), tmp_path, StubScorer(0.8)) as b:
        sites = [OwnerSite(name, f"127.0.0.1:{owner.port}", ours.owner_ca_cert, ours.client_cert, ours.client_key)
                 for name, owner in zip(OWNERS, (a, b), strict=True)]
        yield LoopbackGrid(make_client_app(settings_from_node_config),
                           {node: site.node_config_values() for node, site in zip(nodes, sites, strict=True)})


def test_the_deployment_server_app_trains_with_two_owners_on_an_in_process_grid(orgs, data_dir, tmp_path):  # noqa: F811
    with two_owner_grid(orgs, data_dir, tmp_path) as grid:
        run_dir = tmp_path / "run"
        summary = run_deployment(grid, DeploymentOptions(
            train_config=train_config(tmp_path, run_dir), owners=OWNERS, owner_nodes={"owner0": 11, "owner1": 22},
            startup_timeout_s=10))
    check_summary(summary)
    assert json.loads((run_dir / "summary.json").read_text())["owners"] == summary["owners"]
    assert summary["owners"]["owner0"]["weight"] == pytest.approx(0.5)  # equal public held-out sizes


@pytest.fixture()
def owner_nodes(tmp_path):
    """Two owners, each its own target domain, owner folder and `target-owner-node serve` process."""
    specs = owner_testbeds(load_testbed(TESTBED), 3)[:2]
    processes = {}
    try:
        for name, spec in zip(OWNERS, specs, strict=True):
            testbed = write_testbed(spec, tmp_path / f"{name}.testbed.toml")
            init_owner(tmp_path / name, str(testbed), dp=True, epsilon=8.0, sample_rate=1.0, planned_releases=20)
            processes[name] = OwnerProcess(tmp_path / name)
            processes[name].start()
        yield {name: OwnerSite.of_owner_folder(name, f"127.0.0.1:{p.port}", p.directory / "pki")
               for name, p in processes.items()}
    finally:
        for process in processes.values():
            process.stop()


@pytest.mark.slow
def test_flwr_run_trains_with_two_owners_behind_a_real_superlink_and_supernodes(owner_nodes, tmp_path):
    deployment = LocalDeployment(tmp_path / "flower")
    deployment.root.mkdir()
    run_dir = tmp_path / "run"
    try:
        deployment.start_superlink()
        for site in owner_nodes.values():
            deployment.add_owner(site)
        pins = ",".join(f"{name}={node}" for name, node in deployment.node_ids.items())
        done = deployment.run({"train-config": str(train_config(tmp_path, run_dir)), "owners": ",".join(OWNERS),
                               "owner-nodes": pins, "startup-timeout": 120.0})
    finally:
        deployment.stop()
    assert (run_dir / "summary.json").exists(), (done.stdout[-4000:], done.stderr[-2000:],
                                                 deployment.log("superlink")[-3000:])
    check_summary(json.loads((run_dir / "summary.json").read_text()))


def test_the_run_config_is_checked_naming_its_key(tmp_path):
    options = DeploymentOptions.from_run_config({"train-config": "/r.toml", "owners": "a, b", "owner-nodes": "a=12",
                                                 "steps": 0, "out-dir": "", "final-release": False})
    assert options.owners == ("a", "b") and options.owner_nodes == {"a": 12}
    assert options.steps is None and options.out_dir is None and options.final_release is False
    for bad, match in [({"owners": "a"}, "run config train-config"), ({"train-config": "/r.toml"}, "run config owners"),
                       ({"train-config": "/r.toml", "owners": "a,a"}, "names an owner twice"),
                       ({"train-config": "/r.toml", "owners": "a", "owner-nodes": "c=1"}, "run config owner-nodes")]:
        with pytest.raises(ValueError, match=match):
            DeploymentOptions.from_run_config(bad)


def test_an_owner_whose_node_is_missing_or_claims_another_pin_is_left_out_and_named(orgs, data_dir, tmp_path):  # noqa: F811
    """owner1's only node claims owner1 but owner-nodes pins owner1 to another id: not used; the run
    trains with owner0 and summary.json names owner1 lost at step 0."""
    with two_owner_grid(orgs, data_dir, tmp_path, nodes=(11, 33)) as grid:
        summary = run_deployment(grid, DeploymentOptions(
            train_config=train_config(tmp_path, tmp_path / "run", steps=1), owners=OWNERS,
            owner_nodes={"owner0": 11, "owner1": 22}, startup_timeout_s=1.0))
    assert [lost["owner"] for lost in summary["owners_lost"]] == ["owner1"]
    assert summary["owners_lost"][0]["step"] == 0 and "did not connect" in summary["owners_lost"][0]["reason"]
    assert summary["owners"]["owner0"]["queries"] >= 1


def test_the_deployment_selects_a_checkpoint_over_both_owners(orgs, data_dir, tmp_path):  # noqa: F811
    """[selection] over Flower (issue 44): each candidate goes to both owners, each owner makes one
    selection release at the end, and summary.json names the chosen step (and the final checkpoint
    when that is the one chosen)."""
    with two_owner_grid(orgs, data_dir, tmp_path) as grid:
        config = train_config(tmp_path, tmp_path / "run")
        with config.open("a") as fh:
            fh.write("[selection]\nevery = 1\n")
        summary = run_deployment(grid, DeploymentOptions(train_config=config, owners=OWNERS, startup_timeout_s=10,
                                                         final_release=False))
    selection = summary["selection"]
    assert selection["candidate_steps"] == [1, 2] and len(selection["released_accuracy"]) == 2
    assert selection["selected_step"] in (1, 2)
    if selection["selected_step"] == 2:  # the final checkpoint is saved; step 1's is not (save_every = 0)
        assert selection["selected_checkpoint"].endswith("step_000002")
    for name in OWNERS:
        assert summary["owners"][name]["queries"] == 1  # the one selection release, charged by that owner
