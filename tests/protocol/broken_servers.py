"""Deliberately broken owner servers: the project's real server with one protection removed,
each to prove that the conformance suite notices.

Every server is the real `target_owner_node.server.start_server` on a node folder made by
`target-owner-node init` (small testbed, canaries planted). A model-free scorer (every row
scores 0, like the suite's random checkpoint) keeps them fast; breakages are applied by
wrapping the real pieces, never by editing target_owner_node/.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from protocol.errors import ProtocolError
from protocol.privacy.mechanisms import SecureRandom
from target_owner_node.config import OwnerConfig, load_config
from target_owner_node.server import RunningServer, start_server


class ZeroScorer:
    """Scores every row 0 without loading a model (what the suite's random checkpoint scores)."""

    def score(self, split, checkpoints, indices, decoding) -> np.ndarray:
        return np.zeros((len(checkpoints), len(indices)))

    def close(self) -> None:
        pass


class ZeroNoise:
    """(b) A random source whose Gaussian noise is always 0; the subsample stays random."""

    def __init__(self) -> None:
        self._real = SecureRandom()

    def normal(self, std: float, size: int) -> np.ndarray:
        return np.zeros(size)

    def bernoulli_mask(self, n: int, p: float) -> np.ndarray:
        return self._real.bernoulli_mask(n, p)


@dataclass
class InProcessServer:
    """The real server in this process, restartable on the same port."""

    config: OwnerConfig
    mutate: Callable[[RunningServer], None] = lambda running: None
    on_restart: Callable[[OwnerConfig], None] = lambda config: None
    random_source: object | None = None
    running: RunningServer | None = field(default=None, init=False)
    port: int = 0

    def start(self) -> InProcessServer:
        self.running = start_server(self.config, f"127.0.0.1:{self.port}", scorer=ZeroScorer(),
                                    random_source=self.random_source)
        self.port = self.running.port
        self.mutate(self.running)
        return self

    def stop(self) -> None:
        if self.running is not None:
            self.running.shutdown(grace_s=0.5, drain_delay_s=0)
            self.running = None

    def restart(self) -> None:
        self.stop()
        self.on_restart(self.config)
        self.start()

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"


def leaky_errors(canary: str) -> Callable[[RunningServer], None]:
    """(a) Every error message quotes a held-out row (here: the canary planted in it)."""

    def mutate(running: RunningServer) -> None:
        servicer = running.servicer
        original = servicer._handle

        def handle(method, context, body):
            def leaky_body(client):
                try:
                    return body(client)
                except ProtocolError as error:
                    raise ProtocolError(error.code, error.reason, f"{error.message} (near row: {canary})",
                                        error.metadata) from None

            return original(method, context, leaky_body)

        servicer._handle = handle

    return mutate


def wipe_storage(config: OwnerConfig) -> None:
    """(c) The restart loses the storage folder: ledger, audit log and checkpoints (and the
    state marker kept outside it, which would otherwise refuse the restart)."""
    shutil.rmtree(config.storage.dir)
    config.storage.dir.mkdir()
    config.storage.state_marker_path.unlink(missing_ok=True)


def anonymous_clients(running: RunningServer) -> None:
    """(d, with require_client_auth=False) Calls without a client certificate are served."""
    from target_owner_node.server import _peer_identity

    running.servicer._authorize = lambda context: _peer_identity(context) or "anonymous"


def without_client_auth(config: OwnerConfig, monkeypatch) -> OwnerConfig:
    """(d) The TLS layer stops asking for client certificates and the per-call certificate
    policy lets everyone through (used with `anonymous_clients` for the servicer)."""
    from protocol.tls import ClientCertificatePolicy

    monkeypatch.setattr(ClientCertificatePolicy, "refusal", lambda self, context: None)
    return config.model_copy(update={"tls": config.tls.model_copy(update={"require_client_auth": False})})


def accept_pickle(monkeypatch) -> None:
    """(e) The upload validators let pickle weight files (.bin, .pt) through: the name check
    skips them and the checkpoint-folder check only sees the other files."""
    import os
    import tempfile

    import target_owner_node.checkpoint_store as store

    pickle_names = (".bin", ".pt")
    original_name_check = store.validate_file_name
    original_dir_check = store.validate_checkpoint_dir

    def lenient_name(name: str) -> str:
        return name if name.endswith(pickle_names) else original_name_check(name)

    def lenient_dir(path, *args, **kwargs):
        with tempfile.TemporaryDirectory(dir=Path(path).parent) as view:
            for item in Path(path).iterdir():
                if not item.name.endswith(pickle_names):
                    os.link(item, Path(view) / item.name)
            return original_dir_check(Path(view), *args, **kwargs)

    monkeypatch.setattr(store, "validate_file_name", lenient_name)
    monkeypatch.setattr(store, "validate_checkpoint_dir", lenient_dir)


def fast_exact_rdp(monkeypatch) -> None:
    """Make opacus' RDP accounting fast without changing a single number: compute_rdp is
    linear in `steps`, so the per-step RDP curve of each (q, z) is computed once and scaled.
    (Unpatched, one GetBudget recomputes the curves ~15 times: seconds per call on 2 cores.)"""
    from opacus.accountants.analysis import rdp

    original = rdp.compute_rdp
    curves: dict[tuple, np.ndarray] = {}

    def compute_rdp(*, q, noise_multiplier, steps, orders):
        key = (q, noise_multiplier, tuple(orders) if np.ndim(orders) else orders)
        if key not in curves:
            curves[key] = np.asarray(original(q=q, noise_multiplier=noise_multiplier, steps=1, orders=orders))
        return curves[key] * steps

    monkeypatch.setattr(rdp, "compute_rdp", compute_rdp)


def node_config(node_dir: Path) -> OwnerConfig:
    return load_config(node_dir / "config.toml")
