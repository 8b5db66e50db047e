"""Shared fixtures: a synthetic held-out set with canaries, test-time PKI, a tiny random
policy, config building, in-process servers on port 0, and an mTLS client that records
every byte it receives (for the canary checks)."""

from __future__ import annotations

import contextlib
import hashlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest

from protocol.generated.target_feedback.v1 import target_feedback_pb2 as pb
from protocol.validation import MAX_CHUNK_BYTES
from rlvr_core.tasks.example import Example
from rlvr_core.tasks.io import write_examples
from target_owner_node import logs
from target_owner_node.config import OwnerConfig, parse_config

HELDOUT_SIZE = 120
TEST_SIZE = 20
TEST_DOMAINS = ("easy", "hard")  # the declared domains of test_examples()
SERVICE = "/target_feedback.v1.TargetFeedbackService/"


def canary(kind: str, i: int) -> str:
    return f"CANARY{kind}{i:04d}ZQX"


def all_canaries() -> list[bytes]:
    return [canary(kind, i).encode() for kind in "PA" for i in range(HELDOUT_SIZE)]


def heldout_examples() -> list[Example]:
    """Rows whose every prompt and answer carries a unique canary string."""
    rows = []
    for i in range(HELDOUT_SIZE):
        a, b = i % 7, (3 * i) % 5
        rows.append(
            Example(
                id=f"h{i}",
                prompt=f"{a}+{b}= {canary('P', i)}",
                answer=f"{a + b} {canary('A', i)}",
                task="add",
                domain="add",
                verifier="exact_match",
            )
        )
    return rows


def test_examples() -> list[Example]:
    return [
        Example(
            id=f"t{i}",
            prompt=f"{i % 3}+1=",
            answer=str(i % 3 + 1),
            domain="easy" if i % 2 else "hard",
            verifier="exact_match",
        )
        for i in range(TEST_SIZE)
    ]


@pytest.fixture(autouse=True, scope="session")
def _quiet_logs():
    logs.configure(enabled=False)
    yield
    logs.configure(enabled=True)


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("data")
    write_examples(root / "heldout.jsonl", heldout_examples())
    write_examples(root / "test.jsonl", test_examples())
    return root


@pytest.fixture(scope="session")
def pki(tmp_path_factory) -> dict[str, Path]:
    """Owner PKI (CA, server cert for localhost, client cert CN=trainer) + a client of another CA."""
    from protocol.tls import write_owner_pki

    root = tmp_path_factory.mktemp("pki")
    owner = {
        k: Path(v) for k, v in write_owner_pki(root / "owner", ["localhost", "127.0.0.1"], "trainer").items()
    }
    other = {k: Path(v) for k, v in write_owner_pki(root / "other", ["localhost"], "trainer").items()}
    return {
        **owner,
        "other_client_cert": other["client_cert"],
        "other_client_key": other["client_key"],
        "other_ca_cert": other["ca_cert"],
    }


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory) -> Path:
    from rlvr_core.models.tiny_policy import random_tiny_policy

    texts = [e.prompt for e in test_examples()] + ["0123456789+= Answer:"]
    return random_tiny_policy(tmp_path_factory.mktemp("ckpt") / "tiny", texts, seed=0)


def config_dict(tmp_path: Path, data_dir: Path, pki: dict[str, Path], **sections: dict[str, Any]) -> dict:
    """A test config as a mapping; `section=None` removes a section, a dict updates it."""
    raw: dict[str, Any] = {
        "data": {
            "heldout_path": str(data_dir / "heldout.jsonl"),
            "test_path": str(data_dir / "test.jsonl"),
            "test_split_enabled": True,
            "test_domains": list(TEST_DOMAINS),
            "min_heldout_size": 100,
            "prompt_template": "{prompt}",
        },
        "evaluation": {"max_new_tokens": 8, "max_samples_per_prompt": 4, "max_candidates_per_query": 4},
        # q = 1 keeps accounting cheap (opacus' RDP at q < 1 can take a second per query);
        # tests about subsampling set sample_rate themselves.
        "privacy": {"epsilon_budget": 1.0, "delta": 1e-5, "planned_releases": 10, "sample_rate": 1.0},
        "tls": {
            "ca_cert": str(pki["ca_cert"]),
            "server_cert": str(pki["server_cert"]),
            "server_key": str(pki["server_key"]),
        },
        "server": {"listen_address": "localhost:0", "drain_delay_s": 0.0, "shutdown_grace_s": 2.0},
        "storage": {"dir": str(tmp_path / "storage")},
    }
    for section, values in sections.items():
        if values is None:
            raw.pop(section, None)
        else:
            raw.setdefault(section, {}).update(values)
    return raw


def make_config(
    tmp_path: Path, data_dir: Path, pki: dict[str, Path], **sections: dict[str, Any]
) -> OwnerConfig:
    return parse_config(config_dict(tmp_path, data_dir, pki, **sections), tmp_path)


def write_toml(path: Path, raw: dict[str, dict[str, Any]]) -> Path:
    """Enough TOML for test configs (tables of strings, numbers, booleans, string lists)."""
    lines = []
    for section, values in raw.items():
        lines.append(f"[{section}]")
        for key, value in values.items():
            lines.append(f"{key} = {json.dumps(value)}")
    path.write_text("\n".join(lines) + "\n")
    return path


class FakeScorer:
    """Scores without a model: every row of checkpoint c scores `values[c]` (default 0.5); in a
    difference release every row of candidate c differs from the base by `differences[c]` (default
    `default_difference`), unclipped: the release must clip it."""

    def __init__(self, default: float = 0.5, default_difference: float = 0.02) -> None:
        self.default = default
        self.default_difference = default_difference
        self.values: dict[str, float] = {}
        self.differences_of: dict[str, float] = {}
        self.calls: list[tuple[str, tuple[str, ...], int]] = []
        self.difference_calls: list[tuple[str, tuple[str, ...], int, str, float]] = []
        self.rows: list[np.ndarray] = []  # the row indices of each call
        self.fail_next = None

    def differences(self, split, checkpoints, indices, decoding, metric, clip):
        ids = tuple(cid for cid, _ in checkpoints)
        self.difference_calls.append((split, ids, len(indices), metric, clip))
        self.rows.append(np.asarray(indices))
        if self.fail_next is not None:
            error, self.fail_next = self.fail_next, None
            raise error
        return np.array([[self.differences_of.get(cid, self.default_difference)] * len(indices) for cid in ids[1:]],
                        dtype=float)

    def score(self, split, checkpoints, indices, decoding):
        self.calls.append((split, tuple(cid for cid, _ in checkpoints), len(indices)))
        self.rows.append(np.asarray(indices))
        if self.fail_next is not None:
            error, self.fail_next = self.fail_next, None
            raise error
        return np.array(
            [[self.values.get(cid, self.default)] * len(indices) for cid, _ in checkpoints], dtype=float
        )

    def close(self) -> None:
        pass


@contextlib.contextmanager
def running_server(config: OwnerConfig, **kwargs) -> Iterator[Any]:
    from target_owner_node.server import start_server

    running = start_server(config, "localhost:0", **kwargs)
    try:
        yield running
    finally:
        running.shutdown(grace_s=0, drain_delay_s=0)


class RecordingClient:
    """Calls the service over mTLS and keeps every byte received: responses (serialized),
    status messages, trailing metadata (which carries the ErrorInfo details)."""

    def __init__(
        self,
        port: int,
        pki: dict[str, Path],
        cert: str = "client_cert",
        key: str = "client_key",
        ca: str = "ca_cert",
    ) -> None:
        from protocol.tls import channel_credentials

        credentials = channel_credentials(pki[ca].read_bytes(), pki[cert].read_bytes(), pki[key].read_bytes())
        self.channel = grpc.secure_channel(f"localhost:{port}", credentials)
        self.received: list[bytes] = []

    def _deserializer(self, message_type):
        def parse(raw: bytes):
            self.received.append(bytes(raw))
            return message_type.FromString(raw)

        return parse

    def _record_error(self, error: grpc.RpcError) -> None:
        self.received.append((error.details() or "").encode())
        for key, value in list(error.trailing_metadata() or ()) + list(error.initial_metadata() or ()):
            self.received.append(key.encode() + (value if isinstance(value, bytes) else value.encode()))

    def call(self, method: str, request, response_type, timeout: float = 120):
        stub = self.channel.unary_unary(
            SERVICE + method,
            request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=self._deserializer(response_type),
        )
        try:
            return stub(request, timeout=timeout)
        except grpc.RpcError as error:
            self._record_error(error)
            raise

    def upload_messages(self, messages, timeout: float = 120) -> pb.UploadCheckpointResponse:
        stub = self.channel.stream_unary(
            SERVICE + "UploadCheckpoint",
            request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=self._deserializer(pb.UploadCheckpointResponse),
        )
        try:
            return stub(iter(messages), timeout=timeout)
        except grpc.RpcError as error:
            self._record_error(error)
            raise

    def upload_dir(self, directory: Path) -> pb.UploadCheckpointResponse:
        return self.upload_messages(upload_messages(directory))

    def info(self) -> pb.GetInfoResponse:
        return self.call("GetInfo", pb.GetInfoRequest(), pb.GetInfoResponse)

    def budget(self) -> pb.GetBudgetResponse:
        return self.call("GetBudget", pb.GetBudgetRequest(), pb.GetBudgetResponse)

    def evaluate(self, checkpoint_ids, request_id: str = "", split=pb.SPLIT_FEEDBACK, kind=None, difference=None,
                 **decoding):
        settings = {"max_new_tokens": 4, "samples_per_prompt": 1, "temperature": 0.0, "seed": 1, **decoding}
        request = pb.EvaluateRequest(
            checkpoint_ids=list(checkpoint_ids),
            decoding=pb.DecodingSettings(**settings),
            split=split,
            request_id=request_id,
            kind=kind,
            difference=difference,
        )
        return self.call("Evaluate", request, pb.EvaluateResponse)

    def evaluate_difference(self, checkpoint_ids, metric="answer_probability", clip=0.1, **kwargs):
        """A RELEASE_KIND_ACCURACY_DIFFERENCE release of checkpoint_ids[1:] against checkpoint_ids[0]."""
        return self.evaluate(checkpoint_ids, kind=pb.RELEASE_KIND_ACCURACY_DIFFERENCE,
                             difference=pb.DifferenceRequest(metric=metric, clip=clip), **kwargs)

    def close(self) -> None:
        self.channel.close()


def manifest_of(directory: Path) -> list[pb.FileEntry]:
    return [
        pb.FileEntry(name=p.name, size=p.stat().st_size, sha256=hashlib.sha256(p.read_bytes()).hexdigest())
        for p in sorted(directory.iterdir())
    ]


def upload_messages(directory: Path, skip: set[str] = frozenset(), chunk: int = MAX_CHUNK_BYTES):
    yield pb.UploadCheckpointRequest(manifest=pb.CheckpointManifest(files=manifest_of(directory)))
    for path in sorted(directory.iterdir()):
        if path.name in skip:
            continue
        data = path.read_bytes()
        for offset in range(0, max(len(data), 1), chunk):
            yield pb.UploadCheckpointRequest(
                chunk=pb.FileChunk(name=path.name, offset=offset, data=data[offset : offset + chunk])
            )


def assert_no_canary(received: list[bytes]) -> None:
    blob = b"\n".join(received)
    assert b"CANARY" not in blob, "a held-out canary reached the client"
    # Belt and braces: each full canary too (in case a transform split the prefix).
    for item in all_canaries()[::17]:
        assert item not in blob


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
