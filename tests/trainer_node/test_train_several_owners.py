"""`trainer-node train` with several target owners over the direct mTLS path ([[feedback.owners]]):
each owner is checked at start like the one [feedback] owner, an owner that fails is left out and
named (log and summary.json), `required = true` needs one owner passing, training learns from the
owners that passed (one budget and pacer each), `check-owner` reports each owner, and a bad entry
is named by its place in the list (`feedback.owners[1].ca_cert`)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from tests.deploy.conftest import StubScorer, in_process_owner, owner_config
from tests.rlvr_core.model_folders import save_pretrained_folder
from tests.trainer_node.mini_testbed import MINI_TESTBED, mini_run_sections
from trainer_node.cli import main
from trainer_node.config import ConfigError, OwnersFeedbackConfig, load_config

FAST_S = 10.0


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    return save_pretrained_folder(tmp_path_factory.mktemp("models"))


@pytest.fixture()
def two_owners(orgs, data_dir, tmp_path):
    """Two owners of the same organization, each its own node, storage and budget; a releases 0.2, b 0.8."""
    ours, _ = orgs
    with in_process_owner(owner_config(tmp_path / "a", data_dir, ours), tmp_path, StubScorer(0.2)) as a, \
            in_process_owner(owner_config(tmp_path / "b", data_dir, ours), tmp_path, StubScorer(0.8)) as b:
        yield {"a": a.port, "b": b.port}


def _value(value) -> str:
    return json.dumps(value) if isinstance(value, (str, bool, int, float)) else str(value)


def write_config(tmp_path: Path, orgs, owners: list[dict], *, model: Path | None = None, feedback: str = "",
                 extra: str = "") -> Path:
    """A run config with one [[feedback.owners]] table per entry (defaults: our org's files)."""
    ours, _ = orgs
    tables = []
    for entry in owners:
        values = {"ca_cert": str(ours.owner_ca_cert), "client_cert": str(ours.client_cert),
                  "client_key": str(ours.client_key), **entry}
        values = {key: value for key, value in values.items() if value is not None}
        tables.append("[[feedback.owners]]\n" + "\n".join(f"{k} = {_value(v)}" for k, v in values.items()))
    model_line = f'path = "{model}"' if model else "tiny = true"
    config = tmp_path / "train.toml"
    config.write_text(mini_run_sections(tmp_path, model_line) + f"""{extra}
[feedback]
max_attempts = 1
{feedback}
""" + "\n".join(tables) + "\n")
    (tmp_path / "mini.toml").write_text(MINI_TESTBED)
    return config


def summary_of(tmp_path: Path) -> dict:
    return json.loads((tmp_path / "run" / "summary.json").read_text())


def test_train_learns_from_both_owners_and_the_summary_names_each_owners_releases(two_owners, orgs, model,
                                                                                  tmp_path):
    config = write_config(tmp_path, orgs, [{"name": "a", "target": f"localhost:{two_owners['a']}"},
                                           {"name": "b", "target": f"localhost:{two_owners['b']}"}], model=model)
    assert main(["train", "--config", str(config), "--no-progress"]) == 0
    summary = summary_of(tmp_path)
    assert set(summary["owners"]) == {"a", "b"} and summary["owners_lost"] == []
    assert summary["aggregation"] == "heldout_size"
    for name in ("a", "b"):
        owner = summary["owners"][name]
        assert owner["queries"] >= 1, owner  # at least the final release, each charged by its own owner
        assert owner["epsilon_spent"] > 0 and owner["lost_step"] is None
        assert isinstance(owner["last_accuracy"], float)  # a DP-noised release of that owner's stub
    assert summary["owners"]["a"]["weight"] == pytest.approx(0.5)  # equal public held-out sizes
    released = [summary["owners"][name]["last_accuracy"] for name in ("a", "b")]
    assert summary["target_feedback_accuracy"] == pytest.approx(sum(released) / 2)  # the aggregate of both
    assert summary["feedback_queries"] >= 1
    sent = tmp_path / "run" / "checkpoints_sent"
    assert (sent / "a").is_dir() and (sent / "b").is_dir()  # one upload folder per owner


def test_a_wrong_ca_owner_is_left_out_and_named_training_goes_on_with_the_good_one(two_owners, orgs, model,
                                                                                   tmp_path, caplog):
    _, theirs = orgs
    config = write_config(tmp_path, orgs, [
        {"name": "a", "target": f"localhost:{two_owners['a']}", "ca_cert": str(theirs.owner_ca_cert), "weight": 1.0},
        {"name": "b", "target": f"localhost:{two_owners['b']}", "weight": 3.0},
    ], model=model, feedback="required = true")
    with caplog.at_level("WARNING"):
        assert main(["train", "--config", str(config), "--no-progress"]) == 0
    assert "target owner 'a' left out at start: feedback.owners[0].ca_cert" in caplog.text
    summary = summary_of(tmp_path)
    assert summary["aggregation"] == "mixture"  # the owners' weights, renormalized over the one that passed
    lost = summary["owners_lost"]
    assert [entry["owner"] for entry in lost] == ["a"] and lost[0]["step"] == 0
    assert "feedback.owners[0].ca_cert" in lost[0]["reason"] and "not signed by the CA" in lost[0]["reason"]
    assert summary["owners"]["b"]["queries"] >= 1 and summary["owners"]["b"]["weight"] == pytest.approx(1.0)
    assert summary["owners"]["a"]["queries"] == 0


def test_required_and_no_owner_passing_stops_train_at_once_naming_each_owner(orgs, tmp_path, capsys):
    _, theirs = orgs
    config = write_config(tmp_path, orgs, [
        {"name": "a", "target": "127.0.0.1:1", "ca_cert": str(theirs.owner_ca_cert)},
        {"name": "b", "target": "127.0.0.1:1", "client_key": "tls/nowhere.key"},
    ])
    started = time.monotonic()
    code = main(["train", "--config", str(config), "--no-progress"])
    err = capsys.readouterr().err
    assert code != 0 and time.monotonic() - started < FAST_S, (code, err)
    assert "no target owner passed the start checks" in err and "Traceback" not in err
    assert "a: feedback.owners[0].target: cannot connect" in err
    assert f"b: feedback.owners[1].client_key: file not found: {tmp_path / 'tls' / 'nowhere.key'}" in err
    assert not (tmp_path / "run" / "summary.json").exists()


def test_check_owner_reports_each_owner_and_exits_1_when_one_fails(two_owners, orgs, tmp_path, capsys):
    good = write_config(tmp_path, orgs, [{"name": "a", "target": f"localhost:{two_owners['a']}"},
                                         {"name": "b", "target": f"localhost:{two_owners['b']}"}])
    assert main(["check-owner", "--config", str(good)]) == 0
    out = capsys.readouterr().out
    assert f"a (feedback.owners[0]): connected to localhost:{two_owners['a']}" in out
    assert f"b (feedback.owners[1]): connected to localhost:{two_owners['b']}" in out
    assert out.count("110 held-out rows") == 2 and "2 of 2 owners answered" in out
    wrong = write_config(tmp_path, orgs, [
        {"name": "a", "target": f"localhost:{two_owners['a']}", "server_name": "owner.example.org"},
        {"name": "b", "target": f"localhost:{two_owners['b']}"}])
    assert main(["check-owner", "--config", str(wrong)]) == 1
    captured = capsys.readouterr()
    assert "a (feedback.owners[0]): feedback.owners[0].server_name" in captured.err
    assert "b (feedback.owners[1]): connected" in captured.out and "1 of 2 owners answered" in captured.out


@pytest.mark.parametrize("owners, extra, expected", [
    ([{"name": "a", "target": "h:1"}, {"name": "b", "target": "h:2", "ca_cert": None}], "",
     "feedback.owners[1].ca_cert: required; add it to the config"),
    ([{"name": "a", "target": "h:1"}, {"name": "a", "target": "h:2"}], "",
     "feedback.owners[1].name: 'a' is already the name of feedback.owners[0]"),
    ([{"name": "a", "target": "h:1"}, {"name": "b", "target": "nowhere"}], "",
     "feedback.owners[1].target: must be HOST:PORT, got 'nowhere'"),
    ([{"name": "a", "target": "h:1", "cacert": "x.pem"}], "",
     "feedback.owners[0].cacert: unknown setting"),
    ([{"name": "../up", "target": "h:1"}], "", "feedback.owners[0].name: must be 1-64 letters"),
    ([{"name": "a", "target": "h:1", "weight": 1.0}, {"name": "b", "target": "h:2"}], "",
     "feedback.owners[1].weight: set a weight on every owner or on none"),
    ([{"name": "a", "target": "h:1", "weight": 1.0}, {"name": "b", "target": "h:2", "weight": 2.0}],
     '[owners]\nname = "heldout_size"', "feedback.owners[0].weight: aggregation 'heldout_size'"),
    ([{"name": "a", "target": "h:1"}, {"name": "b", "target": "h:2"}],
     '[owners]\nname = "per_owner"\nowner = "c"', "owners.owner: 'c' is not one of the owners (a, b)"),
    ([{"name": "a", "target": "h:1"}, {"name": "b", "target": "h:2"}],
     '[owners]\nname = "mixture"\nmixture = { a = 1.0 }', "owners.mixture: name every owner"),
])
def test_a_bad_owner_entry_is_named_by_its_place_in_the_list(orgs, tmp_path, capsys, owners, extra, expected):
    config = write_config(tmp_path, orgs, owners, extra=extra)
    with pytest.raises(ConfigError, match="invalid config") as error:
        load_config(config)
    assert expected in str(error.value)
    assert main(["train", "--config", str(config), "--no-progress"]) == 2
    assert expected in capsys.readouterr().err


def test_owner_paths_resolve_against_the_config_file_and_one_owner_form_is_unchanged(orgs, tmp_path):
    config = write_config(tmp_path, orgs, [{"name": "a", "target": "h:1", "ca_cert": "tls/a-ca.pem"},
                                           {"name": "b", "target": "h:2", "client_key": "b.key"}])
    feedback = load_config(config).feedback
    assert isinstance(feedback, OwnersFeedbackConfig) and feedback.max_attempts == 1
    assert feedback.owners[0].ca_cert == tmp_path / "tls" / "a-ca.pem"
    assert feedback.owners[1].client_key == tmp_path / "b.key"
    single = tmp_path / "single.toml"
    single.write_text('[model]\ntiny = true\n[feedback]\ntarget = "h:1"\nca_cert = "ca.pem"\nclient_cert = "c.pem"\n'
                      'client_key = "c.key"\n')
    one = load_config(single).feedback
    assert one.owner_entries() == [("feedback", one)] and one.ca_cert == tmp_path / "ca.pem"


def test_the_several_owners_snippets_of_deploy_md_and_the_default_config_validate(tmp_path):
    import tomllib

    from trainer_node.config import parse_config

    repo = Path(__file__).resolve().parents[2]
    doc = (repo / "docs" / "DEPLOY.md").read_text().split("*Several owners*")[1]
    block = doc[doc.index("```toml") + len("```toml"):doc.index("```", doc.index("```toml") + 7)]
    config = parse_config({"model": {"tiny": True}, **tomllib.loads(block)}, base_dir=tmp_path)
    assert [o.name for o in config.feedback.owners] == ["hospital_a", "hospital_b"]
    assert config.feedback.aggregation(config.owners).mixture == {"hospital_a": 2.0, "hospital_b": 1.0}
    assert config.feedback.owners[1].ca_cert == tmp_path / "tls" / "b-ca.pem"
    default = (repo / "trainer_node" / "configs" / "train_default.toml").read_text()
    commented = default.split("# Several owners")[1]
    from trainer_node.config import OwnerEntry

    for key in OwnerEntry.model_fields:  # every key of an owner's table is shown there
        assert f"# {key} = " in commented, key
    assert "# [[feedback.owners]]" in commented and "# [owners]" in commented


def test_required_false_and_every_owner_unreachable_trains_without_feedback_naming_each(orgs, model, tmp_path,
                                                                                        caplog):
    config = write_config(tmp_path, orgs, [{"name": "a", "target": "127.0.0.1:1"},
                                           {"name": "b", "target": "127.0.0.1:1"}],
                          model=model, feedback="required = false")
    with caplog.at_level("WARNING"):
        assert main(["train", "--config", str(config), "--no-progress"]) == 0
    assert "no target owner reachable at start" in caplog.text
    summary = summary_of(tmp_path)
    assert [entry["owner"] for entry in summary["owners_lost"]] == ["a", "b"]
    assert "feedback.owners[1].target: cannot connect" in summary["owners"]["b"]["lost_reason"]
    assert "feedback_queries" not in summary or summary["feedback_queries"] == 0
