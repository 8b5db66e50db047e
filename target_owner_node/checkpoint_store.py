"""Checkpoint intake: a streamed upload becomes a validated, content-addressed checkpoint.

Layout under the storage folder::

    blobs/<sha256>                 immutable file contents, shared between checkpoints
    checkpoints/<checkpoint_id>.json   {"files": [{"name", "size", "sha256"}, ...]}
    materialized/<checkpoint_id>/  hard links named as the model loader expects
    tmp/                           uploads in progress (removed on any failure)

An upload is a manifest, then chunks for the files the owner does not already hold. Every
check happens BEFORE anything is moved out of tmp/: any failure stores nothing. Untrusted
input is never executed: names come from an allowlist (safetensors + known JSON files),
headers and JSON are validated, and nothing is unpickled.

checkpoint_id = sha256 of the canonical manifest (see `checkpoint_id_for`), so identical
uploads get the same id and the id commits to every file's digest.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc

from protocol import errors
from protocol.adapter_rules import DEFAULT_MAX_ADAPTER_BYTES
from protocol.errors import ProtocolError, invalid
from protocol.generated.target_feedback.v1 import target_feedback_pb2 as pb
from protocol.validation import (
    MAX_CHUNK_BYTES,
    MAX_SAFETENSORS_HEADER_BYTES,
    CheckpointValidationError,
    checkpoint_id_for,
    validate_checkpoint_dir,
    validate_file_name,
)
from target_owner_node.durable import fsync_dir, write_atomically

SHA256_HEX = re.compile(r"^[0-9a-f]{64}$")
REQUIRED_FILES = ("config.json", "tokenizer.json")


@dataclass(frozen=True)
class ManifestEntry:
    name: str
    size: int
    sha256: str


@dataclass(frozen=True)
class UploadResult:
    checkpoint_id: str
    bytes_received: int
    reused_files: tuple[str, ...]




def structure_key(entries: list[ManifestEntry], folder: Path) -> str:
    """Everything of a checkpoint but its tensor values: the JSON files' contents and the
    safetensors headers (tensor names, dtypes, shapes, offsets, metadata) and sizes.

    Two checkpoints with one structure key load and generate through the same code paths at
    the same shapes; only numbers differ, and no number can make the engine raise (sampling is
    the project's own inverse-CDF selection, which takes NaN and inf without error). So one
    dry run per structure is enough: a lookahead candidate that changes only weights is not
    probed again. The upload checks (validate_checkpoint_dir) read nothing else either (names,
    JSON contents, headers and file sizes), so a structure that passed them once passes again.
    """
    digest = hashlib.sha256()
    for entry in sorted(entries, key=lambda e: e.name):
        digest.update(entry.name.encode("utf-8") + b"\0")
        if entry.name.endswith(".safetensors"):
            with (folder / entry.name).open("rb") as handle:
                head = handle.read(8)
                digest.update(head + handle.read(min(int.from_bytes(head, "little"), MAX_SAFETENSORS_HEADER_BYTES)))
            digest.update(b"\0" + str(entry.size).encode("ascii"))
        else:
            digest.update(entry.sha256.encode("ascii"))
        digest.update(b"\0")
    return digest.hexdigest()


class CheckpointStore:
    """Receives, validates and stores checkpoints; thread-safe."""

    def __init__(
        self,
        root: str | Path,
        max_checkpoint_bytes: int,
        quota_bytes: int,
        probe: Callable[[str, Path], None] | None = None,
    ) -> None:
        """`probe(checkpoint_id, folder)` dry-runs a validated new checkpoint before it is stored
        (the evaluation worker's `probe`); it raises ProtocolError to refuse it."""
        self.root = Path(root)
        self.probe = probe
        self._probed_structures: set[str] = set()  # structure keys whose dry run passed (see structure_key)
        self._validated_structures: set[str] = set()  # structure keys that passed validate_checkpoint_dir
        self.max_checkpoint_bytes = max_checkpoint_bytes
        self.max_adapter_bytes = min(DEFAULT_MAX_ADAPTER_BYTES, max_checkpoint_bytes)  # GetInfo delta_support
        self.quota_bytes = quota_bytes
        self.blobs = self.root / "blobs"
        self.checkpoints = self.root / "checkpoints"
        self.materialized = self.root / "materialized"
        self.tmp = self.root / "tmp"
        for folder in (self.blobs, self.checkpoints, self.materialized, self.tmp):
            folder.mkdir(parents=True, exist_ok=True)
        for leftover in self.tmp.iterdir():  # uploads interrupted by a crash
            shutil.rmtree(leftover, ignore_errors=True)
        self._lock = threading.Lock()
        self._stored_bytes = sum(p.stat().st_size for p in self.blobs.iterdir() if p.is_file())
        self._reserved_bytes = 0

    # -- queries ---------------------------------------------------------------------------
    def exists(self, checkpoint_id: str) -> bool:
        return (
            bool(SHA256_HEX.match(checkpoint_id)) and (self.checkpoints / f"{checkpoint_id}.json").is_file()
        )

    def manifest(self, checkpoint_id: str) -> list[ManifestEntry]:
        record = json.loads((self.checkpoints / f"{checkpoint_id}.json").read_text(encoding="utf-8"))
        return [ManifestEntry(f["name"], f["size"], f["sha256"]) for f in record["files"]]

    def context_length(self, checkpoint_id: str) -> int:
        """The checkpoint's public context length (config.json max_position_embeddings or n_positions)."""
        config_entry = next(e for e in self.manifest(checkpoint_id) if e.name == "config.json")
        config = json.loads((self.blobs / config_entry.sha256).read_text(encoding="utf-8"))
        value = config.get("max_position_embeddings", config.get("n_positions"))
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise invalid(
                errors.INVALID_CHECKPOINT,
                "config.json: max_position_embeddings (or n_positions) must be a positive integer",
            )
        return value

    def file_digests(self, checkpoint_id: str) -> dict[str, str]:
        """{file name: sha256} of a stored checkpoint (what its materialized files contain)."""
        return {entry.name: entry.sha256 for entry in self.manifest(checkpoint_id)}

    def holds_blob(self, sha256: str) -> bool:
        return (self.blobs / sha256).is_file()

    @property
    def stored_bytes(self) -> int:
        return self._stored_bytes

    def materialize(self, checkpoint_id: str) -> Path:
        """A folder with the checkpoint's files under their names (hard links to blobs)."""
        target = self.materialized / checkpoint_id
        if target.is_dir():
            return target
        staging = Path(tempfile.mkdtemp(dir=self.tmp, prefix=f"mat-{checkpoint_id[:12]}-"))
        try:
            for entry in self.manifest(checkpoint_id):
                try:
                    os.link(self.blobs / entry.sha256, staging / entry.name)
                except OSError:
                    shutil.copyfile(self.blobs / entry.sha256, staging / entry.name)
            try:
                os.rename(staging, target)
            except OSError:
                if not target.is_dir():  # not a lost race with another materializer
                    raise
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        return target

    # -- upload ----------------------------------------------------------------------------
    def receive(self, messages: Iterator[pb.UploadCheckpointRequest]) -> UploadResult:
        """Consume one UploadCheckpoint stream. Raises ProtocolError; stores nothing on failure."""
        first = next(messages, None)
        if first is None or first.WhichOneof("payload") != "manifest":
            raise invalid(errors.INVALID_REQUEST, "the first upload message must be the manifest")
        entries = self._parse_manifest(first.manifest)
        held = {entry.name for entry in entries if self.holds_blob(entry.sha256)}
        new_bytes = sum({e.sha256: e.size for e in entries if e.name not in held}.values())
        self._reserve(new_bytes)
        workdir = Path(tempfile.mkdtemp(dir=self.tmp, prefix="upload-"))
        try:
            received, digests = self._receive_chunks(messages, {e.name: e for e in entries}, workdir)
            self._verify_complete(entries, held, received, digests, workdir)
            checkpoint_id = checkpoint_id_for(entries)
            self._validate_contents(checkpoint_id, entries, received, workdir)
            self._commit(checkpoint_id, entries, received, workdir)
            reused = tuple(sorted(name for name in held if name not in received))
            return UploadResult(checkpoint_id, sum(received.values()), reused)
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
            self._release(new_bytes)

    def _parse_manifest(self, manifest: pb.CheckpointManifest) -> list[ManifestEntry]:
        if not manifest.files:
            raise invalid(errors.INVALID_REQUEST, "the manifest lists no files")
        entries: list[ManifestEntry] = []
        names: set[str] = set()
        for item in manifest.files:
            try:
                validate_file_name(item.name)
            except CheckpointValidationError as error:
                raise error.to_protocol_error() from None
            if item.name in names:
                raise invalid(errors.INVALID_REQUEST, f"the manifest lists {item.name!r} twice")
            if item.size < 0:
                raise invalid(errors.INVALID_REQUEST, f"{item.name}: size must be >= 0")
            if not SHA256_HEX.match(item.sha256):
                raise invalid(
                    errors.INVALID_REQUEST, f"{item.name}: sha256 must be 64 lowercase hex characters"
                )
            names.add(item.name)
            entries.append(ManifestEntry(item.name, item.size, item.sha256))
        missing = [name for name in REQUIRED_FILES if name not in names]
        if missing or not any(name.endswith(".safetensors") for name in names):
            raise invalid(
                errors.INVALID_CHECKPOINT,
                "a checkpoint needs config.json, tokenizer.json and safetensors weights; missing: "
                + ", ".join(missing or ["*.safetensors"]),
            )
        total = sum(entry.size for entry in entries)
        if total > self.max_checkpoint_bytes:
            raise invalid(
                errors.UPLOAD_TOO_LARGE,
                f"the checkpoint is {total} bytes; this node accepts at most {self.max_checkpoint_bytes}",
                size=str(total),
                limit=str(self.max_checkpoint_bytes),
            )
        return entries

    def _reserve(self, new_bytes: int) -> None:
        with self._lock:
            if self._stored_bytes + self._reserved_bytes + new_bytes > self.quota_bytes:
                raise ProtocolError(
                    grpc.StatusCode.RESOURCE_EXHAUSTED,
                    errors.STORAGE_QUOTA_EXCEEDED,
                    f"storing {new_bytes} new bytes would exceed this node's storage quota of {self.quota_bytes}",
                    {"stored": str(self._stored_bytes), "limit": str(self.quota_bytes)},
                )
            self._reserved_bytes += new_bytes

    def _release(self, new_bytes: int) -> None:
        with self._lock:
            self._reserved_bytes -= new_bytes

    def _receive_chunks(
        self,
        messages: Iterator[pb.UploadCheckpointRequest],
        manifest: dict[str, ManifestEntry],
        workdir: Path,
    ) -> tuple[dict[str, int], dict[str, str]]:
        """Write chunks to workdir/<name>; returns (bytes received, sha256 hex) per file."""
        received: dict[str, int] = {}
        hashes: dict[str, hashlib._Hash] = {}
        handles = {}
        try:
            for message in messages:
                if message.WhichOneof("payload") != "chunk":
                    raise invalid(
                        errors.INVALID_REQUEST, "only one manifest is allowed, as the first message"
                    )
                chunk = message.chunk
                entry = manifest.get(chunk.name)
                if entry is None:
                    raise invalid(errors.INVALID_REQUEST, "a chunk names a file that is not in the manifest")
                if len(chunk.data) > MAX_CHUNK_BYTES:
                    raise invalid(
                        errors.UPLOAD_TOO_LARGE,
                        f"{chunk.name}: chunk of {len(chunk.data)} bytes; chunks are at most {MAX_CHUNK_BYTES}",
                        limit=str(MAX_CHUNK_BYTES),
                    )
                done = received.get(chunk.name, 0)
                if chunk.offset != done:
                    raise invalid(
                        errors.INVALID_REQUEST,
                        f"{chunk.name}: chunk offset {chunk.offset}, expected {done} (chunks must be sent in order)",
                    )
                if done + len(chunk.data) > entry.size:
                    raise invalid(
                        errors.UPLOAD_TOO_LARGE,
                        f"{chunk.name}: more bytes than the {entry.size} the manifest declares",
                    )
                if chunk.name not in handles:
                    handles[chunk.name] = (workdir / chunk.name).open("wb")
                    hashes[chunk.name] = hashlib.sha256()
                handles[chunk.name].write(chunk.data)
                hashes[chunk.name].update(chunk.data)
                received[chunk.name] = done + len(chunk.data)
        finally:
            for handle in handles.values():
                handle.close()
        return received, {name: digest.hexdigest() for name, digest in hashes.items()}

    def _verify_complete(
        self,
        entries: list[ManifestEntry],
        held: set[str],
        received: dict[str, int],
        digests: dict[str, str],
        workdir: Path,
    ) -> None:
        for entry in entries:
            if entry.name in received:
                if received[entry.name] != entry.size:
                    raise invalid(
                        errors.MISSING_FILE_DATA,
                        f"{entry.name}: received {received[entry.name]} of {entry.size} bytes",
                    )
                if digests[entry.name] != entry.sha256:
                    raise invalid(
                        errors.CHECKSUM_MISMATCH,
                        f"{entry.name}: sha256 of the received bytes does not match the manifest",
                    )
            elif entry.name not in held:
                if entry.size == 0 and entry.sha256 == hashlib.sha256(b"").hexdigest():
                    (workdir / entry.name).write_bytes(b"")  # an empty file needs no chunk
                    received[entry.name] = 0
                else:
                    raise invalid(
                        errors.MISSING_FILE_DATA,
                        f"{entry.name}: no data was sent and this node does not hold a file with that sha256",
                    )

    def _validate_contents(
        self, checkpoint_id: str, entries: list[ManifestEntry], received: dict[str, int], workdir: Path
    ) -> None:
        """Validate the checkpoint as the loader will see it, reused blobs included (a blob
        validated under one name may come back under another), then dry-run it.

        Every check runs at upload, on public inputs only, so that nothing knowable before
        a charge can make a later evaluation fail (a failure whose occurrence depended on the
        sampled rows would be a noise-free release)."""
        for entry in entries:
            if entry.name not in received:
                os.link(self.blobs / entry.sha256, workdir / entry.name)
        structure = structure_key(entries, workdir)
        if structure not in self._validated_structures:
            try:
                validate_checkpoint_dir(
                    workdir, max_total_bytes=self.max_checkpoint_bytes, max_adapter_bytes=self.max_adapter_bytes
                )
            except CheckpointValidationError as error:
                raise error.to_protocol_error() from None
            self._validated_structures.add(structure)
        if self.probe is not None and not self.exists(checkpoint_id) and structure not in self._probed_structures:
            self.probe(checkpoint_id, workdir)
            self._probed_structures.add(structure)
        for entry in entries:
            if entry.name not in received:
                (workdir / entry.name).unlink()

    def _commit(
        self, checkpoint_id: str, entries: list[ManifestEntry], received: dict[str, int], workdir: Path
    ) -> None:
        """Move validated files into blobs/ and record the checkpoint (all checks already passed)."""
        added = 0
        for entry in entries:
            if entry.name not in received:
                continue
            blob = self.blobs / entry.sha256
            source = workdir / entry.name
            with source.open("rb") as handle:
                os.fsync(handle.fileno())
            if blob.exists():
                continue  # same content already stored (concurrent upload or resent file)
            os.replace(source, blob)
            added += entry.size
        fsync_dir(self.blobs)
        record = {
            "files": [
                {"name": e.name, "size": e.size, "sha256": e.sha256}
                for e in sorted(entries, key=lambda e: e.name)
            ]
        }
        write_atomically(
            self.checkpoints / f"{checkpoint_id}.json", json.dumps(record, indent=1).encode("utf-8")
        )
        with self._lock:
            self._stored_bytes += added
