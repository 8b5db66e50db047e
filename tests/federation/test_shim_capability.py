"""The shim's only capability is the owner's public RPCs (issue 17's acceptance):

- it imports nothing but flwr, grpc/protobuf, the standard library and protocol's public client
  and wire schema, and its files name no data path;
- a message with an unknown key, an unknown record, a request for per-example data or an
  EvaluateRequest with undefined fields is refused before the owner is called;
- it works as an unprivileged user that cannot read the owner's data folder.
"""

from __future__ import annotations

import ast
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

from protocol import federation_wire as wire
from protocol.generated.target_feedback.v1 import target_feedback_pb2 as pb
from tests.federation.conftest import flower_client

ROOT = Path(__file__).resolve().parents[2]
SHIM = ROOT / "flower_shim"
ALLOWED_MODULES = {"protocol.public_client", "protocol.federation_wire", "protocol.generated.target_feedback.v1",
                   "flwr.app", "flwr.clientapp", "grpc", "google.protobuf", "__future__"}
STDLIB = set(sys.stdlib_module_names)


def shim_imports() -> set[str]:
    found = set()
    for path in SHIM.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module:
                module = node.module if node.level == 0 else f"flower_shim.{node.module}"
                # `from protocol import x` imports protocol.x; `from grpc import y` is still grpc
                found |= {f"{module}.{alias.name}" if module == "protocol" else module for alias in node.names}
    return found


def test_the_shim_imports_only_the_public_client_and_flower():
    unexpected = {name for name in shim_imports()
                  if name.split(".")[0] not in STDLIB and name not in ALLOWED_MODULES
                  and not name.startswith("protocol.generated.")}
    assert unexpected == set()
    assert not any(name.split(".")[0] in {"trainer_node", "target_owner_node", "lab", "rlvr_core"}
                   for name in shim_imports())


def test_the_shims_files_name_no_data_path():
    text = "\n".join(path.read_text() for path in SHIM.rglob("*.py")).lower()
    for word in ("heldout", "held_out", "ledger", "jsonl", "data_dir", "storage", "accountant", "noise_std"):
        assert word not in text, f"flower_shim mentions {word!r}"


def test_the_wire_schema_imports_nothing_of_either_node():
    source = (ROOT / "protocol" / "federation_wire.py").read_text()
    assert "trainer_node" not in source.replace("trainer_node/federation", "") and "target_owner_node" not in source


def _ask(client, action, records):
    from flwr.app import Message, RecordDict

    message = Message(RecordDict(records), dst_node_id=client.node_id, message_type=f"query.{action}")
    return next(iter(client.grid.send_and_receive([message])))


def _refusal(reply):
    assert reply.has_content() and wire.ERROR_RECORD in reply.content.config_records, reply
    return dict(reply.content.config_records[wire.ERROR_RECORD])


@pytest.fixture()
def shim(owner, pki):
    client = flower_client(owner.port, pki)
    yield client
    client.close()


def test_unknown_keys_and_records_are_refused_before_the_owner_is_called(shim, owner):
    from flwr.app import ConfigRecord

    request = pb.EvaluateRequest(checkpoint_ids=["0" * 64], decoding=pb.DecodingSettings(max_new_tokens=4))
    for records in ({"request": ConfigRecord({wire.EVALUATE_REQUEST_KEY: request.SerializeToString(),
                                              "return_per_example": True})},
                    {"request": ConfigRecord({wire.EVALUATE_REQUEST_KEY: request.SerializeToString()}),
                     "per_example": ConfigRecord({"rows": "all"})}):
        refused = _refusal(_ask(shim, "evaluate", records))
        assert refused["code"] == "INVALID_ARGUMENT" and refused["reason"] == "FEDERATION_MESSAGE_REFUSED"
    assert owner.node.scorer.calls == []


def test_an_evaluate_request_with_undefined_fields_is_refused(shim, owner):
    from flwr.app import ConfigRecord

    base = pb.EvaluateRequest(checkpoint_ids=["0" * 64]).SerializeToString()
    smuggled = base + bytes([0x98, 0x06, 0x01])  # field 99 (varint 1): not in target_feedback.v1
    refused = _refusal(_ask(shim, "evaluate", {"request": ConfigRecord({wire.EVALUATE_REQUEST_KEY: smuggled})}))
    assert "does not define" in refused["message"]
    assert owner.node.scorer.calls == []


def test_a_request_for_per_example_data_is_refused(shim, owner):
    reply = _ask(shim, "per_example", {})
    assert reply.has_error()  # no handler: Flower refuses an action the shim does not register
    assert "per_example" in reply.error.reason
    assert owner.node.scorer.calls == []


def test_the_shim_runs_as_a_user_that_cannot_read_the_owners_data(owner, pki, data_dir):
    """The shim runs with every capability dropped (setpriv: no CAP_DAC_OVERRIDE, so file modes
    bind even for uid 0) while the owner's data folder is mode 000: it cannot read the held-out
    rows, and its RPCs still work, since they need only the client certificate."""
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("dropping privileges needs root and setpriv")
    mode = stat.S_IMODE(os.stat(data_dir).st_mode)
    certs = Path(tempfile.mkdtemp(prefix="shim-certs-"))
    try:
        for key in ("ca_cert", "client_cert", "client_key"):
            shutil.copy(pki[key], certs / key)
            os.chmod(certs / key, 0o644)
        os.chmod(certs, 0o755)
        os.chmod(data_dir, 0o000)
        script = textwrap.dedent(f"""
            import os, sys
            from pathlib import Path
            assert open("/proc/self/status").read().count("CapEff:\t0000000000000000") == 1
            try:
                Path({str(data_dir / "heldout.jsonl")!r}).read_bytes()
            except PermissionError:
                pass
            else:
                sys.exit("the shim's user could read the owner's held-out data")
            from flower_shim.app import make_client_app
            from protocol.public_client import PublicClientSettings
            from trainer_node.federation.loopback_grid import LoopbackGrid
            from trainer_node.federation.client import FlowerOwnerClient
            certs = Path({str(certs)!r})
            settings = PublicClientSettings(target="127.0.0.1:{owner.port}", ca_cert=certs / "ca_cert",
                                            client_cert=certs / "client_cert", client_key=certs / "client_key",
                                            server_name="localhost")
            client = FlowerOwnerClient(LoopbackGrid(make_client_app(lambda c: ("a", settings)), {{1: {{}}}}), 1)
            print("heldout_size", client.info().heldout_size, "spent", client.budget().epsilon_spent)
        """)
        env = {**os.environ, "PYTHONPATH": str(ROOT), "HOME": str(certs)}

        drop = ["setpriv", "--inh-caps=-all", "--bounding-set=-all", "--no-new-privs", "--"]
        result = subprocess.run([*drop, sys.executable, "-c", script], capture_output=True, text=True, env=env,
                                cwd=str(certs), timeout=120, check=False)
        assert result.returncode == 0, result.stdout + result.stderr
        assert "heldout_size" in result.stdout
    finally:
        os.chmod(data_dir, mode)
        shutil.rmtree(certs)


def test_a_failure_inside_the_shim_carries_no_traceback_or_path(shim, owner):
    """An upload whose tensor table names an array the message does not carry fails inside the
    shim; the trainer gets the exception's type only, never a traceback or a local path."""
    import json

    from flwr.app import ArrayRecord, ConfigRecord

    manifest = json.dumps({"model.safetensors": [8, "0" * 64], "config.json": [2, "1" * 64]}).encode()
    table = {"model.safetensors": {"header": "{}", "tensors": {"w": ["F32", [2]]}}}
    files = ConfigRecord({wire.TENSOR_META_KEY: json.dumps(table).encode(), "config.json": b"{}",
                          wire.MANIFEST_KEY: manifest})
    refused = _refusal(_ask(shim, "upload", {"tensors": ArrayRecord({}), "files": files}))
    assert refused["code"] == "INVALID_ARGUMENT" and "not in the arrays" in refused["message"]
    bad = {wire.TENSOR_META_KEY: b"{\"model.safetensors\": {\"tensors\": {\"w\": 1}}}", wire.MANIFEST_KEY: manifest}
    failed = _refusal(_ask(shim, "upload", {"tensors": ArrayRecord({}), "files": ConfigRecord(bad)}))
    assert failed["code"] == "INTERNAL" and failed["reason"] == "FEDERATION_SHIM_FAILED"
    assert "Traceback" not in failed["message"] and "/" not in failed["message"]
