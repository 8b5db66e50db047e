"""The audit log is a hash chain: any edit, deletion or reordering is detected."""

from __future__ import annotations

import json

import pytest

from target_owner_node.audit import AuditChainError, AuditLog, verify_chain
from target_owner_node.cli import main


def _log_with_entries(path, n=4):
    log = AuditLog(path)
    for i in range(n):
        log.append("release", client="trainer", values=[0.1 * i], epsilon_spent_total=0.01 * i)
    return path


def test_chain_verifies_and_continues_after_reopen(tmp_path):
    path = _log_with_entries(tmp_path / "audit.jsonl")
    assert verify_chain(path) == (True, 4, None)
    AuditLog(path).append("upload", client="trainer", checkpoint_id="ab" * 32)
    assert verify_chain(path) == (True, 5, None)


@pytest.mark.parametrize("tamper", ["edit", "delete", "swap", "garbage"])
def test_tampering_is_detected_at_the_first_bad_line(tmp_path, tamper):
    path = _log_with_entries(tmp_path / "audit.jsonl")
    lines = path.read_text().splitlines()
    if tamper == "edit":
        entry = json.loads(lines[2])
        entry["values"] = [0.99]
        lines[2] = json.dumps(entry)
    elif tamper == "delete":
        del lines[2]
    elif tamper == "swap":
        lines[1], lines[2] = lines[2], lines[1]
    else:
        lines[2] = "{not json"
    path.write_text("\n".join(lines) + "\n")
    ok, count, bad_line = verify_chain(path)
    assert not ok and count == (1 if tamper == "swap" else 2) and bad_line == (2 if tamper == "swap" else 3)
    with pytest.raises(AuditChainError, match="fails verification"):
        AuditLog(path)


def test_cli_audit_verify(tmp_path, capsys):
    path = _log_with_entries(tmp_path / "audit.jsonl")
    assert main(["audit", "verify", "--log", str(path)]) == 0
    assert "OK 4 entries" in capsys.readouterr().out
    lines = path.read_text().splitlines()
    lines[0] = lines[0].replace('"trainer"', '"mallory"')
    path.write_text("\n".join(lines) + "\n")
    assert main(["audit", "verify", "--log", str(path)]) == 1
    assert "line 1 breaks the hash chain" in capsys.readouterr().out
