"""Checkpoint intake: every bad upload is refused with its reason and stores nothing."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import grpc
import pytest

from protocol import errors
from protocol.errors import ProtocolError
from protocol.generated.target_feedback.v1 import target_feedback_pb2 as pb
from protocol.validation import MAX_CHUNK_BYTES
from target_owner_node.checkpoint_store import CheckpointStore, ManifestEntry, checkpoint_id_for

from .conftest import manifest_of, upload_messages


def _store(tmp_path: Path, max_bytes: int = 1 << 30, quota: int = 1 << 30) -> CheckpointStore:
    return CheckpointStore(tmp_path / "storage", max_bytes, quota)


def _snapshot(store: CheckpointStore) -> list[str]:
    return sorted(str(p.relative_to(store.root)) for p in store.root.rglob("*"))


def _copy(checkpoint: Path, tmp_path: Path) -> Path:
    target = tmp_path / "ckpt"
    shutil.copytree(checkpoint, target)
    return target


def _refused(
    store: CheckpointStore, messages, reason: str, code=grpc.StatusCode.INVALID_ARGUMENT
) -> ProtocolError:
    before = _snapshot(store)
    with pytest.raises(ProtocolError) as caught:
        store.receive(iter(list(messages)))
    assert (caught.value.code, caught.value.reason) == (code, reason), caught.value
    assert _snapshot(store) == before, "a refused upload left files behind"
    assert not any(store.tmp.iterdir())
    return caught.value


def _manifest(files: list[pb.FileEntry]) -> pb.UploadCheckpointRequest:
    return pb.UploadCheckpointRequest(manifest=pb.CheckpointManifest(files=files))


def _chunk(name: str, data: bytes, offset: int = 0) -> pb.UploadCheckpointRequest:
    return pb.UploadCheckpointRequest(chunk=pb.FileChunk(name=name, offset=offset, data=data))


def test_upload_is_content_addressed_and_reused(tmp_path, tiny_checkpoint):
    store = _store(tmp_path)
    result = store.receive(upload_messages(tiny_checkpoint))
    entries = [ManifestEntry(f.name, f.size, f.sha256) for f in manifest_of(tiny_checkpoint)]
    assert result.checkpoint_id == checkpoint_id_for(entries)
    assert result.bytes_received == sum(e.size for e in entries) and result.reused_files == ()
    assert store.exists(result.checkpoint_id)
    assert {p.name for p in store.blobs.iterdir()} == {e.sha256 for e in entries}
    # Second upload: manifest only, every file is already held.
    again = store.receive(upload_messages(tiny_checkpoint, skip={e.name for e in entries}))
    assert again.checkpoint_id == result.checkpoint_id and again.bytes_received == 0
    assert set(again.reused_files) == {e.name for e in entries}
    folder = store.materialize(result.checkpoint_id)
    assert sorted(p.name for p in folder.iterdir()) == sorted(e.name for e in entries)
    assert (folder / "config.json").read_bytes() == (tiny_checkpoint / "config.json").read_bytes()


@pytest.mark.parametrize(
    "name",
    [
        "pytorch_model.bin",
        "model.pt",
        "weights.pkl",
        "model.ckpt",
        "../config.json",
        "sub/model.safetensors",
        "/etc/passwd",
        "..",
        "model.safetensors/../../x",
        "config.json\x00.bin",
    ],
)
def test_disallowed_file_names(tmp_path, tiny_checkpoint, name):
    store = _store(tmp_path)
    files = manifest_of(tiny_checkpoint) + [pb.FileEntry(name=name, size=4, sha256="0" * 64)]
    error = _refused(store, [_manifest(files), _chunk(name, b"evil")], errors.DISALLOWED_FILE)
    assert "evil" not in error.message


def test_oversized_checkpoint(tmp_path, tiny_checkpoint):
    total = sum(p.stat().st_size for p in tiny_checkpoint.iterdir())
    store = _store(tmp_path, max_bytes=total - 1)
    _refused(store, upload_messages(tiny_checkpoint), errors.UPLOAD_TOO_LARGE)


def test_storage_quota(tmp_path, tiny_checkpoint):
    store = _store(tmp_path, quota=1000)
    _refused(
        store,
        upload_messages(tiny_checkpoint),
        errors.STORAGE_QUOTA_EXCEEDED,
        code=grpc.StatusCode.RESOURCE_EXHAUSTED,
    )


def test_truncated_safetensors(tmp_path, tiny_checkpoint):
    folder = _copy(tiny_checkpoint, tmp_path)
    weights = folder / "model.safetensors"
    weights.write_bytes(
        weights.read_bytes()[: weights.stat().st_size // 2]
    )  # manifest matches the truncation
    _refused(_store(tmp_path), upload_messages(folder), errors.INVALID_CHECKPOINT)


def test_safetensors_that_is_a_pickle(tmp_path, tiny_checkpoint):
    folder = _copy(tiny_checkpoint, tmp_path)
    (folder / "model.safetensors").write_bytes(b"\x80\x04\x95" + b"cos\nsystem\n(S'echo pwned'\ntR." * 4)
    _refused(_store(tmp_path), upload_messages(folder), errors.INVALID_CHECKPOINT)


def test_architecture_outside_allowlist(tmp_path, tiny_checkpoint):
    folder = _copy(tiny_checkpoint, tmp_path)
    config = json.loads((folder / "config.json").read_text())
    config["architectures"] = ["EvilForCausalLM"]
    (folder / "config.json").write_text(json.dumps(config))
    _refused(_store(tmp_path), upload_messages(folder), errors.INVALID_CHECKPOINT)


def test_wrong_sha256(tmp_path, tiny_checkpoint):
    messages = list(upload_messages(tiny_checkpoint))
    messages[0].manifest.files[0].sha256 = "ab" * 32
    _refused(_store(tmp_path), messages, errors.CHECKSUM_MISMATCH)


def test_bad_sha256_format(tmp_path, tiny_checkpoint):
    messages = list(upload_messages(tiny_checkpoint))
    messages[0].manifest.files[0].sha256 = "AB" * 32
    _refused(_store(tmp_path), messages, errors.INVALID_REQUEST)


def test_chunk_over_one_mib(tmp_path, tiny_checkpoint):
    big = b"\0" * (MAX_CHUNK_BYTES + 1)
    files = [f for f in manifest_of(tiny_checkpoint) if f.name != "model.safetensors"]
    files.append(
        pb.FileEntry(name="model.safetensors", size=len(big), sha256=hashlib.sha256(big).hexdigest())
    )
    _refused(_store(tmp_path), [_manifest(files), _chunk("model.safetensors", big)], errors.UPLOAD_TOO_LARGE)


def test_manifest_must_come_first_and_only_once(tmp_path, tiny_checkpoint):
    messages = list(upload_messages(tiny_checkpoint))
    store = _store(tmp_path)
    _refused(store, messages[1:] + messages[:1], errors.INVALID_REQUEST)
    _refused(store, messages + messages[:1], errors.INVALID_REQUEST)
    _refused(store, [], errors.INVALID_REQUEST)


def test_missing_file_data_and_partial_file(tmp_path, tiny_checkpoint):
    store = _store(tmp_path)
    _refused(store, upload_messages(tiny_checkpoint, skip={"config.json"}), errors.MISSING_FILE_DATA)
    messages = list(upload_messages(tiny_checkpoint, chunk=64))
    # drop the last chunk of one file: fewer bytes than declared
    last = max(
        i
        for i, m in enumerate(messages)
        if m.WhichOneof("payload") == "chunk" and m.chunk.name == "tokenizer.json"
    )
    del messages[last]
    _refused(store, messages, errors.MISSING_FILE_DATA)


def test_out_of_order_and_unlisted_chunks(tmp_path, tiny_checkpoint):
    store = _store(tmp_path)
    messages = list(upload_messages(tiny_checkpoint, chunk=64))
    messages[2].chunk.offset += 1
    _refused(store, messages, errors.INVALID_REQUEST)
    messages = list(upload_messages(tiny_checkpoint)) + [_chunk("special_tokens_map.json", b"{}")]
    _refused(store, messages, errors.INVALID_REQUEST)


def test_required_files(tmp_path, tiny_checkpoint):
    store = _store(tmp_path)
    messages = list(upload_messages(tiny_checkpoint, skip={"tokenizer.json"}))
    files = [f for f in messages[0].manifest.files if f.name != "tokenizer.json"]
    del messages[0].manifest.files[:]
    messages[0].manifest.files.extend(files)
    _refused(store, messages, errors.INVALID_CHECKPOINT)


def _edit(folder: Path, name: str, change) -> None:
    path = folder / name
    value = json.loads(path.read_text())
    change(value)
    path.write_text(json.dumps(value))


def _token_past_embedding(folder: Path) -> None:
    from protocol.conformance.checkpoints import tokenizer_with_token_past_embedding

    rows = json.loads((folder / "config.json").read_text())["vocab_size"]
    path = folder / "tokenizer.json"
    path.write_bytes(tokenizer_with_token_past_embedding(path.read_bytes(), rows, "GUESSED-HELD-OUT-STRING"))


@pytest.mark.parametrize(
    "damage, expected",
    [
        # The reproduced attack (issue 11, hole 1): an added token one past the embedding's rows.
        (_token_past_embedding, "tokenizer.json: 'added_tokens[1]'"),
        (lambda f: _edit(f, "tokenizer.json", lambda t: t.update(
            normalizer={"type": "Replace", "pattern": {"Regex": "GUESS.*"}, "content": ""})),
         "tokenizer.json: 'normalizer.pattern' is a regular expression"),
        (lambda f: _edit(f, "tokenizer_config.json", lambda t: t.update(chat_template="{{ messages }}")),
         "tokenizer_config.json: 'chat_template'"),
        (lambda f: _edit(f, "config.json", lambda c: c.update(quantization_config={"quant_method": "awq"})),
         "config.json: 'quantization_config'"),
        (lambda f: _edit(f, "config.json", lambda c: c.update(model_type="llama")),
         "config.json: 'model_type' is 'llama' but architecture Qwen2ForCausalLM needs 'qwen2'"),
        (lambda f: _edit(f, "config.json", lambda c: c.update(rope_parameters={**c["rope_parameters"],
                                                                                "auto_map": {"A": "x.B"}})),
         "config.json: 'rope_parameters.auto_map'"),
    ],
)
def test_uploads_that_could_fail_an_evaluation_are_refused(tmp_path, tiny_checkpoint, damage, expected):
    """Refused at upload with INVALID_ARGUMENT naming the file and field; nothing is stored."""
    folder = _copy(tiny_checkpoint, tmp_path)
    damage(folder)
    error = _refused(_store(tmp_path), upload_messages(folder), errors.INVALID_CHECKPOINT)
    assert error.message.startswith(expected), error.message


def test_dry_run_refusal_stores_nothing_and_one_run_covers_a_structure(tmp_path, tiny_checkpoint):
    """The dry run runs at upload, before anything is stored; a checkpoint whose files differ from an
    already probed one only in tensor values (a lookahead candidate) is not probed again, but a new
    config or tokenizer is."""
    probed: list[str] = []
    refuse = {"flag": False}

    def probe(checkpoint_id: str, folder: Path) -> None:
        assert (folder / "config.json").is_file() and (folder / "model.safetensors").is_file()
        probed.append(checkpoint_id)
        if refuse["flag"]:
            raise ProtocolError(grpc.StatusCode.INVALID_ARGUMENT, errors.INVALID_CHECKPOINT, "dry run failed")

    store = CheckpointStore(tmp_path / "store", 1 << 30, 1 << 30, probe=probe)
    first = store.receive(upload_messages(tiny_checkpoint)).checkpoint_id
    assert probed == [first]

    weights_only = _copy(tiny_checkpoint, tmp_path / "w")
    data = bytearray((weights_only / "model.safetensors").read_bytes())
    data[-1] ^= 1  # a tensor value, not the header
    (weights_only / "model.safetensors").write_bytes(bytes(data))
    second = store.receive(upload_messages(weights_only)).checkpoint_id
    assert second != first and probed == [first], "same structure: no second dry run"

    new_structure = _copy(tiny_checkpoint, tmp_path / "g")
    (new_structure / "generation_config.json").write_text('{"max_length": 7}')
    refuse["flag"] = True
    before = _snapshot(store)
    with pytest.raises(ProtocolError) as refused:
        store.receive(upload_messages(new_structure))
    assert refused.value.reason == errors.INVALID_CHECKPOINT and len(probed) == 2
    assert _snapshot(store) == before, "a refused dry run stores nothing"
