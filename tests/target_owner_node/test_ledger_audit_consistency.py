"""The ledger against the audit log (issue 11, hole 5): every charge is audited when it is made,
a start with files that disagree is refused, the one crash gap is repaired, a lost ledger is
rebuilt by an explicit command, and a storage folder lost as a whole is caught by the state
marker kept outside it."""

from __future__ import annotations

import json
from typing import ClassVar

import grpc
import numpy as np
import pytest

from protocol import errors
from protocol.errors import ProtocolError
from protocol.privacy.mechanisms import SeededRandom
from target_owner_node.audit import AuditLog, verify_chain
from target_owner_node.cli import main
from target_owner_node.config import load_config
from target_owner_node.evaluate_request import FEEDBACK, Decoding, EvaluateInputs
from target_owner_node.ledger import LEDGER_FILE, RECOVERED_NOT_RESUMABLE
from target_owner_node.ledger_audit import CHARGE_EVENT, REBUILT_EVENT
from target_owner_node.node import AUDIT_FILE, NodeStartupError, open_node
from target_owner_node.state_marker import MARKER_NAME

from .conftest import FakeScorer, config_dict, read_jsonl, upload_messages, write_toml

DECODING = Decoding(max_new_tokens=4, samples_per_prompt=1, temperature=0.0, seed=1)


def request(ids, request_id="") -> EvaluateInputs:
    return EvaluateInputs(tuple(ids), DECODING, FEEDBACK, request_id)


@pytest.fixture()
def owner(tmp_path, data_dir, pki, tiny_checkpoint):
    """A node config written to disk (so the CLI can use it); `open()` starts a node on it."""

    class Owner:
        config_path = write_toml(tmp_path / "config.toml", config_dict(tmp_path, data_dir, pki))
        storage = tmp_path / "storage"
        ledger = storage / LEDGER_FILE
        audit = storage / AUDIT_FILE
        marker = tmp_path / MARKER_NAME
        opened: ClassVar[list] = []

        def open(self, scorer=None, seed=0):
            node = open_node(
                load_config(self.config_path), scorer=scorer or FakeScorer(), random_source=SeededRandom(seed)
            )
            self.opened.append(node)
            return node

        def upload(self, node) -> str:
            return node.store.receive(upload_messages(tiny_checkpoint)).checkpoint_id

        def charges(self) -> list[dict]:
            return [e for e in read_jsonl(self.audit) if e["event"] == CHARGE_EVENT]

    yield Owner()
    for node in Owner.opened:
        node.close()


def _crash_next_evaluation(scorer: FakeScorer) -> None:
    scorer.fail_next = ProtocolError(grpc.StatusCode.UNAVAILABLE, errors.EVALUATION_FAILED, "worker crashed")


def _two_releases(owner) -> tuple[object, str]:
    """One completed release (request 'done') and one charged but never finished ('crashed')."""
    scorer = FakeScorer(default=0.25)
    node = owner.open(scorer)
    cid = owner.upload(node)
    node.releases.evaluate("trainer", request([cid], "done"))
    _crash_next_evaluation(scorer)
    with pytest.raises(ProtocolError):
        node.releases.evaluate("trainer", request([cid], "crashed"))
    node.close()
    return node, cid


def test_every_charge_is_audited_before_evaluation_without_its_secrets(owner):
    seen = []

    class AuditWatchingScorer(FakeScorer):
        def score(self, split, checkpoints, indices, decoding):
            seen.append([e["release_id"] for e in owner.charges()])  # what is on disk when evaluation starts
            return super().score(split, checkpoints, indices, decoding)

    node = owner.open(AuditWatchingScorer())
    cid = owner.upload(node)
    result = node.releases.evaluate("trainer", request([cid], "q1"))
    assert seen == [[result.release_id]]
    (entry,) = owner.charges()
    (pending,) = read_jsonl(owner.ledger)[:1]
    assert entry["client"] == "trainer" and entry["request_id"] == "q1" and entry["checkpoint_ids"] == [cid]
    assert entry["dp_event"] == pending["event"]
    assert entry["epsilon_before"] == 0.0 and entry["epsilon_total_after"] == pytest.approx(
        node.budget.spent()
    )
    assert not {"mask_b64", "mask_sha256", "noise_draws", "mask"} & set(entry)
    assert all(json.dumps(x) not in json.dumps(entry) for x in pending["noise_draws"]), (
        "noise reached the audit log"
    )


def test_deleted_ledger_refuses_start_naming_both_files_and_the_rebuild_command(owner):
    _two_releases(owner)
    owner.ledger.unlink()
    with pytest.raises(NodeStartupError) as caught:
        owner.open()
    message = str(caught.value)
    assert str(owner.ledger) in message and str(owner.audit) in message
    assert "the ledger is missing but the audit log records 2 charges" in message
    assert f"target-owner-node ledger rebuild --config {owner.config_path}" in message
    assert not owner.ledger.exists(), "a refused start must not create a fresh ledger"


def test_audit_charge_absent_from_the_ledger_is_refused(owner):
    _two_releases(owner)
    lines = owner.ledger.read_text().splitlines()
    owner.ledger.write_text("\n".join(lines[:-1]) + "\n")  # the last charge lost from the ledger
    with pytest.raises(NodeStartupError, match=r"1 charge\(s\) in the audit log are absent from the ledger"):
        owner.open()


def test_ledger_ahead_of_the_audit_by_more_than_the_last_charge_is_refused(owner):
    _two_releases(owner)
    lines = owner.audit.read_text().splitlines()
    first_charge = next(i for i, line in enumerate(lines) if CHARGE_EVENT in line)
    owner.audit.write_text("".join(line + "\n" for line in lines[:first_charge]))  # the chain stays valid
    assert verify_chain(owner.audit)[0]
    with pytest.raises(NodeStartupError, match=r"2 charge\(s\) in the ledger are absent from the audit log"):
        owner.open()


def test_events_that_differ_are_refused(owner):
    _two_releases(owner)
    text = owner.ledger.read_text()
    entry = read_jsonl(owner.ledger)[0]
    z = entry["event"]["noise_multiplier"]
    owner.ledger.write_text(text.replace(f'"noise_multiplier": {z!r}', f'"noise_multiplier": {z * 2!r}', 1))
    with pytest.raises(NodeStartupError, match="different clients or DP events"):
        owner.open()


def test_released_values_that_differ_are_refused(owner):
    _two_releases(owner)
    lines = owner.ledger.read_text().splitlines()
    completed = next(i for i, line in enumerate(lines) if '"completed"' in line)
    entry = json.loads(lines[completed])
    entry["values"] = [0.999]
    lines[completed] = json.dumps(entry)
    owner.ledger.write_text("\n".join(lines) + "\n")
    with pytest.raises(NodeStartupError, match="different released values"):
        owner.open()


def test_last_ledger_charge_missing_from_the_audit_is_repaired(owner, monkeypatch):
    """A crash between the ledger write and the audit write: the next start audits the charge."""
    node = owner.open()
    cid = owner.upload(node)
    node.releases.evaluate("trainer", request([cid], "first"))
    real_append = AuditLog.append

    def crash_on_charge(self, event, **fields):
        if event == CHARGE_EVENT:
            raise OSError("power cut")
        return real_append(self, event, **fields)

    monkeypatch.setattr(AuditLog, "append", crash_on_charge)
    with pytest.raises(OSError):
        node.releases.evaluate("trainer", request([cid], "second"))
    monkeypatch.setattr(AuditLog, "append", real_append)
    spent, last = node.budget.spent(), read_jsonl(owner.ledger)[-1]
    node.close()
    assert [e["release_id"] for e in owner.charges()] != [
        e["release_id"] for e in read_jsonl(owner.ledger) if e["type"] == "pending"
    ]

    restarted = owner.open()
    assert restarted.budget.spent() == spent and restarted.budget.releases_made == 2
    repaired = owner.charges()[-1]
    assert repaired["release_id"] == last["release_id"] and repaired["recovered"] is True
    assert repaired["dp_event"] == last["event"] and verify_chain(owner.audit)[0]
    restarted.close()
    assert main(["ledger", "verify", "--config", str(owner.config_path)]) == 0


def test_rebuild_restores_the_spend_replays_completed_and_refuses_unfinished(owner, capsys):
    _two_releases(owner)
    before = owner.open()
    spent, made, client_spent = (
        before.budget.spent(),
        before.budget.releases_made,
        before.budget.client_spent("trainer"),
    )
    cid = owner.upload(before)
    done = before.releases.evaluate("trainer", request([cid], "done"))  # a replay: nothing new
    before.close()
    owner.ledger.unlink()
    assert main(["ledger", "verify", "--config", str(owner.config_path)]) == 1
    assert "ledger rebuild" in capsys.readouterr().out

    assert main(["ledger", "rebuild", "--config", str(owner.config_path)]) == 0
    out = capsys.readouterr().out
    assert (
        "2 charges, 1 completed" in out
        and "1 unfinished" in out
        and out.rstrip().splitlines()[-1].startswith("OK")
    )
    rebuilt = read_jsonl(owner.ledger)
    assert all(e.get("recovered") is True and "mask_b64" not in e for e in rebuilt if e["type"] == "pending")
    (entry,) = [e for e in read_jsonl(owner.audit) if e["event"] == REBUILT_EVENT]
    assert (entry["charges"], entry["completed"], entry["unfinished"], entry["moved_aside"]) == (
        2,
        1,
        1,
        None,
    )

    node = owner.open(seed=7)
    assert node.budget.spent() == spent and node.budget.releases_made == made
    assert node.budget.client_spent("trainer") == client_spent
    replay = node.releases.evaluate("trainer", request([cid], "done"))
    assert replay == done, "a completed request must replay identically after a rebuild"
    ledger_text = owner.ledger.read_text()
    with pytest.raises(ProtocolError) as caught:
        node.releases.evaluate("trainer", request([cid], "crashed"))
    assert (
        caught.value.code == grpc.StatusCode.INVALID_ARGUMENT
        and caught.value.reason == errors.INVALID_REQUEST
    )
    assert caught.value.message == RECOVERED_NOT_RESUMABLE
    assert owner.ledger.read_text() == ledger_text and node.budget.spent() == spent, "the refusal charged"
    fresh = node.releases.evaluate("trainer", request([cid], "crashed-again"))  # a fresh id is served
    assert fresh.epsilon_spent_total > spent and node.budget.releases_made == made + 1
    node.close()
    assert owner.open().budget.spent() == pytest.approx(fresh.epsilon_spent_total)


def test_rebuild_never_replaces_a_ledger_unless_forced_and_keeps_the_old_one(owner, capsys):
    _two_releases(owner)
    original = owner.ledger.read_text()
    assert main(["ledger", "rebuild", "--config", str(owner.config_path)]) == 2
    assert "exists" in capsys.readouterr().err and owner.ledger.read_text() == original
    assert main(["ledger", "rebuild", "--config", str(owner.config_path), "--force"]) == 0
    (aside,) = owner.storage.glob(f"{LEDGER_FILE}.before-rebuild-*")
    assert aside.read_text() == original and str(aside) in capsys.readouterr().out
    (entry,) = [e for e in read_jsonl(owner.audit) if e["event"] == REBUILT_EVENT]
    assert entry["moved_aside"] == aside.name
    assert owner.open().budget.releases_made == 2


def test_rebuilt_ledger_stays_strict(owner):
    _two_releases(owner)
    owner.ledger.unlink()
    assert main(["ledger", "rebuild", "--config", str(owner.config_path)]) == 0
    lines = owner.ledger.read_text().splitlines()
    entry = json.loads(lines[0])
    entry["noise_draws"] = [0.0]  # a recovered entry never carries secrets
    owner.ledger.write_text("\n".join([json.dumps(entry), *lines[1:]]) + "\n")
    with pytest.raises(NodeStartupError, match="line 1 is corrupt"):
        owner.open()


# -- the state marker: the storage folder lost as a whole ----------------------------------------
def test_marker_is_written_at_the_first_charge_outside_storage(owner):
    node = owner.open()
    assert not owner.marker.exists(), "no charge yet"
    cid = owner.upload(node)
    node.releases.evaluate("trainer", request([cid]))
    state = json.loads(owner.marker.read_text())
    (record,) = state["storage"].items()
    assert record[0] == str(owner.storage.resolve()) and record[1]["first_charge_time"] > 0


def test_a_failed_marker_write_does_not_fail_the_release(owner, monkeypatch):
    from target_owner_node.state_marker import StateMarker

    def disk_full(self, *args, **kwargs):
        raise OSError("no space left")

    monkeypatch.setattr(StateMarker, "record", disk_full)
    node = owner.open()
    cid = owner.upload(node)
    result = node.releases.evaluate("trainer", request([cid]))
    assert [e["release_id"] for e in owner.charges()] == [result.release_id] and not owner.marker.exists()
    monkeypatch.undo()
    node.close()
    owner.open()  # the next start records the folder
    assert owner.marker.exists()


def test_both_files_deleted_with_the_marker_present_is_refused(owner):
    _two_releases(owner)
    owner.ledger.unlink()
    owner.audit.unlink()
    with pytest.raises(NodeStartupError) as caught:
        owner.open()
    message = str(caught.value)
    assert str(owner.marker) in message and "Restore the storage folder from a backup" in message
    assert "delete" in message and not owner.ledger.exists() and not owner.audit.exists()
    owner.marker.unlink()  # the operator knowingly starts a fresh budget
    assert owner.open().budget.spent() == 0.0


def test_both_files_emptied_with_the_marker_present_is_refused(owner):
    _two_releases(owner)
    owner.ledger.write_bytes(b"")
    owner.audit.write_bytes(b"")  # an empty log is a valid chain
    with pytest.raises(NodeStartupError, match="nor audit.jsonl there records any charge"):
        owner.open()


def test_fresh_folder_without_a_marker_starts(owner):
    node = owner.open()
    assert node.budget.spent() == 0.0 and not owner.marker.exists()


def test_marker_is_added_for_a_folder_charged_before_markers_existed(owner):
    _two_releases(owner)
    owner.marker.unlink()
    owner.open()
    assert str(owner.storage.resolve()) in json.loads(owner.marker.read_text())["storage"]


def test_a_named_marker_that_cannot_be_written_stops_the_node(tmp_path, data_dir, pki):
    raw = config_dict(tmp_path, data_dir, pki, storage={"state_marker": str(tmp_path / "missing" / "m.json")})
    with pytest.raises(NodeStartupError, match="storage.state_marker"):
        open_node(load_config(write_toml(tmp_path / "config.toml", raw)), scorer=FakeScorer())


def test_marker_inside_storage_is_a_config_error(tmp_path, data_dir, pki):
    from target_owner_node.config import ConfigError

    raw = config_dict(tmp_path, data_dir, pki, storage={"state_marker": str(tmp_path / "storage" / "m.json")})
    with pytest.raises(ConfigError, match="state_marker .* must lie outside storage.dir"):
        load_config(write_toml(tmp_path / "config.toml", raw))


def test_pending_from_the_audit_round_trips_the_public_facts(owner):
    node = owner.open()
    cid = owner.upload(node)
    node.releases.evaluate("trainer", request([cid], "q"))
    from target_owner_node.ledger_audit import pending_from_charge

    (entry,) = owner.charges()
    recovered = pending_from_charge(entry)
    original = node.budget.ledger.releases()[0].pending
    assert recovered.recovered and recovered.mask is None and recovered.noise_draws is None
    for name in (
        "release_id",
        "request_id",
        "client",
        "request_fingerprint",
        "checkpoint_ids",
        "decoding",
        "event",
        "epsilon_before",
        "epsilon_total_after",
        "client_epsilon_after",
        "heldout_size",
        "expected_size",
        "noise_std_sum",
    ):
        assert getattr(recovered, name) == getattr(original, name), name
    assert np.isfinite(recovered.time)


def test_a_difference_release_survives_verify_and_rebuild_with_its_kind(owner, capsys, tiny_checkpoint, tmp_path):
    """The audit's charge carries the release kind, metric and clip, so a rebuilt ledger charges the
    same event and a completed difference release replays with its one value (its base has none)."""
    import shutil

    from target_owner_node.evaluate_request import DIFFERENCE, ReleaseSpec

    node = owner.open()
    base = owner.upload(node)
    other = tmp_path / "candidate"
    shutil.copytree(tiny_checkpoint, other)
    (other / "generation_config.json").write_text('{"do_sample": false}')
    candidate = node.store.receive(upload_messages(other)).checkpoint_id
    spec = ReleaseSpec(DIFFERENCE, "answer_probability", 0.1)
    released = node.releases.evaluate("trainer", EvaluateInputs((base, candidate), DECODING, FEEDBACK, "dd", spec))
    spent = node.budget.spent()
    node.close()
    assert [c["release"] for c in owner.charges()] == [spec.to_json()]
    assert main(["ledger", "verify", "--config", str(owner.config_path)]) == 0
    owner.ledger.unlink()
    assert main(["ledger", "rebuild", "--config", str(owner.config_path)]) == 0
    capsys.readouterr()
    reopened = owner.open(seed=5)
    assert reopened.budget.spent() == pytest.approx(spent)
    replay = reopened.releases.evaluate("trainer", EvaluateInputs((base, candidate), DECODING, FEEDBACK, "dd", spec))
    assert replay.values == released.values and len(replay.values) == 1


# -- issue 41: the storage folder rolled back to an older, self-consistent copy ----------------------------------

def _three_releases(owner) -> float:
    node = owner.open()
    cid = owner.upload(node)
    for i in range(3):
        node.releases.evaluate("trainer", request([cid], f"r{i}"))
    spent = node.budget.spent()
    node.close()
    return spent


def test_an_older_consistent_backup_is_refused_and_carried_forward_to_the_high_water_mark(owner, capsys):
    """A copy of ledger + audit taken after 1 release, restored after 3: both agree with each other, so
    only the marker's high-water mark can tell (old code started with a third of the spend)."""
    import shutil

    node = owner.open()
    cid = owner.upload(node)
    node.releases.evaluate("trainer", request([cid], "r0"))
    node.close()
    backup = owner.storage.parent / "backup"
    shutil.copytree(owner.storage, backup)
    node = owner.open()
    for i in (1, 2):
        node.releases.evaluate("trainer", request([cid], f"r{i}"))
    spent = node.budget.spent()
    node.close()
    shutil.rmtree(owner.storage)
    shutil.copytree(backup, owner.storage)
    assert main(["ledger", "verify", "--config", str(owner.config_path)]) == 0  # the pair is consistent
    capsys.readouterr()
    with pytest.raises(NodeStartupError) as caught:
        owner.open()
    message = str(caught.value)
    assert "records 1 releases" in message and "charge 3" in message and "carry-forward" in message
    assert main(["ledger", "carry-forward", "--config", str(owner.config_path), "--reason", "restored"]) == 0
    assert "carried 2 releases forward" in capsys.readouterr().out
    node = owner.open()
    assert node.budget.spent() == pytest.approx(spent) and node.budget.releases_made == 3
    (entry,) = [e for e in read_jsonl(owner.audit) if e["event"] == "spend_carried_forward"]
    assert entry["releases"] == 2 and entry["reason"] == "restored"
    node.close()
    assert main(["ledger", "carry-forward", "--config", str(owner.config_path), "--reason", "again"]) == 0
    assert "nothing to carry forward" in capsys.readouterr().out
    assert main(["ledger", "verify", "--config", str(owner.config_path)]) == 0


def test_both_files_cut_to_a_consistent_prefix_are_refused(owner):
    spent = _three_releases(owner)
    ledger_lines = owner.ledger.read_text().splitlines(keepends=True)
    audit_lines = owner.audit.read_text().splitlines(keepends=True)
    first_charge = next(i for i, line in enumerate(audit_lines) if CHARGE_EVENT in line)
    # keep one complete release in each: its pending + completed, and the audit up to its release entry
    owner.ledger.write_text("".join(ledger_lines[:2]))
    release_entry = next(i for i, line in enumerate(audit_lines) if i > first_charge and '"event":"release"' in line)
    owner.audit.write_text("".join(audit_lines[: release_entry + 1]))
    with pytest.raises(NodeStartupError, match="missing: the folder was restored from an older backup or cut short"):
        owner.open()
    assert spent > 0


def test_a_format_1_marker_is_read_and_upgraded(owner):
    """Markers written before high-water marks hold only the first charge time: read as a mark of 0 releases."""
    _three_releases(owner)
    state = json.loads(owner.marker.read_text())
    key = next(iter(state["storage"]))
    owner.marker.write_text(json.dumps({"format": "target-owner-node-state/1",
                                        "storage": {key: {"first_charge_time": 1.0}}}))
    node = owner.open()  # starts, and records the ledger's mark
    node.close()
    upgraded = json.loads(owner.marker.read_text())
    assert upgraded["format"] == "target-owner-node-state/2" and upgraded["storage"][key]["releases"] == 3
    assert upgraded["storage"][key]["first_charge_time"] == 1.0
