"""OwnerFeedback: the FeedbackContext a data policy uses to learn from a remote target owner.

It turns lookahead parameter sets into checkpoint folders (trainer_node/feedback/candidates.py:
one shard per tensor, so only changed tensors travel; a LoRA run's: the base once, then only
adapters, trainer_node/feedback/adapters.py), uploads them, asks for ONE
multi-candidate release on the owner's secret subsample, and paces queries so the privacy
budget lasts the run. When the owner is unreachable or the budget is spent the release is
None: training goes on with the policy's last state, and the log says so.

Two ways to ask (the policy picks, L2RR by its `max_staleness` option):
- `evaluate(candidates)`: synchronous; the step waits for the release.
- `submit(candidates)`: asynchronous; the base model is snapshotted and the candidates are
  handed to one background thread that writes, uploads and waits for the owner, while training
  goes on. The returned PendingRelease says when the release is in; `result()` then applies
  its bookkeeping (pacer, statistics) on the training thread. One query is in flight at a
  time, its request id makes a retry free, and a failed query completes at once with None.
`connect_owner_feedback` is the one place an OwnerFeedback is built.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from protocol.generated.target_feedback.v1 import target_feedback_pb2 as pb
from trainer_node.feedback.client import BudgetExhausted, FeedbackError
from trainer_node.feedback.pacing import BudgetPacer
from trainer_node.feedback.release import ACCURACY, ReleaseOptions

if TYPE_CHECKING:
    from trainer_node.feedback.clip_calibration import ClipCalibration

log = logging.getLogger("trainer_node.feedback")
_BACKGROUND = threading.local()  # .active on the background query thread (no phase clock there)

BACKGROUND_NICE = 19
"""The background query thread's CPU priority (Linux, per thread; inherited by the threads it starts)."""


def yield_cpu_to_training() -> bool:
    """Run the calling thread at the lowest CPU priority, so that it never takes a core from the
    training thread (the nice value of a thread, not the process, on Linux). True when set.

    Why: its work (candidates, writing, uploading) only has to be done within max_staleness steps,
    while every moment it preempts the training thread lengthens a step. At the training thread's
    priority it cost 0.1-0.15 s of run-queue wait per 60-step simulate run (docs/RESULTS.md 6.15)."""
    if not sys.platform.startswith("linux"):  # elsewhere the call takes a process id, not a thread's
        return False
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), BACKGROUND_NICE)
    except OSError:  # a denied call: the thread keeps the training thread's priority
        return False
    return True


def _labels(candidates: int, with_base: bool) -> list[str]:
    """Upload labels for one query: the live model first when it is released too."""
    return (["base"] if with_base else []) + [f"cand{i}" for i in range(candidates)]


@dataclass(frozen=True)
class _Query:
    """How one query is asked: its decoding, and a difference release's settings (None: accuracy)."""

    decoding: pb.DecodingSettings
    difference: pb.DifferenceRequest | None = None

    @property
    def extra(self) -> dict[str, Any]:
        """What OwnerClient.evaluate gets beyond ids and decoding: `difference` only when set, so a
        transport from before difference releases keeps answering accuracy queries."""
        return {} if self.difference is None else {"difference": self.difference}


def _decoding_of(decoding: pb.DecodingSettings) -> Any:
    """The proto's decoding as rlvr_core's Decoding (what the owner will decode with)."""
    from rlvr_core.scoring import Decoding

    return Decoding(int(decoding.max_new_tokens), max(1, int(decoding.samples_per_prompt)),
                    float(decoding.temperature), int(decoding.seed))


class OwnerClient(Protocol):
    """What the feedback pieces ask of a transport to the owner. TargetFeedbackClient (gRPC +
    mTLS) is one; another transport (e.g. Flower) plugs in under the same five calls, raising
    trainer_node.feedback.client's FeedbackError / BudgetExhausted as that client does.

    `upload` may be given the files' sha256 digests (known to the writer), so it need not read
    them back to hash them; a transport may ignore them."""

    def info(self) -> pb.GetInfoResponse: ...

    def budget(self) -> pb.GetBudgetResponse: ...

    def upload(self, model_dir: Path, digests: dict[str, str] | None = None) -> str: ...

    def evaluate(self, checkpoint_ids: list[str], decoding: pb.DecodingSettings,
                 split: int = pb.SPLIT_FEEDBACK, difference: pb.DifferenceRequest | None = None
                 ) -> pb.EvaluateResponse: ...

    def close(self) -> None: ...


@dataclass
class FeedbackStats:
    queries: int = 0
    failures: int = 0
    candidates_evaluated: int = 0
    epsilon_spent: float = 0.0
    epsilon_remaining: float = 0.0
    last_noise_std: float = 0.0
    uploaded_bytes: int = 0
    """Bytes the owner did not hold and that were sent (manifest-only files excluded)."""
    query_uploaded_bytes: int = 0
    """The part of uploaded_bytes sent for feedback queries (base + candidates; not evaluation or
    selection uploads): / queries = what a query costs in bytes (a LoRA run: its adapters)."""
    background_candidates_s: float = 0.0
    """Asynchronous queries: seconds the background thread spent building lookahead candidates."""
    background_upload_s: float = 0.0
    """Asynchronous queries: seconds the background thread spent writing and uploading."""
    background_owner_s: float = 0.0
    """Asynchronous queries: seconds the background thread waited for the owner's release."""
    background_cpu_s: float = 0.0
    """Asynchronous queries: CPU seconds the background thread used (candidates, writes, uploads,
    the gRPC wait): what it can take from the training thread on a shared CPU."""
    last_clip: float = 0.0
    """The per-row clip of the last difference release (0: none yet)."""
    skipped: int = 0
    """Difference queries not sent: the candidates equalled the live model on the trainer's prompts."""

    def background_summary(self) -> dict[str, float]:
        """The background thread's split, for a run's summary; empty when no query ran in it."""
        split = {"candidates_s": self.background_candidates_s, "upload_s": self.background_upload_s,
                 "owner_s": self.background_owner_s, "cpu_s": self.background_cpu_s}
        return {f"feedback_background/{k}": round(v, 3) for k, v in split.items()} if any(split.values()) else {}
    log: list[dict[str, Any]] = field(default_factory=list)


class PendingRelease:
    """An asynchronous query: `ready()` once the owner answered (or the query failed)."""

    def __init__(self, feedback: OwnerFeedback, future: Future, step: int, candidates: int):
        self._feedback = feedback
        self._future = future
        self.step = step
        self.candidates = candidates
        self._done = False
        self._value: list[float] | None = None

    def ready(self) -> bool:
        return self._done or self._future.done()

    def result(self) -> list[float] | None:
        """The released accuracies [base, *candidates] (None: nothing released). Blocks until the
        release is in; the wait is the step's `owner_wait` time."""
        if not self._done:
            release_tap = getattr(self._feedback.trainer, "release_lookahead_tap", None)
            if release_tap is not None and not self._future.done():
                release_tap()  # the background thread may wait for the next update's gradients
            with self._feedback._phase("owner_wait"):
                outcome = self._future.result()
            self._value = self._feedback._settle(self.step, outcome)
            self._done = True
            self._feedback._outstanding = None
        return self._value


class OwnerFeedback:
    """Implements trainer_node.policies.base.FeedbackContext against a live owner."""

    def __init__(
        self,
        client: OwnerClient,
        trainer: Any,  # GRPOTrainer: .model, .tokenizer, .lookahead_state_dicts(), .current_state_dict()
        pacer: BudgetPacer,
        decoding: pb.DecodingSettings,
        workdir: Path,
    ):
        self.client = client
        self.trainer = trainer
        self.pacer = pacer
        self.decoding = decoding
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.stats = FeedbackStats()
        self.stop_reason = ""  # why queries stopped for good (OwnerFeedbackHook reports it)
        self._writer = None
        self._step = 0
        self._upload_lock = threading.Lock()  # the writer and the uploads: training thread + background
        self._executor: ThreadPoolExecutor | None = None
        self._outstanding: PendingRelease | None = None
        self._clip_calibration: ClipCalibration | None = None  # difference releases with a clip from own prompts
        self._owner_max_clip: float | None = None
        # Bytes the background thread uploaded, booked into stats when its query settles on the
        # training thread: a step's record then says what the queries settled so far sent, never
        # how far a background upload happened to get (which depends on the machine's load).
        self._unbooked_bytes = 0
        self._unbooked_query_bytes = 0
        self._unbooked_clip: float | None = None

    # --- FeedbackContext ----------------------------------------------------------------

    def should_query(self, step: int) -> bool:
        self._step = step
        return self._outstanding is None and self.pacer.should_query(step)

    def candidates(self, batch: Sequence[Any], weights: Sequence[Sequence[float]]) -> list[Any]:
        return self.trainer.lookahead_state_dicts(batch, weights)

    def release_current(self, step: int) -> float | None:
        """One release of the live model's held-out accuracy (noisy when DP is on), or None."""
        self._step = step
        accuracies = self.evaluate([])
        return accuracies[0] if accuracies else None

    releases_without_base = True
    """`evaluate` and `submit_lookahead` can leave the live model out (policies/base.py send_query)."""

    def direction_clusters(self) -> list[str]:
        """Clusters the trainer can build a candidate for from a running direction (grpo.lookahead_directions)."""
        return list(self.trainer.direction_clusters()) if hasattr(self.trainer, "direction_clusters") else []

    def direction_candidates(self, mixtures: Sequence[Mapping[str, float]]) -> list[Any]:
        return self.trainer.direction_state_dicts(mixtures)

    def evaluate(self, candidates: Sequence[Any], with_base: bool = True,
                 release: ReleaseOptions = ACCURACY) -> list[float] | None:
        """One release comparing the live model (first) with candidate parameter sets; waits for it.
        Without the base: the candidates alone. A difference release always sends the base (its
        differences are from it) and returns one value per candidate."""
        with_base = with_base or release.is_difference
        try:
            states = [*([self.trainer.current_state_dict()] if with_base else []), *candidates]
            query = self._query(states, release, self._step)
            if query is None:
                return None
            ids = self._upload_all(states, _labels(len(candidates), with_base))
        except FeedbackError as err:
            self.stats.failures += 1
            log.warning("target owner unreachable; training goes on with the last sampler state (%s)", err)
            return None
        return self._release(ids, query)

    def submit(self, candidates: Sequence[Any]) -> PendingRelease:
        """`evaluate`, in the background: training goes on while the owner scores (module docstring)."""
        states = [self.trainer.current_state_dict(), *candidates]  # the base as it is now
        return self._start(lambda: states, _labels(len(candidates), with_base=True), ACCURACY)

    def submit_lookahead(self, batch: Sequence[Any], weights: Sequence[Sequence[float]],
                         with_base: bool = True, release: ReleaseOptions = ACCURACY) -> PendingRelease:
        """`submit`, with the lookahead candidates also built in the background, from a snapshot of
        the model and optimizer taken now (GRPOTrainer.lookahead_snapshot), and from the gradients
        of the update that follows where the trainer can tap them (grpo/gradient_tap.py)."""
        self._check_idle()  # before the snapshot: a refused query must not leave a tap behind
        batch, weights = list(batch), [list(w) for w in weights]
        snapshot = self.trainer.lookahead_snapshot(batch, weights)
        return self._start_from(snapshot, lambda: self.trainer.lookahead_from_snapshot(snapshot, batch, weights),
                                len(weights), with_base, release)

    def submit_directions(self, mixtures: Sequence[Mapping[str, float]], with_base: bool = True,
                          release: ReleaseOptions = ACCURACY) -> PendingRelease:
        """`submit_lookahead` for candidates along the clusters' running directions (one per mixture of
        cluster name -> share), built in the background from the directions as they are now."""
        self._check_idle()
        mixtures = [dict(m) for m in mixtures]
        snapshot = self.trainer.lookahead_snapshot()
        return self._start_from(snapshot, lambda: self.trainer.directions_from_snapshot(snapshot, mixtures),
                                len(mixtures), with_base, release)

    def _start_from(self, snapshot: Any, build: Any, candidates: int, with_base: bool,
                    release: ReleaseOptions) -> PendingRelease:
        with_base = with_base or release.is_difference

        def states() -> list[dict[str, Any]]:
            started = time.perf_counter()
            try:
                return [*([snapshot.base] if with_base else []), *build()]
            finally:
                waited = snapshot.tap.waited_s if snapshot.tap is not None else 0.0
                self.stats.background_candidates_s += time.perf_counter() - started - waited

        return self._start(states, _labels(candidates, with_base), release)

    def _check_idle(self) -> None:
        if self._outstanding is not None:
            raise RuntimeError("a feedback query is already in flight; collect it before submitting another")

    def _start(self, states: Any, labels: list[str], release: ReleaseOptions) -> PendingRelease:
        self._check_idle()
        with self._upload_lock:
            self._writer_for()  # built here, from the model as it is, not while the next step trains
        step = self._step
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="owner-feedback",
                                                initializer=yield_cpu_to_training)
        future = self._executor.submit(self._background_query, states, step, labels, release)
        self._outstanding = PendingRelease(self, future, step, len(labels))
        return self._outstanding

    def release_checkpoints(self, checkpoint_ids: Sequence[str]) -> list[float] | None:
        """One (DP) release of the feedback-split accuracy of uploaded checkpoints, or None."""
        return self._release(list(checkpoint_ids), _Query(self._query_decoding(self._step)))

    def _release(self, ids: list[str], query: _Query) -> list[float] | None:
        try:
            with self._phase("owner_wait"):
                response = self.client.evaluate(ids, query.decoding, split=pb.SPLIT_FEEDBACK, **query.extra)
        except FeedbackError as err:
            return self._settle(self._step, err)
        return self._settle(self._step, (ids, response))

    def _query(self, states: Sequence[dict[str, Any]], release: ReleaseOptions, step: int) -> _Query | None:
        """The decoding and difference settings of one query of `states` ([base, *candidates] for a
        difference release); None when the candidates equal the base on the trainer's own prompts
        (a difference release would tell nothing: it is not sent)."""
        decoding = self._query_decoding(step, release)
        if not release.is_difference:
            return _Query(decoding)
        clip = release.clip
        if clip is None:
            clip = self._calibration(release).clip_for(states[0], states[1:], _decoding_of(decoding),
                                                       self._max_clip())
            if clip is None:
                self.stats.skipped += 1
                log.info("step %d: the candidates equal the live model on the trainer's prompts; no release", step)
                return None
        self._unbooked_clip = clip  # enters stats when the query settles (_book_uploads)
        return _Query(decoding, pb.DifferenceRequest(metric=release.metric, clip=clip))

    def _calibration(self, release: ReleaseOptions) -> ClipCalibration:
        if self._clip_calibration is None or self._clip_calibration.options != release:
            from trainer_node.feedback.clip_calibration import ClipCalibration

            self._clip_calibration = ClipCalibration(self.trainer, release, seed=int(self.decoding.seed))
        return self._clip_calibration

    def _max_clip(self) -> float:
        """The owner's max_clip (GetInfo), read once; 0 when unknown."""
        if self._owner_max_clip is None:
            try:
                self._owner_max_clip = float(self.client.info().difference_support.max_clip)
            except FeedbackError:
                return 0.0
        return self._owner_max_clip

    def drain(self) -> None:
        """Wait for a query still in flight and book its release (the run's end)."""
        if self._outstanding is not None:
            self._outstanding.result()

    def close(self) -> None:
        self.drain()
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None

    # --- checkpoints --------------------------------------------------------------------

    def upload_state(self, state_dict: dict[str, Any], label: str) -> str:
        """Write parameters as an allowlisted checkpoint folder and upload it; returns its id."""
        with self._upload_lock, self._phase("upload"):
            return self._write_and_upload(state_dict, label)

    def upload_current(self, label: str = "current") -> str:
        return self.upload_state(self.trainer.current_state_dict(), label)

    # --- internals ------------------------------------------------------------------------

    def _phase(self, name: str):
        """The trainer's phase clock on the training thread; nothing on the background thread."""
        clock = getattr(self.trainer, "clock", None)
        if clock is None or getattr(_BACKGROUND, "active", False):
            return contextlib.nullcontext()
        return clock.phase(name)

    def _query_decoding(self, step: int, release: ReleaseOptions = ACCURACY) -> pb.DecodingSettings:
        decoding = pb.DecodingSettings()
        decoding.CopyFrom(self.decoding)
        decoding.seed = self.decoding.seed + step  # fresh seed per query, shared by candidates
        if release.is_difference:  # the owner samples the live model's completions, or scores the reference,
            decoding.samples_per_prompt = release.samples_per_prompt if release.samples else 1
            decoding.temperature = release.temperature  # at the release's temperature either way
        return decoding

    def _upload_all(self, states: Sequence[dict[str, Any]], labels: Sequence[str]) -> list[str]:
        with self._upload_lock, self._phase("upload"):
            ids = [self._write_and_upload(state, label, query=True)
                   for state, label in zip(states, labels, strict=True)]
            self._writer_for().prune_blobs(keep=set())  # the owner holds them now
        return ids

    def _writer_for(self):
        if self._writer is None:
            from trainer_node.feedback.candidates import candidate_writer

            self._writer = candidate_writer(self.trainer.model, self.trainer.tokenizer, self.workdir)
        return self._writer

    def _write_and_upload(self, state: dict[str, Any], label: str, query: bool = False) -> str:
        writer = self._writer_for()
        written = writer.write(state, label)
        try:
            checkpoint_id = self.client.upload(written.directory, written.digests)
            self._count_upload(int(getattr(self.client, "last_upload_bytes", 0)), query)
        finally:
            writer.discard(written)
        return checkpoint_id

    def _count_upload(self, sent: int, query: bool) -> None:
        if getattr(_BACKGROUND, "active", False):
            self._unbooked_bytes += sent
            self._unbooked_query_bytes += sent if query else 0
            return
        self.stats.uploaded_bytes += sent
        self.stats.query_uploaded_bytes += sent if query else 0

    def _book_uploads(self) -> None:
        """On the training thread, once the background query is done: its uploads and clip enter stats."""
        if self._unbooked_clip is not None:
            self.stats.last_clip, self._unbooked_clip = self._unbooked_clip, None
        self.stats.uploaded_bytes += self._unbooked_bytes
        self.stats.query_uploaded_bytes += self._unbooked_query_bytes
        self._unbooked_bytes = self._unbooked_query_bytes = 0

    def _background_query(self, make_states: Any, step: int, labels: list[str], release: ReleaseOptions):
        """On the background thread: (ids, response), None (nothing worth releasing), or the
        FeedbackError that ended the query."""
        _BACKGROUND.active = True
        cpu_started = time.thread_time()
        try:
            return self._background_work(make_states, step, labels, release)
        finally:
            self.stats.background_cpu_s += time.thread_time() - cpu_started

    def _background_work(self, make_states: Any, step: int, labels: list[str], release: ReleaseOptions):
        states = make_states()
        started = time.perf_counter()
        try:
            query = self._query(states, release, step)  # a difference release's clip: candidate work
        except FeedbackError as err:
            return err
        finally:
            self.stats.background_candidates_s += time.perf_counter() - started
        if query is None:
            return None
        started = time.perf_counter()
        try:
            ids = self._upload_all(states, labels)
        except FeedbackError as err:
            return err
        finally:
            self.stats.background_upload_s += time.perf_counter() - started
        started = time.perf_counter()
        try:
            return ids, self.client.evaluate(ids, query.decoding, split=pb.SPLIT_FEEDBACK, **query.extra)
        except FeedbackError as err:
            return err
        finally:
            self.stats.background_owner_s += time.perf_counter() - started

    def _settle(self, step: int, outcome: Any) -> list[float] | None:
        """Book a query's outcome on the training thread: pacer, statistics, the released values
        (accuracies, or a difference release's differences, one per candidate)."""
        self._book_uploads()
        if outcome is None:  # not sent: nothing to release (_query)
            return None
        if isinstance(outcome, BudgetExhausted):
            self.pacer.mark_exhausted()
            self.stop_reason = f"the owner refused a release: {outcome.reason or 'RESOURCE_EXHAUSTED'}"
            self.stats.failures += 1
            log.warning("target owner budget exhausted; keeping the last sampler state (%s)", outcome.reason)
            return None
        if isinstance(outcome, FeedbackError):
            self.stats.failures += 1
            log.warning("target owner unreachable; training goes on with the last sampler state (%s)", outcome)
            return None
        ids, response = outcome
        privacy = response.privacy
        self.pacer.record(step, privacy.epsilon_this_release, privacy.epsilon_remaining)
        self.stats.queries += 1
        self.stats.candidates_evaluated += len(ids)
        self.stats.epsilon_spent = privacy.epsilon_spent_total
        self.stats.epsilon_remaining = privacy.epsilon_remaining
        self.stats.last_noise_std = privacy.noise_std
        difference = response.kind == pb.RELEASE_KIND_ACCURACY_DIFFERENCE
        values = [r.accuracy_difference if difference else r.accuracy for r in response.results]
        self.stats.log.append(
            {
                "step": step,
                "candidates": len(ids),
                "kind": "difference" if difference else "accuracy",
                "accuracies" if not difference else "differences": values,
                "noise_std": privacy.noise_std,
                "epsilon_this_release": privacy.epsilon_this_release,
                "epsilon_spent": privacy.epsilon_spent_total,
            }
        )
        return values


# --- wiring -------------------------------------------------------------------------------

@dataclass(frozen=True)
class FeedbackSettings:
    """How a run queries its owner: decoding of the owner's evaluations and budget pacing."""

    total_steps: int
    max_new_tokens: int
    seed: int
    """Decoding seed of the first query; each query adds its step (OwnerFeedback.release_checkpoints)."""
    samples_per_prompt: int = 1
    temperature: float = 0.0
    """0 = greedy, the lowest-variance estimate of the owner's accuracy."""
    min_interval: int = 1
    """Never query more often than every this many steps."""
    reserve_queries: int = 0
    """Releases the pacer keeps back from the sampler (1 for checkpoint selection)."""


def connect_owner_feedback(
    client: OwnerClient, trainer: Any, settings: FeedbackSettings, workdir: Path
) -> OwnerFeedback:
    """The one wiring of OwnerFeedback, its BudgetPacer and its decoding, for any client.

    `train` (a remote owner) and the lab (a local owner process) both build theirs here. An
    owner that does not answer at start is not fatal: the pacer assumes DP is on (the
    conservative choice) and the queries retry later.
    """
    try:
        dp_enabled = client.info().privacy.enabled
    except FeedbackError as error:
        log.warning("target owner not reachable at start (%s); training goes on and retries later", error)
        dp_enabled = True
    pacer = BudgetPacer(total_steps=settings.total_steps, min_interval=settings.min_interval,
                        dp_enabled=dp_enabled, reserve_queries=settings.reserve_queries)
    decoding = pb.DecodingSettings(max_new_tokens=settings.max_new_tokens,
                                   samples_per_prompt=settings.samples_per_prompt,
                                   temperature=settings.temperature, seed=settings.seed)
    return OwnerFeedback(client, trainer, pacer, decoding, workdir)

