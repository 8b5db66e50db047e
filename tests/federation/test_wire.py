"""protocol/federation_wire.py: checkpoints cross as ArrayRecord-ready arrays bit-exactly
(bf16 as its uint16 bit pattern), and the schema refuses anything that is not one public RPC."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file, save_file

from protocol import federation_wire as wire


def test_a_bf16_checkpoint_round_trips_bit_exactly(tmp_path):
    source, out = tmp_path / "in", tmp_path / "out"
    source.mkdir(), out.mkdir()
    tensors = {"w": torch.randn(3, 5).to(torch.bfloat16), "b": torch.arange(4, dtype=torch.int64),
               "h": torch.randn(2).half(), "f": torch.randn(2, 2)}
    save_file(tensors, source / "model.safetensors", metadata={"format": "pt"})
    (source / "config.json").write_text('{"model_type": "gpt2"}')
    arrays, files = wire.encode_checkpoint(source)
    assert str(arrays["model.safetensors::w"].dtype) == "uint16"  # the explicit bf16 conversion
    wire.decode_checkpoint(arrays, files, out)
    back = load_file(out / "model.safetensors")
    assert back.keys() == tensors.keys()
    for name, tensor in tensors.items():
        assert back[name].dtype == tensor.dtype and torch.equal(back[name], tensor)
    assert (out / "config.json").read_bytes() == (source / "config.json").read_bytes()


def test_the_flower_array_of_a_bf16_tensor_is_exact(tmp_path):
    from flwr.app import Array, ArrayRecord

    source = tmp_path / "in"
    source.mkdir()
    weight = torch.randn(4, 4).to(torch.bfloat16)
    save_file({"w": weight}, source / "model.safetensors")
    arrays, _ = wire.encode_checkpoint(source)
    record = ArrayRecord({k: Array(v) for k, v in arrays.items()})
    carried = record["model.safetensors::w"].numpy()
    assert torch.equal(torch.from_numpy(carried.copy()).view(torch.bfloat16), weight)


def test_disallowed_files_do_not_travel(tmp_path):
    (tmp_path / "model.safetensors").write_bytes(b"")
    (tmp_path / "evil.pkl").write_bytes(b"x")
    with pytest.raises(wire.WireError, match="evil.pkl"):
        wire.encode_checkpoint(tmp_path)


@pytest.mark.parametrize("action, records, keys, match", [
    ("per_example", {}, {}, "not a public RPC"),
    ("evaluate", {"request": "config", "rows": "config"}, {"request": {"evaluate_request"}}, "unknown record"),
    ("evaluate", {"request": "config"}, {"request": {"evaluate_request", "per_example"}}, "exactly the key"),
    ("evaluate", {"request": "array"}, {}, "must be a config record"),
    ("upload", {"tensors": "array", "files": "config"}, {"files": {"heldout.jsonl"}}, "heldout.jsonl"),
    ("info", {"x": "config"}, {"x": set()}, "unknown record"),
    ("upload", {"tensors": "array"}, {}, "missing record"),
])
def test_anything_but_one_public_rpc_is_refused(action, records, keys, match):
    with pytest.raises(wire.WireError, match=match):
        wire.check_request(action, records, keys)


def test_a_decoded_upload_refuses_arrays_outside_the_table(tmp_path):
    import numpy as np

    source = tmp_path / "in"
    source.mkdir()
    save_file({"w": torch.zeros(2)}, source / "model.safetensors")
    arrays, files = wire.encode_checkpoint(source)
    arrays["model.safetensors::extra"] = np.zeros(2, dtype="float32")
    with pytest.raises(wire.WireError, match="not in the tensor table"):
        wire.decode_checkpoint(arrays, files, tmp_path)


def test_a_rebuilt_file_is_byte_identical_so_its_content_address_holds(tmp_path):
    source, out = tmp_path / "in", tmp_path / "out"
    source.mkdir(), out.mkdir()
    save_file({"w": torch.randn(3, 5).to(torch.bfloat16), "b": torch.zeros(3)}, source / "model.safetensors",
              metadata={"format": "pt"})
    (source / "config.json").write_text('{"model_type": "gpt2"}')
    arrays, files = wire.encode_checkpoint(source)
    manifest = wire.decode_checkpoint(arrays, files, out)
    for name, size, sha in manifest:
        assert wire.sha256_file(out / name) == sha == wire.sha256_file(source / name)
        assert (out / name).stat().st_size == size


def test_files_the_owner_holds_are_listed_but_not_carried(tmp_path):
    source = tmp_path / "in"
    source.mkdir()
    save_file({"w": torch.ones(4)}, source / "model-00001-of-00002.safetensors")
    save_file({"v": torch.ones(2)}, source / "model-00002-of-00002.safetensors")
    (source / "config.json").write_text("{}")
    held = {wire.sha256_file(source / name) for name in ("model-00001-of-00002.safetensors", "config.json")}
    arrays, files = wire.encode_checkpoint(source, held=held)
    assert list(arrays) == ["model-00002-of-00002.safetensors::v"] and "config.json" not in files
    assert [name for name, _, _ in wire.read_manifest(files)] == [
        "config.json", "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    out = tmp_path / "out"
    out.mkdir()
    wire.decode_checkpoint(arrays, files, out)
    assert sorted(p.name for p in out.iterdir()) == ["model-00002-of-00002.safetensors"]  # the owner fills the rest


def test_a_carried_file_outside_the_manifest_or_a_header_that_disagrees_is_refused(tmp_path):
    import json

    source = tmp_path / "in"
    source.mkdir()
    save_file({"w": torch.ones(4)}, source / "model.safetensors")
    (source / "config.json").write_text("{}")
    arrays, files = wire.encode_checkpoint(source)
    unlisted = {**files, wire.MANIFEST_KEY: json.dumps({"model.safetensors": [1, "0" * 64]}).encode()}
    with pytest.raises(wire.WireError, match="config.json"):
        wire.decode_checkpoint(arrays, unlisted, tmp_path)
    table = json.loads(files[wire.TENSOR_META_KEY])
    table["model.safetensors"]["header"] = table["model.safetensors"]["header"].replace("[4]", "[2,2]")
    with pytest.raises(wire.WireError, match="disagrees with its header"):
        wire.decode_checkpoint(arrays, {**files, wire.TENSOR_META_KEY: json.dumps(table).encode()}, tmp_path)
    bad_manifest = {**files, wire.MANIFEST_KEY: b'{"model.safetensors": [1, "not-a-sha"]}'}
    with pytest.raises(wire.WireError, match="sha256 in hex"):
        wire.decode_checkpoint(arrays, bad_manifest, tmp_path)
