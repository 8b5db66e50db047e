"""Prometheus metrics of the owner's node: operational counts and the privacy spend only.

Why a module of its own with its own CollectorRegistry: the node must control exactly what
is exposed (the process-wide default registry would also export whatever any imported
library registers), and tests can create as many nodes as they like.

No metric carries data content. The only labels are `rpc` (one of the service's method
names) and `code` (a gRPC status code name); any other value is replaced by "other", so
not even a bug can put a prompt, answer or exception text into a label. Values are counts,
durations, byte totals and the epsilon spend, which the trainer is told anyway.

No metric times an Evaluate or a scoring run: how long an evaluation takes is a side
channel on the secret subsample (docs/PRIVACY.md), so durations are kept for the other
RPCs only. The endpoint listens on loopback unless the config explicitly allows more.

Served (optionally) with `prometheus_client.start_http_server` on `[metrics] host:port`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import grpc
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

RPC_NAMES = frozenset({"GetInfo", "UploadCheckpoint", "Evaluate", "GetBudget"})
UNTIMED_RPCS = frozenset({"Evaluate"})  # their duration would time the held-out evaluation
CODE_NAMES = frozenset(code.name for code in grpc.StatusCode)
OTHER = "other"
RPC_BUCKETS = (0.005, 0.025, 0.1, 0.5, 1, 5, 30, 120, 600, 1800, float("inf"))


def _rpc_label(rpc: str) -> str:
    return rpc if rpc in RPC_NAMES else OTHER


def _code_label(code: str) -> str:
    return code if code in CODE_NAMES else OTHER


class OwnerMetrics:
    """The node's metrics in a private registry. Thread-safe (prometheus_client is)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter(
            "target_owner_rpc_requests", "RPCs handled, by method.", ["rpc"], registry=r
        )
        self.errors = Counter(
            "target_owner_rpc_errors", "RPCs that ended with an error, by method and gRPC status code.",
            ["rpc", "code"], registry=r,
        )
        self.rpc_seconds = Histogram(
            "target_owner_rpc_duration_seconds", "Wall time of each RPC, by method (Evaluate is never timed).",
            ["rpc"],
            buckets=RPC_BUCKETS, registry=r,
        )
        self.evaluations_in_flight = Gauge(
            "target_owner_evaluations_in_flight", "Scoring runs in progress.", registry=r
        )
        self.releases = Counter(
            "target_owner_releases", "New releases (DP, exact or test split); replays excluded.", registry=r
        )
        self.dp_releases = Counter(
            "target_owner_dp_releases", "New DP-noised releases of the feedback split.", registry=r
        )
        self.replays = Counter(
            "target_owner_release_replays",
            "Retries answered from the ledger (same request_id): no new spend.", registry=r,
        )
        self.upload_bytes = Counter(
            "target_owner_upload_bytes", "Checkpoint bytes received (reused files excluded).", registry=r
        )
        self.epsilon_budget = Gauge("target_owner_epsilon_budget", "Total epsilon budget (0 without DP).", registry=r)
        self.epsilon_spent = Gauge("target_owner_epsilon_spent", "Epsilon spent so far (from the ledger).", registry=r)
        self.epsilon_remaining = Gauge("target_owner_epsilon_remaining", "Epsilon budget left.", registry=r)
        self.dp_releases_made = Gauge(
            "target_owner_dp_releases_made", "DP releases charged in the ledger, all runs together.", registry=r
        )
        self.noise_multiplier = Gauge(
            "target_owner_noise_multiplier", "Calibrated noise multiplier z (0 without DP).", registry=r
        )

    # -- recording -------------------------------------------------------------------------
    def observe_rpc(self, rpc: str, code: str, seconds: float) -> None:
        """One finished RPC; `code` is a grpc.StatusCode name ("OK" on success)."""
        rpc, code = _rpc_label(rpc), _code_label(code)
        self.requests.labels(rpc=rpc).inc()
        if rpc not in UNTIMED_RPCS:
            self.rpc_seconds.labels(rpc=rpc).observe(max(0.0, seconds))
        if code != "OK":
            self.errors.labels(rpc=rpc, code=code).inc()

    def observe_upload(self, bytes_received: int) -> None:
        self.upload_bytes.inc(max(0, int(bytes_received)))

    @contextlib.contextmanager
    def evaluation(self) -> Iterator[None]:
        """Counts one scoring run as in flight meanwhile (never its duration)."""
        self.evaluations_in_flight.inc()
        try:
            yield
        finally:
            self.evaluations_in_flight.dec()

    def count_release(self, dp: bool) -> None:
        self.releases.inc()
        if dp:
            self.dp_releases.inc()

    def count_replay(self) -> None:
        self.replays.inc()

    def set_budget(self, budget: Any) -> None:
        """Copy the spend from a PrivacyBudget (None when DP is off) into the gauges."""
        if budget is None:
            for gauge in (self.epsilon_budget, self.epsilon_spent, self.epsilon_remaining, self.noise_multiplier):
                gauge.set(0.0)
            return
        self.epsilon_budget.set(budget.privacy.epsilon_budget)
        self.epsilon_spent.set(budget.spent())
        self.epsilon_remaining.set(budget.remaining())
        self.dp_releases_made.set(budget.releases_made)
        self.noise_multiplier.set(budget.noise_multiplier)

    def render(self) -> bytes:
        """The Prometheus text exposition of this registry (what /metrics serves)."""
        return generate_latest(self.registry)


@dataclass
class MetricsEndpoint:
    """A running /metrics HTTP server."""

    host: str
    port: int
    _server: Any
    _thread: Any

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


def serve_metrics(metrics: OwnerMetrics, host: str, port: int) -> MetricsEndpoint:
    """Serve `metrics` on http://host:port/metrics (port 0 = any free port) in a daemon thread."""
    from prometheus_client import start_http_server

    server, thread = start_http_server(port, addr=host, registry=metrics.registry)
    return MetricsEndpoint(host, server.server_port, server, thread)
