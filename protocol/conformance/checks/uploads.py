"""Bad uploads are refused, and a refused upload stores nothing.

Every case starts from the suite's valid tiny checkpoint, made unique with a nonce, and breaks
exactly one thing. After the refusal, the id the upload WOULD have had (content address of the
manifest that was sent) must be unknown to Evaluate: nothing was stored.
"""

from __future__ import annotations

import pickle
import struct
import uuid
from collections.abc import Callable
from dataclasses import dataclass

import grpc
import numpy as np

from protocol import errors
from protocol.conformance.checkpoints import (
    CheckpointFile,
    checkpoint_id_for,
    chunk_messages,
    edit_json,
    safetensors_bytes,
    sha256_hex,
    upload_messages,
    with_added_token,
    with_nonce,
)
from protocol.conformance.context import SuiteContext
from protocol.conformance.registry import check
from protocol.generated.target_feedback.v1 import target_feedback_pb2 as pb
from protocol.validation import MAX_CHUNK_BYTES

INVALID = grpc.StatusCode.INVALID_ARGUMENT


@dataclass(frozen=True)
class BadUpload:
    """A stream to send, and the manifest whose content address must stay unknown."""

    messages: list[pb.UploadCheckpointRequest]
    manifest: list[pb.FileEntry]


def _replace(files: list[CheckpointFile], name: str, data: bytes) -> list[CheckpointFile]:
    return [CheckpointFile(f.name, data) if f.name == name else f for f in files]


def _plain(files: list[CheckpointFile]) -> BadUpload:
    return BadUpload(upload_messages(files), [f.entry for f in files])


def _weights(files: list[CheckpointFile]) -> bytes:
    return next(f.data for f in files if f.name == "model.safetensors")


def extra_file(name: str, data: bytes) -> Callable[[list[CheckpointFile]], BadUpload]:
    return lambda files: _plain(files + [CheckpointFile(name, data)])


def truncated_weights(files: list[CheckpointFile]) -> BadUpload:
    weights = _weights(files)
    return _plain(_replace(files, "model.safetensors", weights[: len(weights) // 2]))


def oversized_header(files: list[CheckpointFile]) -> BadUpload:
    # The first 8 bytes of a safetensors file give the JSON header length: claim 1 TiB.
    data = struct.pack("<Q", 1 << 40) + b'{"__metadata__":{}}' + b"\0" * 64
    return _plain(_replace(files, "model.safetensors", data))


def wrong_sha256(files: list[CheckpointFile]) -> BadUpload:
    manifest = [
        pb.FileEntry(name=f.name, size=len(f.data), sha256=sha256_hex(b"not these bytes" + f.data))
        if f.name == "model.safetensors" else f.entry
        for f in files
    ]
    return BadUpload(upload_messages(files, manifest=manifest), manifest)


def declared_too_large(limit: int) -> Callable[[list[CheckpointFile]], BadUpload]:
    def build(files: list[CheckpointFile]) -> BadUpload:
        manifest = [
            pb.FileEntry(name=f.name, size=limit + 1, sha256=f.entry.sha256) if f.name == "model.safetensors" else f.entry
            for f in files
        ]
        weights = _weights(files)
        return BadUpload([upload_messages([], manifest=manifest)[0]] + chunk_messages("model.safetensors", weights), manifest)

    return build


def padded_safetensors(weights: bytes, size: int) -> bytes:
    """The same tensors plus a uint8 padding tensor, `size` bytes in total (still valid)."""
    from safetensors.numpy import load

    tensors = load(weights)
    pad = max(size - len(weights) - 64, 1)
    for _ in range(8):
        data = safetensors_bytes({**tensors, "conformance.padding": np.zeros(pad, dtype=np.uint8)})
        if len(data) == size:
            return data
        pad += size - len(data)
    raise AssertionError(f"could not build a {size}-byte safetensors file")


def oversized_chunk(files: list[CheckpointFile]) -> BadUpload:
    # A VALID safetensors file of exactly 1 MiB + 1 byte, sent as one chunk: only the chunk size
    # is wrong, and the message stays small enough for the server's own check (not gRPC's
    # message-size limit) to answer.
    big = padded_safetensors(_weights(files), MAX_CHUNK_BYTES + 1)
    files = _replace(files, "model.safetensors", big)
    messages = upload_messages([f for f in files if f.name != "model.safetensors"], manifest=[f.entry for f in files])
    messages.append(pb.UploadCheckpointRequest(chunk=pb.FileChunk(name="model.safetensors", offset=0, data=big)))
    return BadUpload(messages, [f.entry for f in files])


def chunk_not_in_manifest(files: list[CheckpointFile]) -> BadUpload:
    stray = b'{"bos_token": "x"}'
    return BadUpload(upload_messages(files) + chunk_messages("special_tokens_map.json", stray), [f.entry for f in files])


def chunks_before_manifest(files: list[CheckpointFile]) -> BadUpload:
    plain = upload_messages(files)
    return BadUpload(plain[1:] + plain[:1], [f.entry for f in files])


def missing_file_data(files: list[CheckpointFile]) -> BadUpload:
    # generation_config.json carries the fresh nonce: the owner cannot already hold it.
    return BadUpload(upload_messages(files, send={f.name for f in files if f.name != "generation_config.json"}),
                     [f.entry for f in files])


def config_with(**changes: object) -> Callable[[list[CheckpointFile]], BadUpload]:
    import json

    def build(files: list[CheckpointFile]) -> BadUpload:
        config = json.loads(next(f.data for f in files if f.name == "config.json"))
        config.update(changes)
        return _plain(_replace(files, "config.json", json.dumps(config).encode()))

    return build


def refuse(ctx: SuiteContext, build: Callable[[list[CheckpointFile]], BadUpload],
           codes: tuple[grpc.StatusCode, ...] = (INVALID,), reasons: tuple[str, ...] | None = None) -> str:
    """Send the bad upload, expect a refusal, then prove its would-be id is unknown."""
    bad = build(with_nonce(ctx.checkpoint_files(), uuid.uuid4().hex))
    failure = ctx.expect_error(lambda: ctx.upload(bad.messages), codes, reasons, "the upload")
    would_be = checkpoint_id_for(bad.manifest)
    with ctx.budget_unchanged("evaluating a refused upload's id"):
        ctx.expect_error(lambda: ctx.evaluate(ctx.evaluate_request([would_be])), INVALID, errors.UNKNOWN_CHECKPOINT,
                         "Evaluate of the refused upload's would-be id (was it stored?)")
    return f"refused ({failure.code.name} {failure.reason}); nothing stored"


_RATIONALE_TAIL = " After the refusal, the checkpoint id the upload would have had must be UNKNOWN_CHECKPOINT."


def _register(check_id: str, title: str, why: str, order: int, body: Callable[[SuiteContext], str]) -> None:
    check(check_id, title=title, rationale=why + _RATIONALE_TAIL, order=order)(body)


_PICKLE = pickle.dumps({"weights": [0.0, 1.0]}, protocol=2)

_register("upload.refuse.pickle_bin", "A pickle weights file (pytorch_model.bin) is refused",
          "Pickle executes code when loaded; only safetensors weights may ever be accepted, even beside valid ones.",
          40, lambda ctx: refuse(ctx, extra_file("pytorch_model.bin", _PICKLE)))
_register("upload.refuse.torch_pt", "A .pt file is refused",
          "torch.save files are pickles too (torch.load has had remote-code CVEs even with weights_only).",
          41, lambda ctx: refuse(ctx, extra_file("model.pt", _PICKLE)))
_register("upload.refuse.truncated_safetensors", "A truncated safetensors file is refused",
          "The owner must validate the safetensors structure at upload, not fail later inside the evaluator.",
          42, lambda ctx: refuse(ctx, truncated_weights))
_register("upload.refuse.oversized_header", "A safetensors header length beyond the file is refused",
          "A huge declared header length is the classic way to make a parser allocate or read out of bounds.",
          43, lambda ctx: refuse(ctx, oversized_header))
_register("upload.refuse.wrong_sha256", "Bytes that do not match the declared sha256 are refused (CHECKSUM_MISMATCH)",
          "Content addressing is only sound if every file is verified against its declared digest.",
          44, lambda ctx: refuse(ctx, wrong_sha256, reasons=(errors.CHECKSUM_MISMATCH,)))
_register("upload.refuse.declared_too_large", "A manifest above upload_limits.max_checkpoint_bytes is refused",
          "The declared size is checked against the public limit before any byte is accepted (UPLOAD_TOO_LARGE).",
          45, lambda ctx: refuse(ctx, declared_too_large(ctx.info().upload_limits.max_checkpoint_bytes),
                                 reasons=(errors.UPLOAD_TOO_LARGE,)))
_register("upload.refuse.path_traversal", "File names with paths ('../x.safetensors', '/abs', 'a/b') are refused",
          "A file name is a bare allowlisted name; anything with a path component could write outside storage.",
          46, lambda ctx: " / ".join(refuse(ctx, extra_file(name, b"x")) for name in
                                     ("../x.safetensors", "/abs", "sub/model.safetensors"))[:200])
_register("upload.refuse.oversized_chunk", "A chunk above 1 MiB is refused",
          "Chunks are at most 1 MiB (bounded memory per message); the file here is a valid safetensors so only the "
          "chunk size is wrong.",
          47, lambda ctx: refuse(ctx, oversized_chunk, codes=(INVALID, grpc.StatusCode.RESOURCE_EXHAUSTED)))
_register("upload.refuse.chunk_not_in_manifest", "A chunk for a file missing from the manifest is refused",
          "Only files declared (and digest-committed) in the manifest may be written.",
          48, lambda ctx: refuse(ctx, chunk_not_in_manifest))
_register("upload.refuse.no_manifest_first", "A stream that does not start with the manifest is refused",
          "The manifest comes first so every byte can be checked against a declared name, size and digest.",
          49, lambda ctx: refuse(ctx, chunks_before_manifest))
_register("upload.refuse.missing_file_data", "A manifest naming a file the owner lacks, without data, is refused",
          "A checkpoint is stored only when every file is present (MISSING_FILE_DATA otherwise).",
          50, lambda ctx: refuse(ctx, missing_file_data, reasons=(errors.MISSING_FILE_DATA,)))
_register("upload.refuse.disallowed_architecture", "A config naming a non-allowlisted architecture is refused",
          "Only causal-LM classes shipped with transformers may be loaded; anything else could pull in custom code.",
          51, lambda ctx: refuse(ctx, config_with(architectures=["EvilForCausalLM"], model_type="evil")))
_register("upload.refuse.remote_code", "A config asking for remote code (auto_map) is refused",
          "auto_map is how a config asks transformers to import code shipped with the checkpoint; never honoured.",
          52, lambda ctx: refuse(ctx, config_with(auto_map={"AutoModelForCausalLM": "modeling_evil.EvilForCausalLM"})))


# -- tokenizer and config contents that could make an evaluation fail on chosen rows (issue 11) -------
_REFUSED = (errors.INVALID_CHECKPOINT, errors.DISALLOWED_FILE)
_MARKER = "zqjmarker"


def out_of_range_token(files: list[CheckpointFile]) -> BadUpload:
    return _plain(with_added_token(files, _MARKER)[0])


def tokenizer_edit(edit: Callable[[dict], None], name: str = "tokenizer.json") -> Callable[[list[CheckpointFile]], BadUpload]:
    return lambda files: _plain(edit_json(files, name, edit))


def _regex_replace_normalizer(tokenizer: dict) -> None:
    # Blanks exactly the prompts that contain a guessed string (membership by output or by time).
    tokenizer["normalizer"] = {"type": "Replace", "pattern": {"Regex": f"^.*{_MARKER}.*$"}, "content": ""}


def _unlisted_split_regex(tokenizer: dict) -> None:
    tokenizer["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": f"(a+)+{_MARKER}"}, "behavior": "Isolated", "invert": False},
        tokenizer["pre_tokenizer"]]}


def _bpe_dropout(tokenizer: dict) -> None:
    tokenizer["model"]["dropout"] = 0.5   # randomness outside the per-row seed rule


def _chat_template(config: dict) -> None:
    config["chat_template"] = "{% for m in messages %}{{ m['content'] }}{% endfor %}"


TOKENIZER_CASES: dict[str, Callable[[list[CheckpointFile]], BadUpload]] = {
    "Regex Replace normalizer": tokenizer_edit(_regex_replace_normalizer),
    "Split pre-tokenizer with an unlisted regex": tokenizer_edit(_unlisted_split_regex),
    "BPE dropout": tokenizer_edit(_bpe_dropout),
    "chat_template in tokenizer_config.json": tokenizer_edit(_chat_template, "tokenizer_config.json"),
}
CONFIG_CASES: dict[str, Callable[[list[CheckpointFile]], BadUpload]] = {
    "quantization_config": config_with(quantization_config={"quant_method": "bitsandbytes", "load_in_4bit": True}),
    "nested auto_map": config_with(rope_parameters={"rope_theta": 10000.0, "rope_type": "default",
                                                    "auto_map": {"AutoModelForCausalLM": "evil.EvilForCausalLM"}}),
    "unknown config key": config_with(conformance_unknown_key=1),
    "model_type not matching the architecture": config_with(model_type="llama"),
}


def refuse_each(ctx: SuiteContext, cases: dict[str, Callable[[list[CheckpointFile]], BadUpload]]) -> str:
    """Every case refused (INVALID_ARGUMENT, INVALID_CHECKPOINT or DISALLOWED_FILE), nothing stored."""
    from protocol.conformance.registry import CheckFailed

    for what, build in cases.items():
        try:
            refuse(ctx, build, reasons=_REFUSED)
        except CheckFailed as failed:
            raise CheckFailed(f"{what}: {failed}") from None
    return f"{len(cases)} refused ({', '.join(cases)}); nothing stored"


_register("upload.refuse.tokenizer_out_of_range",
          "A tokenizer with a token id >= the embedding's rows is refused",
          "An added token whose id the embedding cannot hold makes evaluation fail exactly on prompts containing "
          "its text: the error status of Evaluate would reveal whether the secret subsample holds such a row. Every "
          "id the tokenizer can produce must be checked against the embedding's row count in the safetensors header "
          "(not only config.json's vocab_size) at upload: INVALID_ARGUMENT, INVALID_CHECKPOINT or DISALLOWED_FILE.",
          53, lambda ctx: refuse(ctx, out_of_range_token, reasons=_REFUSED))
_register("upload.refuse.tokenizer_pipeline",
          "Tokenizer components that act on chosen strings, or add randomness, are refused",
          "A Regex Replace normalizer or an unlisted Split regex can blank or slow exactly the prompts containing a "
          "guessed string; BPE dropout is randomness outside the per-row seed; a chat_template is trainer-supplied "
          "Jinja the owner never runs. Each is refused at upload (INVALID_CHECKPOINT or DISALLOWED_FILE).",
          54, lambda ctx: refuse_each(ctx, TOKENIZER_CASES))
_register("upload.refuse.config_keys",
          "Config keys the loader would act on but nobody vetted are refused",
          "quantization_config pulls in quantization kernels, a nested auto_map asks for remote code, an unknown "
          "key may select an unvetted code path, and a model_type that does not match the architecture loads "
          "another class: each is refused at upload, so no checkpoint passes upload and then fails to load after "
          "the charge.",
          55, lambda ctx: refuse_each(ctx, CONFIG_CASES))
