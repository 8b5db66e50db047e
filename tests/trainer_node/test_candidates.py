"""The candidate writer's shard files: byte-identical to safetensors', written without copying the
tensor, and the background query thread that writes them yields the CPU to training (issue 14)."""

from __future__ import annotations

import hashlib
import os
import sys
import threading

import pytest
import torch
from safetensors.torch import load_file, save

from trainer_node.feedback.candidates import SHARD_METADATA, shard_parts, store_blob
from trainer_node.feedback.context import BACKGROUND_NICE, yield_cpu_to_training

DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.int64, torch.int32, torch.uint8,
          torch.bool]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(3, 5), (), (0,), (7,), (2, 3, 4)])
def test_shard_parts_are_the_bytes_safetensors_writes(dtype, shape):
    tensor = (torch.rand(shape) * 10).to(dtype)
    header, data = shard_parts("model.layers.0.self_attn.q_proj.weight", tensor)
    assert header + bytes(data) == save({"model.layers.0.self_attn.q_proj.weight": tensor}, metadata=SHARD_METADATA)


def test_shard_parts_of_a_non_contiguous_tensor():
    tensor = torch.rand(4, 6).t()
    header, data = shard_parts("w", tensor)
    assert header + bytes(data) == save({"w": tensor.contiguous()}, metadata=SHARD_METADATA)


def test_shard_data_is_a_view_of_the_tensor_not_a_copy():
    tensor = torch.rand(64, 64)
    _, data = shard_parts("w", tensor)
    tensor[0, 0] = 123.0
    assert torch.frombuffer(bytearray(data), dtype=torch.float32)[0].item() == 123.0


def test_store_blob_writes_the_parts_once_under_their_digest(tmp_path):
    tensor = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    parts = shard_parts("w", tensor)
    digest, size = store_blob(tmp_path, *parts)
    blob = tmp_path / digest
    assert digest == hashlib.sha256(b"".join(bytes(p) for p in parts)).hexdigest()
    assert size == blob.stat().st_size
    assert torch.equal(load_file(str(blob))["w"], tensor)
    stamp = blob.stat().st_mtime_ns
    assert store_blob(str(tmp_path), *parts) == (digest, size)  # a string folder too; kept, not rewritten
    assert blob.stat().st_mtime_ns == stamp
    assert sorted(os.listdir(tmp_path)) == [digest]  # no temporary file left behind


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread nice values are Linux's")
def test_the_background_thread_lowers_its_own_priority_only():
    before = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    seen = {}

    def background():
        seen["set"] = yield_cpu_to_training()
        seen["nice"] = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())

    thread = threading.Thread(target=background)
    thread.start()
    thread.join()
    assert seen == {"set": True, "nice": max(before, BACKGROUND_NICE)}
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == before  # the caller keeps its own
