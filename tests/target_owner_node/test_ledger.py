"""The privacy ledger round-trips releases and refuses to load when corrupt."""

from __future__ import annotations

import json

import numpy as np
import pytest

from target_owner_node.ledger import DpEventRecord, Ledger, LedgerCorruptError, PendingRelease


def pending(release_id="r1", request_id="q1", client="trainer", n=37, k=2):
    rng = np.random.default_rng(0)
    return PendingRelease(
        release_id=release_id,
        request_id=request_id,
        client=client,
        time=1.0,
        request_fingerprint="f" * 64,
        checkpoint_ids=tuple(f"{i:064x}" for i in range(k)),
        decoding={"seed": 3},
        event=DpEventRecord(2.0, 0.1, 1),
        epsilon_before=0.0,
        epsilon_total_after=0.5,
        client_epsilon_after=0.5,
        heldout_size=n,
        expected_size=3.7,
        noise_std_sum=2.0,
        mask=rng.random(n) < 0.3,
        noise_draws=rng.normal(size=k),
    )


def test_round_trip_pending_and_completed(tmp_path):
    path = tmp_path / "ledger.jsonl"
    ledger = Ledger(path)
    first, second = pending("r1", "q1"), pending("r2", "")
    ledger.append_pending(first)
    ledger.append_completed("r1", (0.25, 0.5))
    ledger.append_pending(second)  # charged, never completed (a crash mid-evaluation)
    reopened = Ledger(path)
    releases = reopened.releases()
    assert [r.pending.release_id for r in releases] == ["r1", "r2"]
    assert releases[0].values == (0.25, 0.5) and not releases[1].completed
    np.testing.assert_array_equal(releases[0].pending.mask, first.mask)
    np.testing.assert_allclose(releases[0].pending.noise_draws, first.noise_draws)
    assert reopened.find("trainer", "q1").pending.release_id == "r1"
    assert reopened.find("other-client", "q1") is None


@pytest.mark.parametrize(
    "corrupt",
    [
        lambda lines: lines[:-1] + [lines[-1][: len(lines[-1]) // 2]],  # torn write
        lambda lines: [lines[0].replace('"noise_multiplier": 2.0', '"noise_multiplier": -2.0')] + lines[1:],
        lambda lines: [lines[0].replace('"mask_sha256": "', '"mask_sha256": "00')] + lines[1:],
        lambda lines: lines + ['{"type": "completed", "release_id": "nope", "values": [1, 2]}'],
        lambda lines: lines + ['{"type": "refund", "release_id": "r1"}'],
        lambda lines: lines + [lines[0]],  # duplicate release
    ],
)
def test_corrupt_ledger_refuses_to_load(tmp_path, corrupt):
    path = tmp_path / "ledger.jsonl"
    ledger = Ledger(path)
    ledger.append_pending(pending())
    ledger.append_completed("r1", (0.1, 0.2))
    lines = path.read_text().splitlines()
    path.write_text("\n".join(corrupt(lines)) + "\n")
    with pytest.raises(LedgerCorruptError, match="never silently reset"):
        Ledger(path)


def test_ledger_lines_are_json_objects_with_the_charge(tmp_path):
    path = tmp_path / "ledger.jsonl"
    Ledger(path).append_pending(pending())
    entry = json.loads(path.read_text())
    assert entry["type"] == "pending"
    assert entry["event"] == {"noise_multiplier": 2.0, "sample_rate": 0.1, "count": 1}
    assert len(entry["noise_draws"]) == 2 and len(entry["mask_sha256"]) == 64


def recovered(release_id="r9", request_id="q9"):
    import dataclasses

    return dataclasses.replace(pending(release_id, request_id), mask=None, noise_draws=None, recovered=True)


def test_recovered_entries_round_trip_without_secrets(tmp_path):
    """A rebuilt ledger's entries keep the charge and the public facts, never a mask or noise."""
    path = tmp_path / "ledger.jsonl"
    ledger = Ledger(path)
    ledger.append_pending(recovered())
    ledger.append_completed("r9", (0.5, 0.25))
    entry = json.loads(path.read_text().splitlines()[0])
    assert entry["recovered"] is True and not {"mask_b64", "mask_sha256", "noise_draws"} & set(entry)
    (release,) = Ledger(path).releases()
    assert release.pending.recovered and release.pending.mask is None and release.values == (0.5, 0.25)
    assert release.pending.event == DpEventRecord(2.0, 0.1, 1)


@pytest.mark.parametrize(
    "edit",
    [
        lambda e: {**e, "mask_b64": "AA==", "mask_sha256": "0" * 64},  # a recovered entry with secrets
        lambda e: {**e, "recovered": "yes"},
        lambda e: {key: value for key, value in e.items() if key != "recovered"},  # then secrets are required
        lambda e: {**e, "event": [2.0, 0.1, 1]},
    ],
)
def test_recovered_entries_are_parsed_strictly(tmp_path, edit):
    path = tmp_path / "ledger.jsonl"
    Ledger(path).append_pending(recovered())
    entry = json.loads(path.read_text())
    path.write_text(json.dumps(edit(entry)) + "\n")
    with pytest.raises(LedgerCorruptError, match="never silently reset"):
        Ledger(path)


def test_write_new_ledger_is_loadable_and_never_overwrites(tmp_path):
    from target_owner_node.ledger import LedgerRelease, write_new_ledger

    path = tmp_path / "ledger.jsonl"
    write_new_ledger(path, [LedgerRelease(recovered("a", "qa"), (0.1, 0.2)), LedgerRelease(recovered("b", ""))])
    releases = Ledger(path).releases()
    assert [r.pending.release_id for r in releases] == ["a", "b"] and releases[0].completed
    assert not releases[1].completed
    with pytest.raises(FileExistsError):
        write_new_ledger(path, [])
