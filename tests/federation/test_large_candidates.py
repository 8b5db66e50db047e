"""Large candidates over Flower (issue 17 item 6, with issue 14's shard deltas): an upload carries a
manifest of every file but only the files the owner does not hold, so a per-tensor-shard candidate
that changes k of T tensors carries about k/T of the weight bytes, on the Flower path as on the
direct one; a file the owner lost is sent again in full."""

from __future__ import annotations

import pytest
import torch

from protocol.generated.target_feedback.v1 import target_feedback_pb2 as pb
from rlvr_core.models.loading import load_policy
from tests.trainer_node.grpo_helpers import make_model_dir
from trainer_node.feedback.candidates import CandidateWriter

DECODING = pb.DecodingSettings(max_new_tokens=4, samples_per_prompt=1, seed=3)
OVERHEAD = 16 * 1024  # the manifest, the tensor table and the safetensors headers of the carried shards


def owner_received(client) -> int:
    """What the owner says it received for the client's latest upload."""
    flower = getattr(client, "last_bytes_received", None)
    return flower if flower is not None else client.last_upload_bytes


@pytest.fixture()
def candidates(tmp_path):
    """A base checkpoint and a candidate that changes k = T/4 of its T tensors (per-tensor shards)."""
    model, tokenizer = load_policy(make_model_dir(tmp_path), "cpu", torch.float32)
    writer = CandidateWriter(model, tokenizer, tmp_path / "candidates")
    state = {name: tensor.detach().clone() for name, tensor in model.state_dict().items()}
    names = list(writer.tensor_names)
    changed_names = names[: max(1, len(names) // 4)]
    base = writer.write(state, "base")
    candidate = writer.write({**state, **{n: state[n] + 1.0 for n in changed_names}}, "candidate")
    other = writer.write({**state, names[-1]: state[names[-1]] - 1.0}, "other")
    changed_bytes = sum(state[n].numel() * state[n].element_size() for n in changed_names)
    return base, candidate, other, changed_bytes, len(changed_names), len(names)


def test_a_candidate_changing_k_of_t_tensors_sends_only_its_new_shards(transport, candidates):
    base, candidate, _, changed_bytes, k, total = candidates
    first = transport.upload(base.directory, base.digests)
    assert owner_received(transport) == base.total_bytes  # nothing held yet: every file
    full = transport.last_upload_bytes
    second = transport.upload(candidate.directory, candidate.digests)
    held = set(base.digests.values())
    new_files = {name for name, digest in candidate.digests.items() if digest not in held}
    assert len(new_files) == k < total
    assert owner_received(transport) == sum(candidate.sizes[name] for name in new_files)
    # the changed tensors' bytes (their share of the weights: k/T when tensors are of one size), no more
    assert changed_bytes <= transport.last_upload_bytes <= changed_bytes + OVERHEAD < full
    # the owner rebuilt the candidate from what it held plus the new shards: it evaluates
    response = transport.evaluate([first, second], DECODING)
    assert [r.checkpoint_id for r in response.results] == [first, second] and first != second


def test_flower_carries_the_new_tensors_bytes_and_the_owner_agrees(owner, pki, candidates):
    from tests.federation.conftest import flower_client

    base, candidate, _, changed_bytes, _, _ = candidates
    client = flower_client(owner.port, pki)
    client.upload(base.directory, base.digests)
    full = client.last_upload_bytes
    client.upload(candidate.directory, candidate.digests)
    print(f"flower upload bytes: base {full}, candidate {client.last_upload_bytes} "
          f"(changed tensors {changed_bytes}), owner received {client.last_bytes_received}")
    assert client.upload_bytes_total == full + client.last_upload_bytes
    assert client.last_upload_bytes < full / 2


def test_a_file_the_owner_lost_is_sent_again_in_full(owner, pki, candidates):
    from tests.federation.conftest import flower_client

    _, _, other, _, _, _ = candidates
    client = flower_client(owner.port, pki)
    client._owner_holds.update(other.digests.values())  # believes the owner holds files it never received
    checkpoint_id = client.upload(other.directory, other.digests)
    assert client.last_bytes_received == other.total_bytes  # MISSING_FILE_DATA, then every file
    assert client.evaluate([checkpoint_id], DECODING).results[0].checkpoint_id == checkpoint_id


def test_a_lora_candidate_sends_only_its_adapter(transport, tmp_path):
    """A LoRA run (trainer_node/feedback/adapters.py): the base once, then each candidate's
    adapter_model.safetensors alone (over Flower as arrays, like a shard)."""
    pytest.importorskip("peft")
    from protocol.adapter_rules import ADAPTER_WEIGHTS_FILE
    from trainer_node.feedback.candidates import candidate_writer
    from trainer_node.lora import LoraSettings, apply_lora

    torch.manual_seed(0)
    model, tokenizer = load_policy(make_model_dir(tmp_path), "cpu", torch.float32)
    model = apply_lora(model, LoraSettings(r=4, alpha=8.0, target_modules=["q_proj", "v_proj"]))
    writer = candidate_writer(model, tokenizer, tmp_path / "candidates")
    state = {name: tensor.detach().clone() for name, tensor in model.state_dict().items()}
    first = writer.write(state, "first")
    lora_b = next(name for name in state if ".lora_B." in name)
    second = writer.write({**state, lora_b: state[lora_b] + 0.5}, "second")
    assert {n for n, d in second.digests.items() if first.digests[n] != d} == {ADAPTER_WEIGHTS_FILE}
    ids = [transport.upload(first.directory, first.digests)]
    assert owner_received(transport) == first.total_bytes
    ids.append(transport.upload(second.directory, second.digests))
    assert owner_received(transport) == second.sizes[ADAPTER_WEIGHTS_FILE]  # the adapter, nothing else
    assert transport.last_upload_bytes <= second.sizes[ADAPTER_WEIGHTS_FILE] + OVERHEAD
    response = transport.evaluate(ids, DECODING)
    assert [r.checkpoint_id for r in response.results] == ids
