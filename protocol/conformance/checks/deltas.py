"""Candidates as deltas (GetInfo delta_support): what a server advertises, it does, and no more.

- tensor shards: a checkpoint split one safetensors file per tensor is accepted, and a second
  one that changes one tensor is stored from that one shard (the rest reused), so a trainer's
  candidate costs the tensors it changed;
- LoRA adapters: an adapter beside a held base travels alone and is accepted; bad adapters
  are refused and store nothing; a server that does not advertise adapters refuses them all (an
  adapter silently ignored would score the base model under the candidate's name).

The checks use the suite's own tiny Qwen2 (not --checkpoint-dir, whose layout is the user's).
"""

from __future__ import annotations

import uuid

import grpc
import numpy as np

from protocol import errors
from protocol.conformance.checkpoints import (
    CheckpointFile,
    checkpoint_id_for,
    lora_adapter_files,
    tensor_shard_files,
    tiny_checkpoint_files,
    upload_messages,
    with_nonce,
)
from protocol.conformance.checks.uploads import BadUpload, refuse
from protocol.conformance.context import SuiteContext
from protocol.conformance.registry import CheckFailed, CheckSkipped, check, expect

Q_PROJ = "model.layers.0.self_attn.q_proj.weight"
ADAPTER = ("adapter_config.json", "adapter_model.safetensors")


def _base(nonce: str) -> list[CheckpointFile]:
    return with_nonce(tiny_checkpoint_files(7), nonce)


def _send_only(ctx: SuiteContext, files: list[CheckpointFile], names: set[str]):
    return ctx.upload(upload_messages(files, send=names))


@check("upload.delta.tensor_shards", order=56,
       title="A checkpoint of per-tensor shards is accepted, and a candidate changing one tensor costs one shard",
       rationale="Advertised delta_support.tensor_shards: a trainer sends candidates one safetensors file per "
       "tensor so that only changed tensors travel. The server must store such a checkpoint, and store a second one "
       "that changes one tensor from that tensor's shard alone (every other file reused by content).")
def tensor_shards(ctx: SuiteContext) -> str:
    if not ctx.info().delta_support.tensor_shards:
        raise CheckSkipped("the server does not advertise delta_support.tensor_shards")
    first = tensor_shard_files(_base(uuid.uuid4().hex))
    first_id = ctx.upload(upload_messages(first)).checkpoint_id
    expect(first_id == checkpoint_id_for([f.entry for f in first]), "the per-tensor checkpoint got another id")
    from safetensors.numpy import load

    weights = dict(load(next(f.data for f in tiny_checkpoint_files(7) if f.name == "model.safetensors")))
    second = tensor_shard_files(_base(_base_nonce(first)), {Q_PROJ: weights[Q_PROJ] + np.float32(0.5)})
    before = {f.name: f.data for f in first}
    changed = {f.name for f in second if before.get(f.name) != f.data}
    held = {f.name for f in second} - changed
    response = _send_only(ctx, second, changed)
    expect(set(response.reused_files) >= held, f"only {len(response.reused_files)} files reused; "
           f"{len(held)} were held")
    sent = sum(len(f.data) for f in second if f.name in changed)
    expect(response.bytes_received == sent, f"bytes_received {response.bytes_received}, {sent} were sent")
    return f"{len(first)} files; a one-tensor candidate sent {len(changed)} file(s), {sent} bytes"


def _base_nonce(files: list[CheckpointFile]) -> str:
    import json

    config = json.loads(next(f.data for f in files if f.name == "generation_config.json"))
    return config["conformance_nonce"]


@check("upload.delta.lora_adapter", order=57,
       title="A LoRA adapter beside a held base travels alone and is accepted",
       rationale="Advertised delta_support.lora_adapters: a LoRA candidate is the base checkpoint's files (held by "
       "the server) plus adapter_config.json and adapter_model.safetensors; only the adapter is sent.")
def lora_adapter(ctx: SuiteContext) -> str:
    support = ctx.info().delta_support
    if not support.lora_adapters:
        raise CheckSkipped("the server does not advertise delta_support.lora_adapters")
    base = _base(uuid.uuid4().hex)
    ctx.upload(upload_messages(base))
    with_adapter = lora_adapter_files(base, rank=min(4, support.max_lora_rank))
    response = _send_only(ctx, with_adapter, set(ADAPTER))
    expect(response.checkpoint_id == checkpoint_id_for([f.entry for f in with_adapter]), "unexpected id")
    sent = sum(len(f.data) for f in with_adapter if f.name in ADAPTER)
    expect(response.bytes_received == sent, f"bytes_received {response.bytes_received}, {sent} were sent")
    return f"adapter of {sent} bytes accepted beside a held base of {sum(len(f.data) for f in base)} bytes"


Q = "base_model.model.model.layers.0.self_attn.q_proj"
BAD_ADAPTERS = {
    "lora_A of the wrong shape": {"tensors_changes": {f"{Q}.lora_A.weight": np.zeros((4, 7), np.float32)}},
    "lora_B missing": {"tensors_changes": {f"{Q}.lora_B.weight": None}},
    "an adapter on the input embedding": {"tensors_changes": {
        "base_model.model.model.embed_tokens.lora_A.weight": np.zeros((4, 32), np.float32),
        "base_model.model.model.embed_tokens.lora_B.weight": np.zeros((300, 4), np.float32)}},
    "DoRA": {"config_changes": {"use_dora": True}},
    "an unknown adapter_config key": {"config_changes": {"modules_to_save": ["lm_head"]}},
}


def _refused(ctx: SuiteContext, changes: dict, codes=(grpc.StatusCode.INVALID_ARGUMENT,),
             reasons=(errors.INVALID_CHECKPOINT, errors.DISALLOWED_FILE)) -> str:
    """uploads.refuse with the suite's own tiny Qwen2 (adapters need its linear layers)."""
    def build(_user_files: list[CheckpointFile]) -> BadUpload:
        files = lora_adapter_files(_base(uuid.uuid4().hex), **changes)
        return BadUpload(upload_messages(files), [f.entry for f in files])

    return refuse(ctx, build, codes=codes, reasons=reasons)


def refuse_adapters(ctx: SuiteContext) -> str:
    if not ctx.info().delta_support.lora_adapters:
        # Stored but ignored, an adapter would make Evaluate score the base model under the
        # candidate's id: a wrong release the trainer cannot detect.
        return "adapters not advertised; a valid one is " + _refused(ctx, {})
    for what, changes in BAD_ADAPTERS.items():
        try:
            _refused(ctx, changes)
        except CheckFailed as failed:
            raise CheckFailed(f"{what}: {failed}") from None
    return f"{len(BAD_ADAPTERS)} refused ({', '.join(BAD_ADAPTERS)}); nothing stored"


check("upload.refuse.bad_adapter", order=58,
      title="A LoRA adapter is refused unless adapters are advertised and it fits its base; nothing is stored",
      rationale="An adapter is validated against the base weights at upload, as strictly as a checkpoint: names "
      "of linear layers only, lora_A (r, in) and lora_B (out, r), both present, no DoRA or extra keys; anything "
      "else would fail (or silently change meaning) at evaluation, after the charge. A server that does not "
      "advertise delta_support.lora_adapters must refuse adapter files altogether: stored but ignored, an adapter "
      "would make Evaluate score the base model under the candidate's id.")(refuse_adapters)
