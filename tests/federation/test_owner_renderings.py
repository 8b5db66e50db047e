"""Owners that publish different renderings (issue 17): prompts are rendered once for every owner, so
a run whose owners publish different renderings is refused at start, naming the owner that differs
(`feedback.owners[1]` over direct mTLS; the owner's name over Flower), before anything is charged."""

from __future__ import annotations

import pytest

from tests.deploy.conftest import StubScorer, in_process_owner, owner_config
from tests.rlvr_core.model_folders import save_pretrained_folder
from tests.trainer_node.conftest import data_dir, orgs  # noqa: F401 - fixtures
from tests.trainer_node.test_train_several_owners import write_config
from trainer_node.cli import main
from trainer_node.federation.local_deployment import OwnerSite


@pytest.fixture()
def two_renderings(orgs, data_dir, tmp_path):  # noqa: F811
    """Owner a renders "{prompt}", owner b "Q: {prompt}"."""
    ours, _ = orgs
    with in_process_owner(owner_config(tmp_path / "a", data_dir, ours), tmp_path, StubScorer(0.2)) as a, \
            in_process_owner(owner_config(tmp_path / "b", data_dir, ours, data={"prompt_template": "Q: {prompt}"}),
                             tmp_path, StubScorer(0.8)) as b:
        yield {"a": a, "b": b}


def spent(port: int, orgs) -> float:  # noqa: F811
    from trainer_node.feedback.client import ClientSettings, TargetFeedbackClient

    ours, _ = orgs
    with TargetFeedbackClient(ClientSettings(target=f"localhost:{port}", ca_cert=ours.owner_ca_cert,
                                             client_cert=ours.client_cert, client_key=ours.client_key)) as client:
        return client.budget().epsilon_spent


def test_train_refuses_owners_with_different_renderings_naming_the_entry(two_renderings, orgs, tmp_path, capsys):  # noqa: F811
    config = write_config(tmp_path, orgs, [{"name": "a", "target": f"localhost:{two_renderings['a'].port}"},
                                           {"name": "b", "target": f"localhost:{two_renderings['b'].port}"}],
                          model=save_pretrained_folder(tmp_path / "models"))
    assert main(["train", "--config", str(config), "--no-progress"]) != 0
    err = capsys.readouterr().err
    assert "feedback.owners[1]: owner 'b' publishes the rendering" in err and "feedback.owners[0] ('a')" in err
    assert not (tmp_path / "run" / "summary.json").exists()  # refused before training: nothing released
    assert spent(two_renderings["a"].port, orgs) == spent(two_renderings["b"].port, orgs) == 0.0


def test_a_flower_run_refuses_owners_with_different_renderings(two_renderings, orgs, tmp_path):  # noqa: F811
    from flower_shim.app import make_client_app, settings_from_node_config
    from tests.federation.test_deployment import train_config
    from trainer_node.federation.loopback_grid import LoopbackGrid
    from trainer_node.federation.server_app import DeploymentOptions, run_deployment
    from trainer_node.feedback.preflight import OwnerStartError

    ours, _ = orgs
    sites = {name: OwnerSite(name, f"127.0.0.1:{owner.port}", ours.owner_ca_cert, ours.client_cert, ours.client_key)
             for name, owner in two_renderings.items()}
    grid = LoopbackGrid(make_client_app(settings_from_node_config),
                        {1: sites["a"].node_config_values(), 2: sites["b"].node_config_values()})
    with pytest.raises(OwnerStartError, match="owner 'b' publishes the rendering"):
        run_deployment(grid, DeploymentOptions(train_config=train_config(tmp_path, tmp_path / "run"), owners=("a", "b"),
                                               startup_timeout_s=5))
    assert not (tmp_path / "run" / "summary.json").exists()
