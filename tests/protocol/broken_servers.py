"""Deliberately broken owner servers: the project's real server with one protection removed,
each to prove that the conformance suite notices.

Every server is the real `target_owner_node.server.start_server` on a node folder made by
`target-owner-node init` (small testbed, canaries planted). A model-free scorer (every row
scores 0, like the suite's random checkpoint) keeps them fast; breakages are applied by
wrapping the real pieces, never by editing target_owner_node/.

Issue 11's breakages that need an owner on the suite's own data (--launch-cmd) run in a
dedicated process started by conformance_harness.py's `launch` (see `launch_breakage`): there
the real evaluation worker runs, with its entry point wrapped where the breakage lives in it.
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

    def differences(self, split, checkpoints, indices, decoding, metric, clip) -> np.ndarray:
        """Every candidate's rows differ from the base by 0 (difference releases)."""
        return np.zeros((len(checkpoints) - 1, len(indices)))

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
    scorer: object = field(default_factory=lambda: ZeroScorer())
    running: RunningServer | None = field(default=None, init=False)
    port: int = 0

    def start(self) -> InProcessServer:
        self.running = start_server(self.config, f"127.0.0.1:{self.port}", scorer=self.scorer,
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


def accept_any_adapter(monkeypatch) -> None:
    """(issue 14) Adapters are stored without being checked against their base."""
    from protocol import validation

    monkeypatch.setattr(validation, "validate_adapter", lambda *args, **kwargs: None)


def hide_adapter_support(monkeypatch) -> None:
    """(issue 14) GetInfo says no LoRA adapters, but the store still accepts them (the evaluator
    would apply them silently; a server without adapter code would ignore them)."""
    from target_owner_node import server

    original = server.info_response

    def without_adapters(node, request=None):
        info = original(node, request)
        info.delta_support.lora_adapters = False
        info.delta_support.max_lora_rank = 0
        info.delta_support.max_adapter_bytes = 0
        return info

    monkeypatch.setattr(server, "info_response", without_adapters)


def without_delta_support(monkeypatch) -> None:
    """(issue 14) Not broken: a server from before delta candidates. GetInfo advertises no
    delta_support and adapter files are refused (DISALLOWED_FILE)."""
    from protocol import errors, validation
    from protocol.refusal import CheckpointValidationError
    from target_owner_node import server

    original = server.info_response

    def without(node, request=None):
        info = original(node, request)
        info.ClearField("delta_support")
        return info

    def refuse(*args, **kwargs):
        raise CheckpointValidationError(errors.DISALLOWED_FILE, "adapter_model.safetensors is not allowed")

    monkeypatch.setattr(server, "info_response", without)
    monkeypatch.setattr(validation, "validate_adapter", refuse)


# -- difference releases (RELEASE_KIND_ACCURACY_DIFFERENCE) -----------------------------------------
def serves_undeclared_differences(monkeypatch) -> None:
    """GetInfo declares accuracy releases only, but difference requests are still evaluated (and charged)."""
    from protocol.generated.target_feedback.v1 import target_feedback_pb2 as pb
    from target_owner_node import server

    original = server.info_response

    def accuracy_only(node, request=None):
        info = original(node, request)
        info.ClearField("release_kinds")
        info.release_kinds.append(pb.RELEASE_KIND_ACCURACY)
        info.ClearField("difference_support")
        return info

    monkeypatch.setattr(server, "info_response", accuracy_only)


def _bad_clip(release, max_clip: float) -> bool:
    return release.is_difference and not (np.isfinite(release.clip) and 0 < release.clip <= max_clip)


def charges_before_clip_check(monkeypatch, max_clip: float) -> None:
    """A bad difference.clip passes request validation (checked on a copy with a valid clip, the real one put
    back), and the release refuses it only after the charge (charged at the valid clip): INVALID_ARGUMENT, with
    the budget spent."""
    import dataclasses

    from protocol import errors
    from protocol.errors import invalid
    from protocol.generated.target_feedback.v1 import target_feedback_pb2 as pb
    from target_owner_node import server
    from target_owner_node.release import ReleaseService

    original_parse, original_charge = server.parse_evaluate_request, ReleaseService._charge

    def parse(request, *args, **kwargs):
        masked = pb.EvaluateRequest()
        masked.CopyFrom(request)
        if masked.HasField("difference"):
            masked.difference.clip = max_clip
        inputs = original_parse(masked, *args, **kwargs)
        if not inputs.release.is_difference:
            return inputs
        return dataclasses.replace(inputs, release=dataclasses.replace(inputs.release, clip=request.difference.clip))

    def charge(self, client, request):
        if not _bad_clip(request.release, max_clip):
            return original_charge(self, client, request)
        valid = dataclasses.replace(request, release=dataclasses.replace(request.release, clip=max_clip))
        original_charge(self, client, valid)
        raise invalid(errors.DECODING_OUT_OF_LIMITS, f"difference.clip: must be in (0, {max_clip:g}]")

    monkeypatch.setattr(server, "parse_evaluate_request", parse)
    monkeypatch.setattr(ReleaseService, "_charge", charge)


def unscaled_difference_noise_std(monkeypatch) -> None:
    """A difference release adds noise calibrated to its clip but reports the accuracy noise std (not x clip)."""
    from target_owner_node import server

    original = server.evaluate_response

    def response(result):
        out = original(result)
        if result.release.is_difference:
            out.privacy.noise_std = result.noise_std / result.release.clip
        return out

    monkeypatch.setattr(server, "evaluate_response", response)


UNCLIPPED = 1e9  # a "clip" no row difference reaches


def unclipped_differences() -> None:
    """(launched) Row differences are never clipped: the worker, the WorkerScorer and the release's own bound
    are all handed a clip no value reaches, and the DP replay clips at it too; the request's clip still sets the
    noise and the response."""
    import dataclasses

    from target_owner_node import release
    from target_owner_node.release import ReleaseService

    original_score, original_replay = ReleaseService._score, release.replay_difference_release

    def score(self, split, checkpoint_ids, indices, decoding, release_spec=release.ACCURACY_RELEASE):
        if release_spec.is_difference:
            release_spec = dataclasses.replace(release_spec, clip=UNCLIPPED)
        return original_score(self, split, checkpoint_ids, indices, decoding, release_spec)

    ReleaseService._score = score
    release.replay_difference_release = lambda differences, expected_size, noise_draws, clip: original_replay(
        differences, expected_size, noise_draws, UNCLIPPED)


class _NoiseMultiplierOverClip:
    """A PrivacyBudget whose noise_multiplier reads z / clip, so that noise of std "z x clip" is z: noise
    calibrated to 1 whatever the clip. Everything else (the event, the charge) is the real budget's."""

    def __init__(self, budget, clip: float) -> None:
        self._budget, self._clip = budget, clip

    @property
    def noise_multiplier(self) -> float:
        return self._budget.noise_multiplier / self._clip

    def __getattr__(self, name: str):
        return getattr(self._budget, name)


def noise_calibrated_to_one() -> None:
    """(launched) A difference release's noise has std z on each sum (calibrated to 1, as for accuracy), not z x clip."""
    from target_owner_node.release import ReleaseService

    original = ReleaseService._charge

    def charge(self, client, request):
        if not request.release.is_difference:
            return original(self, client, request)
        real = self.budget
        self.budget = _NoiseMultiplierOverClip(real, request.release.clip)
        try:
            return original(self, client, request)
        finally:
            self.budget = real

    ReleaseService._charge = charge


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


# -- issue 11: the shape of a release --------------------------------------------------------------
def _view_with(path: Path, replacements: dict[str, bytes]):
    """A temporary folder of hard links to `path`'s files, with `replacements` written instead."""
    import contextlib
    import os
    import tempfile

    @contextlib.contextmanager
    def view():
        with tempfile.TemporaryDirectory(dir=Path(path).parent) as folder:
            for item in Path(path).iterdir():
                target = Path(folder) / item.name
                if item.name in replacements:
                    target.write_bytes(replacements[item.name])
                else:
                    os.link(item, target)
            yield Path(folder)

    return view()


def lenient_about_tokenizers(check: Callable) -> Callable:
    """`check` (a checkpoint-folder validator) run on a view whose tokenizer files are the suite's
    own benign ones: whatever the upload's tokenizer holds is never looked at."""
    from protocol.conformance.checkpoints import suite_tokenizer_files

    def lenient(path, *args, **kwargs):
        with _view_with(Path(path), suite_tokenizer_files()) as view:
            return check(view, *args, **kwargs)

    return lenient


def accept_any_tokenizer(monkeypatch=None) -> None:
    """(f) Upload validation never sees the tokenizer (out-of-range ids, regexes, dropout pass).
    With monkeypatch=None (a dedicated launched process) the patch is simply applied."""
    import target_owner_node.checkpoint_store as store

    lenient = lenient_about_tokenizers(store.validate_checkpoint_dir)
    if monkeypatch is None:
        store.validate_checkpoint_dir = lenient
    else:
        monkeypatch.setattr(store, "validate_checkpoint_dir", lenient)


def lenient_tokenizer_worker(conn, spec) -> None:
    """Evaluation worker entry whose loader check skips the tokenizer too (pairs with accept_any_tokenizer),
    and whose engine no longer confines an out-of-range token id to its row: the pre-issue-11 owner, where
    the embedding raised mid-batch exactly when a sampled prompt held the planted string."""
    from rlvr_core.engines.transformers_engine import TransformersEngine
    from rlvr_core.models import loading
    from target_owner_node.worker import worker_main

    loading.check_model_dir = lenient_about_tokenizers(loading.check_model_dir)
    original_init = TransformersEngine.__init__

    def unguarded_init(self, *args, **kwargs):
        original_init(self, *args, **kwargs)
        self.embedding_rows = 1 << 40  # every id "fits": the embedding itself raises

    TransformersEngine.__init__ = unguarded_init
    worker_main(conn, spec)


def positional_worker(conn, spec) -> None:
    """(g) Evaluation worker entry whose engine keys each row's random stream by its POSITION in
    the list of prompts (row keys dropped), as the engine did before issue 11."""
    from rlvr_core.engines.transformers_engine import TransformersEngine
    from target_owner_node.worker import worker_main

    original = TransformersEngine.generate

    def generate(self, prompts, num_samples, params, row_keys=None, **kwargs):
        return original(self, prompts, num_samples, params, **kwargs)

    TransformersEngine.generate = generate
    worker_main(conn, spec)


class SlowPerSampledRow:
    """(h) Time grows with the secret subsample: a random source that remembers how many rows the
    last Poisson draw kept, and a scorer wrapper that sleeps `per_row_s` for each of them."""

    def __init__(self, per_row_s: float) -> None:
        self.per_row_s = per_row_s
        self._real = SecureRandom()
        self.sampled = 0

    def bernoulli_mask(self, n: int, p: float) -> np.ndarray:
        mask = self._real.bernoulli_mask(n, p)
        self.sampled = int(np.count_nonzero(mask))
        return mask

    def __getattr__(self, name: str):
        return getattr(self._real, name)

    def wrap(self, scorer) -> SlowScorer:
        return SlowScorer(scorer, self)


@dataclass
class SlowScorer:
    inner: object
    slow: SlowPerSampledRow

    def score(self, split, checkpoints, indices, decoding) -> np.ndarray:
        import time

        if split == "feedback":
            time.sleep(self.slow.per_row_s * self.slow.sampled)
        return self.inner.score(split, checkpoints, indices, decoding)

    def start(self) -> None:
        getattr(self.inner, "start", lambda: None)()

    def close(self) -> None:
        self.inner.close()


def forget_deleted_ledger(config: OwnerConfig) -> None:
    """(i) Before start: when the ledger file is gone, also drop what would reveal the old spend
    (the audit log, the rest of storage, state markers beside the config), so the node starts with
    a fresh budget - what a node without a ledger/audit cross-check does."""
    from target_owner_node.ledger import LEDGER_FILE

    storage = config.storage.dir
    if storage.is_dir() and any(storage.iterdir()) and not (storage / LEDGER_FILE).exists():
        shutil.rmtree(storage)
        storage.mkdir()
        folder = config.config_path.parent if config.config_path else storage.parent
        markers = [m for m in folder.glob(".*") if m.is_file()]
        declared = getattr(config.storage, "state_marker_path", None)   # issue 11's marker, once merged
        for marker in markers + ([Path(declared)] if declared else []):
            Path(marker).unlink(missing_ok=True)


class SeedCheckingZeroScorer(ZeroScorer):
    """Scores 0 like ZeroScorer, but refuses a decoding the engine refuses (seed range etc.), as the
    real evaluation worker does - after the charge."""

    def score(self, split, checkpoints, indices, decoding) -> np.ndarray:
        from rlvr_core.engines.base import SamplingParams
        from rlvr_core.engines.sampling import validate_params

        validate_params(SamplingParams(max_new_tokens=decoding.max_new_tokens, temperature=decoding.temperature,
                                       seed=decoding.seed), decoding.samples_per_prompt)
        return super().score(split, checkpoints, indices, decoding)


def seed_unchecked_before_charge(monkeypatch) -> None:
    """(j) Evaluate validation lets any seed through (it validates a copy with seed 0 and puts the
    real seed back), so an out-of-range seed is charged and then fails in the engine."""
    import dataclasses

    from protocol.generated.target_feedback.v1 import target_feedback_pb2 as pb
    from target_owner_node import server

    original = server.parse_evaluate_request

    def parse(request, *args, **kwargs):
        masked = pb.EvaluateRequest()
        masked.CopyFrom(request)
        masked.decoding.seed = 0
        inputs = original(masked, *args, **kwargs)
        return dataclasses.replace(inputs, decoding=dataclasses.replace(inputs.decoding, seed=int(request.decoding.seed)))

    monkeypatch.setattr(server, "parse_evaluate_request", parse)


def worker_scorer(config: OwnerConfig, target: Callable | None = None):
    """The real evaluation worker of `config` (optionally with another entry point)."""
    from rlvr_core.tasks.io import read_examples
    from target_owner_node.evaluator import WorkerScorer
    from target_owner_node.node import worker_spec
    from target_owner_node.worker import worker_main

    sizes = {"feedback": len(read_examples(config.data.heldout_path))}
    return WorkerScorer(worker_spec(config), config.evaluation.timeout_s, sizes, target=target or worker_main)


SLOW_PER_ROW_S = 0.030  # well above the 2-core machine's timing noise, so the aimed check never misses it
LAUNCH_BREAKAGES = ("none", "accepts_any_tokenizer", "positional_randomness", "slow_per_row", "forgets_deleted_ledger",
                    "unclipped_differences", "noise_calibrated_to_one")


def launch_breakage(kind: str, config: OwnerConfig) -> dict:
    """Apply breakage `kind` in this (dedicated) process; returns extra start_server arguments."""
    if kind == "none":
        return {}
    if kind == "accepts_any_tokenizer":
        accept_any_tokenizer()
        return {"scorer": worker_scorer(config, lenient_tokenizer_worker)}
    if kind == "positional_randomness":
        return {"scorer": worker_scorer(config, positional_worker)}
    if kind == "slow_per_row":
        slow = SlowPerSampledRow(SLOW_PER_ROW_S)
        return {"scorer": slow.wrap(worker_scorer(config)), "random_source": slow}
    if kind == "forgets_deleted_ledger":
        forget_deleted_ledger(config)
        return {}
    if kind == "unclipped_differences":
        unclipped_differences()
        return {}
    if kind == "noise_calibrated_to_one":
        noise_calibrated_to_one()
        return {}
    raise ValueError(f"unknown breakage {kind!r}; known: {', '.join(LAUNCH_BREAKAGES)}")


def unnamed_verifier(monkeypatch) -> None:
    """A card that declares a named (plug-in) verifier without saying which: a trainer cannot tell
    what scores its answers."""
    from protocol.generated.target_feedback.v1 import target_feedback_pb2 as pb
    from target_owner_node import server

    real = server.info_response

    def info_response(node, request=None):
        info = real(node, request)
        info.verifier_kind, info.verifier_name = pb.VERIFIER_KIND_NAMED, ""
        return info

    monkeypatch.setattr(server, "info_response", info_response)
