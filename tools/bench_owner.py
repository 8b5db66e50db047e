"""Throughput figures for the target-owner node (prints numbers; not a test).

    python tools/bench_owner.py [--size-mb 100] [--prompts 64] [--keep DIR]

1. Upload: a ~100 MB checkpoint (random safetensors weights) sent over mTLS on loopback to a
   `target-owner-node serve` subprocess (1 MiB chunks, sha256 + header validation, fsync,
   content-addressed store), next to a plain file copy (+ fsync) of the same bytes.
2. Evaluation: prompts/s of the real worker (tiny random policy, exact_match verifier) on
   the test split, after a warm-up call that starts the worker and loads the model.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from protocol.generated.target_feedback.v1 import target_feedback_pb2 as pb
from protocol.generated.target_feedback.v1 import target_feedback_pb2_grpc as pb_grpc
from protocol.validation import MAX_CHUNK_BYTES


def make_examples(n: int, prefix: str):
    from rlvr_core.tasks.example import Example

    return [
        Example(
            id=f"{prefix}{i}",
            prompt=f"{i % 9}+{i % 4}=",
            answer=str(i % 9 + i % 4),
            domain="add",
            verifier="exact_match",
        )
        for i in range(n)
    ]


def big_checkpoint(tiny: Path, out: Path, size_mb: int) -> Path:
    """The tiny policy (config, tokenizer, weights: upload validation reads its embedding) with
    ~size_mb of random float32 tensors added to its weights file. Only uploaded, never loaded."""
    from safetensors.numpy import load_file, save_file

    out.mkdir(parents=True)
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        if (tiny / name).exists():
            shutil.copyfile(tiny / name, out / name)
    rng = np.random.default_rng(0)
    per_tensor = 4 << 20  # 4 MiB tensors
    tensors = {
        f"filler.{i}.weight": rng.standard_normal(per_tensor // 4, dtype=np.float32)
        for i in range(max(1, (size_mb << 20) // per_tensor))
    }
    tensors.update(load_file(str(tiny / "model.safetensors")))
    save_file(tensors, str(out / "model.safetensors"))
    return out


def upload(stub, directory: Path) -> pb.UploadCheckpointResponse:
    def messages():
        files = []
        for path in sorted(directory.iterdir()):
            digest = hashlib.sha256()
            with path.open("rb") as handle:
                for block in iter(lambda: handle.read(1 << 20), b""):
                    digest.update(block)
            files.append(pb.FileEntry(name=path.name, size=path.stat().st_size, sha256=digest.hexdigest()))
        yield pb.UploadCheckpointRequest(manifest=pb.CheckpointManifest(files=files))
        for path in sorted(directory.iterdir()):
            with path.open("rb") as handle:
                offset = 0
                for block in iter(lambda: handle.read(MAX_CHUNK_BYTES), b""):
                    yield pb.UploadCheckpointRequest(
                        chunk=pb.FileChunk(name=path.name, offset=offset, data=block)
                    )
                    offset += len(block)

    return stub.UploadCheckpoint(messages(), timeout=600)


def plain_copy_mb_s(source: Path, target: Path) -> float:
    started = time.perf_counter()
    shutil.copyfile(source, target)
    with target.open("rb") as handle:
        os.fsync(handle.fileno())
    return source.stat().st_size / (1 << 20) / (time.perf_counter() - started)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--size-mb", type=int, default=100, help="checkpoint size for the upload figure")
    parser.add_argument(
        "--prompts", type=int, default=64, help="test-split prompts for the evaluation figure"
    )
    parser.add_argument("--samples", type=int, default=4, help="samples per prompt (k)")
    parser.add_argument("--max-new-tokens", type=int, default=16)
    parser.add_argument(
        "--keep", type=Path, default=None, help="work in DIR and keep it (default: a temp dir)"
    )
    args = parser.parse_args()

    import grpc

    from protocol.tls import channel_credentials, write_owner_pki
    from rlvr_core.models.tiny_policy import random_tiny_policy
    from rlvr_core.tasks.io import write_examples

    work = args.keep or Path(tempfile.mkdtemp(prefix="bench-owner-"))
    work.mkdir(parents=True, exist_ok=True)
    write_examples(work / "heldout.jsonl", make_examples(200, "h"))
    write_examples(work / "test.jsonl", make_examples(args.prompts, "t"))
    pki = {k: Path(v) for k, v in write_owner_pki(work / "pki", ["localhost"], client_name="bench").items()}
    config = {
        "data": {
            "heldout_path": "heldout.jsonl",
            "test_path": "test.jsonl",
            "test_split_enabled": True,  # the evaluation figure is measured on the exact test split
            "test_domains": ["add"],
            "prompt_template": "{prompt}",
        },
        "evaluation": {
            "max_new_tokens": args.max_new_tokens,
            "max_samples_per_prompt": args.samples,
            "batch_size": 64,
        },
        "tls": {
            "ca_cert": str(pki["ca_cert"]),
            "server_cert": str(pki["server_cert"]),
            "server_key": str(pki["server_key"]),
        },
        "server": {"listen_address": "localhost:0", "drain_delay_s": 0.0},
        "storage": {"dir": "storage", "max_checkpoint_bytes": (args.size_mb + 64) << 20},
    }
    lines = []
    for section, values in config.items():
        lines.append(f"[{section}]")
        lines += [f"{key} = {json.dumps(value)}" for key, value in values.items()]
    (work / "config.toml").write_text("\n".join(lines) + "\n")

    tiny = random_tiny_policy(
        work / "tiny", [e.prompt for e in make_examples(50, "v")] + ["0123456789+="], seed=0
    )
    big = big_checkpoint(tiny, work / "big", args.size_mb)
    weights = big / "model.safetensors"
    size_mb = sum(p.stat().st_size for p in big.iterdir()) / (1 << 20)

    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "target_owner_node.cli",
            "serve",
            "--config",
            str(work / "config.toml"),
            "--port",
            "0",
        ],
        stdout=subprocess.PIPE,
        stderr=(work / "serve.log").open("wb"),
        text=True,
        cwd=ROOT,
    )
    try:
        line = server.stdout.readline()
        if not line.startswith("listening on "):
            print(f"server did not start; see {work / 'serve.log'}", file=sys.stderr)
            return 1
        port = int(line.rsplit(":", 1)[1])
        credentials = channel_credentials(
            pki["ca_cert"].read_bytes(), pki["client_cert"].read_bytes(), pki["client_key"].read_bytes()
        )
        channel = grpc.secure_channel(f"localhost:{port}", credentials)
        stub = pb_grpc.TargetFeedbackServiceStub(channel)
        stub.GetInfo(pb.GetInfoRequest(), timeout=60)

        copy_rate = plain_copy_mb_s(weights, work / "copy.safetensors")
        started = time.perf_counter()
        response = upload(stub, big)
        upload_s = time.perf_counter() - started
        started = time.perf_counter()
        reused = upload(stub, big)  # manifest only would be enough; resending shows dedup cost
        print(f"checkpoint: {size_mb:.1f} MiB ({len(list(big.iterdir()))} files)")
        print(f"upload over mTLS loopback: {size_mb / upload_s:.1f} MiB/s ({upload_s:.2f} s)")
        print(f"plain file copy + fsync:   {copy_rate:.1f} MiB/s")
        print(
            f"re-upload of held content: {size_mb / (time.perf_counter() - started):.1f} MiB/s "
            f"(same id: {reused.checkpoint_id == response.checkpoint_id})"
        )

        tiny_id = upload(stub, tiny).checkpoint_id
        decoding = pb.DecodingSettings(
            max_new_tokens=args.max_new_tokens, samples_per_prompt=args.samples, temperature=1.0, seed=1
        )
        started = time.perf_counter()
        stub.Evaluate(
            pb.EvaluateRequest(checkpoint_ids=[tiny_id], decoding=decoding, split=pb.SPLIT_TEST), timeout=900
        )
        warm_s = time.perf_counter() - started
        started = time.perf_counter()
        stub.Evaluate(
            pb.EvaluateRequest(checkpoint_ids=[tiny_id], decoding=decoding, split=pb.SPLIT_TEST), timeout=900
        )
        eval_s = time.perf_counter() - started
        print(
            f"evaluation: {args.prompts} prompts x {args.samples} samples x <= {args.max_new_tokens} new tokens, "
            f"tiny random policy on {os.cpu_count()} CPU cores"
        )
        print(f"  first call (worker start + model load + eval): {warm_s:.2f} s")
        print(
            f"  warm call: {eval_s:.2f} s = {args.prompts / eval_s:.1f} prompts/s "
            f"({args.prompts * args.samples / eval_s:.1f} generations/s)"
        )
        channel.close()
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=60)
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
