"""Bytes per feedback query over Flower against the direct gRPC path (prints figures; not a test).

    python tools/bench_flower_bytes.py [--candidates 2] [--model DIR] [--lora] [--json F]

One `target-owner-node serve` (its own folder, PKI and budget, started as a deployment's owner is:
trainer_node/federation/local_deployment.py) is reached two ways, each by a fresh client that knows
nothing the owner holds:

- direct: TargetFeedbackClient (mTLS gRPC); counted: every request and response message as
  serialized (the upload's manifest and 1 MiB chunks, GetInfo, Evaluate);
- Flower: FlowerOwnerClient over an in-process grid into the shim ClientApp (flower_shim/), which
  forwards to the same owner over loopback mTLS; counted: every Flower Message and reply as
  serialized (flwr.common.serde.message_to_proto: what the SuperLink stores and relays).

TLS, HTTP/2 and HTTP framing are not counted on either side. The checkpoints are the trainer's own
candidate writer's (trainer_node/feedback/candidates.py: one safetensors shard per tensor, content
addressed; with --lora the base once and an adapter per candidate): a base upload (nothing held),
candidates that change 1, T/4 and all T tensors, and a query as L2RR sends it: the live model and
--candidates lookahead candidates (dense: every tensor changes), then one release of them all.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


class Meter:
    """Bytes of serialized messages, by direction."""

    def __init__(self) -> None:
        self.sent = 0
        self.received = 0

    def reset(self) -> tuple[int, int]:
        counted, self.sent, self.received = (self.sent, self.received), 0, 0
        return counted


def size(message: Any) -> int:
    return len(message) if isinstance(message, bytes) else message.ByteSize()


def counting_interceptors(meter: Meter) -> list[Any]:
    import grpc

    class Counting(grpc.UnaryUnaryClientInterceptor, grpc.StreamUnaryClientInterceptor):
        def intercept_unary_unary(self, continuation, details, request):
            meter.sent += size(request)
            response = continuation(details, request)
            meter.received += size(response.result())
            return response

        def intercept_stream_unary(self, continuation, details, request_iterator):
            def counted():
                for request in request_iterator:
                    meter.sent += size(request)
                    yield request

            response = continuation(details, counted())
            meter.received += size(response.result())
            return response

    return [Counting()]


def direct_client(settings: Any, meter: Meter) -> Any:
    import grpc

    from trainer_node.feedback.client import TargetFeedbackClient

    class CountingClient(TargetFeedbackClient):
        def _open_channel(self, s):  # the client's own channel, every call counted
            return grpc.intercept_channel(TargetFeedbackClient._open_channel(s), *counting_interceptors(meter))

    return CountingClient(settings)


def flower_client(public_settings: Any, meter: Meter) -> Any:
    from flwr.common.serde import message_to_proto

    from flower_shim.app import make_client_app
    from trainer_node.federation.client import FlowerOwnerClient
    from trainer_node.federation.loopback_grid import LoopbackGrid

    class CountingGrid(LoopbackGrid):
        def send_and_receive(self, messages, *, timeout=None):
            messages = list(messages)
            replies = list(super().send_and_receive(messages, timeout=timeout))
            meter.sent += sum(message_to_proto(m).ByteSize() for m in messages)
            meter.received += sum(message_to_proto(r).ByteSize() for r in replies)
            return replies

    grid = CountingGrid(make_client_app(lambda context: ("owner", public_settings)), {7: {}})
    return FlowerOwnerClient(grid, 7, name="owner", timeout_s=300)


def checkpoints(model_dir: Path, workdir: Path, lora: bool, candidates: int) -> tuple[list[tuple[str, Any]], list[Any]]:
    """(rows of single uploads in order, the query's checkpoints), written by the trainer's own writer."""
    import torch

    from rlvr_core.models.loading import load_policy
    from trainer_node.feedback.candidates import candidate_writer

    torch.manual_seed(0)
    model, tokenizer = load_policy(model_dir, "cpu", torch.float32)
    if lora:
        from trainer_node.lora import LoraSettings, apply_lora

        model = apply_lora(model, LoraSettings(r=8, alpha=16.0, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"]))
    writer = candidate_writer(model, tokenizer, workdir)
    state = {name: tensor.detach().clone() for name, tensor in model.state_dict().items()}
    trained = [name for name in state if ".lora_" in name] if lora else list(getattr(writer, "tensor_names", state))
    total = len(trained)

    def changed(names: list[str], by: float, label: str) -> Any:
        return writer.write({**state, **{n: state[n] + by for n in names}}, label)

    smallest = min(trained, key=lambda name: state[name].numel())
    rows = [("base (nothing held)", writer.write(state, "base")),
            ("the smallest tensor changed", changed([smallest], 1.0, "one")),
            (f"{max(1, total // 4)} of {total} tensors changed", changed(trained[: max(1, total // 4)], 2.0, "quarter")),
            (f"all {total} tensors changed", changed(trained, 3.0, "all"))]
    query = [changed(trained, 4.0 + i, f"query{i}") for i in range(candidates + 1)]  # the live model + lookaheads
    return rows, query


def owner_received(client: Any) -> int:
    """The file bytes the owner says it received for the latest upload (the same figure on both paths)."""
    flower = getattr(client, "last_bytes_received", None)
    return flower if flower is not None else client.last_upload_bytes


def measure(client: Any, meter: Meter, rows: list[tuple[str, Any]], query: list[Any]) -> dict[str, Any]:
    from protocol.generated.target_feedback.v1 import target_feedback_pb2 as pb

    client.info()
    meter.reset()
    out: dict[str, Any] = {}
    for label, checkpoint in rows:
        client.upload(checkpoint.directory, checkpoint.digests)
        out[label] = (*meter.reset(), owner_received(client))
    ids, files = [], 0
    for checkpoint in query:
        ids.append(client.upload(checkpoint.directory, checkpoint.digests))
        files += owner_received(client)
    client.evaluate(ids, pb.DecodingSettings(max_new_tokens=4, samples_per_prompt=1, seed=1))
    out["query"] = (*meter.reset(), files)
    client.close()
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--candidates", type=int, default=2, help="lookahead candidates per query (default 2)")
    parser.add_argument("--model", type=Path, help="a model folder (default: a random tiny Qwen2)")
    parser.add_argument("--lora", action="store_true", help="train a LoRA adapter: candidates are adapters")
    parser.add_argument("--testbed", default="small", help="the owner's held-out data (default small)")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args(argv)
    if args.candidates < 1:
        parser.error(f"--candidates: at least 1, got {args.candidates}")

    from protocol.public_client import PublicClientSettings
    from trainer_node.federation.local_deployment import LocalDeployment
    from trainer_node.feedback.client import ClientSettings

    with tempfile.TemporaryDirectory(prefix="bench-flower-bytes-") as scratch:
        root = Path(scratch)
        if args.model is None:
            from lab.toy_grpo import VOCAB_TEXTS
            from rlvr_core.models.tiny_policy import random_tiny_policy

            args.model = random_tiny_policy(root / "model", VOCAB_TEXTS, seed=0)
        owner = LocalDeployment(root)
        try:
            site = owner.start_owner_node("owner", args.testbed, ("--no-dp",))
            where = {"target": site.address, "ca_cert": site.ca, "client_cert": site.cert, "client_key": site.key,
                     "server_name": "localhost"}
            figures = {}
            for transport in ("direct", "flower"):
                meter = Meter()
                rows, query = checkpoints(args.model, root / f"candidates-{transport}", args.lora, args.candidates)
                client = (direct_client(ClientSettings(**where, max_attempts=1), meter) if transport == "direct"
                          else flower_client(PublicClientSettings(**where), meter))
                figures[transport] = measure(client, meter, rows, query)
        finally:
            owner.stop()
    kind = "LoRA adapter" if args.lora else "full-parameter"
    print(f"bytes per upload and per query, {kind} candidates of {args.model} (new file bytes: what the owner "
          "stored; then sent / received, serialized messages; TLS and HTTP framing not counted)")
    print(f"{'':40s} {'new file bytes':>14s} {'direct gRPC':>22s} {'Flower':>22s} {'Flower/direct':>14s}")
    for label in figures["direct"]:
        direct, flower = figures["direct"][label], figures["flower"][label]
        name = f"query: {args.candidates + 1} checkpoints + 1 release" if label == "query" else f"upload: {label}"
        files = f"{direct[2]:,d}" if direct[2] == flower[2] else f"{direct[2]:,d} vs {flower[2]:,d}"
        print(f"{name:40s} {files:>14s} {direct[0]:>12,d} / {direct[1]:>7,d} {flower[0]:>12,d} / {flower[1]:>7,d} "
              f"{flower[0] / direct[0]:>14.4f}")
    if args.json:
        args.json.write_text(json.dumps({"kind": kind, "candidates": args.candidates, **figures}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
