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
