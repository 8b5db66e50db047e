"""One Evaluate request -> one release. Three kinds:

* DP feedback (privacy.enabled): a fresh secret Poisson subsample of the held-out rows
  (each kept with probability q), every candidate scored on that same subsample with the
  same decoding seed, per-candidate sums + Gaussian noise (std z on each sum), divided by
  the PUBLIC expected size q*N. A difference release (ReleaseSpec.is_difference) sums each
  candidate's per-row differences from the base (checkpoint_ids[0]), clipped to the request's
  public [-c, c], with noise std z * c: the same event as an accuracy release of as many
  values. Order of effects, so that no crash can undercount:
      check budget + write PENDING (subsample, noise, charge) to the ledger, fsync
      -> evaluate -> write COMPLETED (values), fsync -> audit -> respond.
  A retry with the same request_id returns the recorded values; a retry of a release that
  was charged but never completed re-runs it with the stored subsample and noise.
* Exact feedback (privacy disabled): mean over every held-out row (of the scores, or of the
  clipped differences), nothing charged.
* Test split (only when configured): exact mean over the whole test split plus per-domain
  means; never charged (it is not the private feedback split), always audited.
"""

from __future__ import annotations

import os
import threading
import time
import uuid
import weakref
from dataclasses import dataclass, field

import grpc
import numpy as np

from protocol import errors
from protocol.errors import ProtocolError, invalid
from protocol.privacy.mechanisms import (
    capped_poisson_mask,
    gaussian_noise,
    release_source,
    replay_difference_release,
    replay_release,
    rows_per_query,
)
from target_owner_node.audit import AuditLog
from target_owner_node.budget import Charge, PrivacyBudget, to_record
from target_owner_node.checkpoint_store import CheckpointStore
from target_owner_node.evaluate_request import ACCURACY_RELEASE, FEEDBACK, TEST, EvaluateInputs, ReleaseSpec
from target_owner_node.evaluator import Scorer
from target_owner_node.heldout import SplitFacts
from target_owner_node.ledger import RECOVERED_NOT_RESUMABLE, LedgerRelease, PendingRelease
from target_owner_node.logs import log_event
from target_owner_node.metrics import OwnerMetrics


def evaluation_incomplete() -> ProtocolError:
    """The one error of a charged release whose evaluation did not finish.

    Fixed code, reason and text whatever went wrong (worker crash, timeout, a model error),
    so that not even the kind of failure can depend on which rows were sampled. The charge
    stands; a retry with the same request_id re-runs the stored subsample and noise for free.
    """
    return ProtocolError(
        grpc.StatusCode.UNAVAILABLE,
        errors.EVALUATION_FAILED,
        "the evaluation did not complete; its charge stands, and a retry with the same request_id "
        "costs no further privacy budget",
    )


@dataclass(frozen=True)
class ReleaseResult:
    release_id: str
    checkpoint_ids: tuple[str, ...]
    values: tuple[float, ...]
    domain_accuracy: tuple[dict[str, float], ...] = ()
    noise_std: float = 0.0
    epsilon_this_release: float = 0.0
    epsilon_spent_total: float = 0.0
    epsilon_remaining: float = 0.0
    delta: float = 0.0
    release: ReleaseSpec = ACCURACY_RELEASE

    @property
    def valued_ids(self) -> tuple[str, ...]:
        """The checkpoints `values` belong to, in order (a difference release's base has no value)."""
        return self.checkpoint_ids[1:] if self.release.is_difference else self.checkpoint_ids


@dataclass
class ReleaseService:
    """Turns validated requests into releases. Thread-safe."""

    facts: SplitFacts
    store: CheckpointStore
    scorer: Scorer
    audit: AuditLog
    budget: PrivacyBudget | None  # None when privacy is disabled
    random_source: object | None = None  # SecureRandom-like: normal(std, size), bernoulli_mask(n, p)
    metrics: OwnerMetrics = field(default_factory=OwnerMetrics)  # start_server swaps in the served one
    min_response_s: float = 0.0  # optional floor on a DP release's wall time (evaluation.min_response_s)
    known_rows_per_query: int | None = None
    """rows_per_query as node start-up read it from its cache (noise_cache.cached_rows_per_query);
    None: computed on first use."""
    # Locks live only while some call holds them (weak values), so refused and finished requests
    # never pile up in this table.
    _request_locks: weakref.WeakValueDictionary = field(default_factory=weakref.WeakValueDictionary, init=False)
    _locks_guard: threading.Lock = field(default_factory=threading.Lock, init=False)

    # -- public numbers ----------------------------------------------------------------------
    @property
    def expected_size(self) -> float:
        """The public release denominator q * N."""
        rate = self.budget.privacy.sample_rate if self.budget else 1.0
        return rate * self.facts.heldout_size

    @property
    def noise_std(self) -> float:
        """Std of the noise on each released accuracy: z / (q N)."""
        return self.budget.noise_multiplier / self.expected_size if self.budget else 0.0

    @property
    def rows_per_query(self) -> int:
        """The public number of rows every DP query evaluates (sampled rows + discarded padding)."""
        if self.budget is None:
            return self.facts.heldout_size
        if self.known_rows_per_query is None:  # a pure function of public numbers: computed once
            privacy = self.budget.privacy
            self.known_rows_per_query = rows_per_query(self.facts.heldout_size, privacy.sample_rate,
                                                       privacy.row_cap_tail)
        return self.known_rows_per_query

    # -- entry point -----------------------------------------------------------------------
    def evaluate(self, client: str, request: EvaluateInputs) -> ReleaseResult:
        if request.split == TEST:
            return self._exact(client, request, TEST)
        if self.budget is None:
            return self._exact(client, request, FEEDBACK)
        started = time.monotonic()
        try:
            if not request.request_id:
                return self._dp_release(client, request)
            lock = self._lock_for(client, request.request_id)
            with lock:
                return self._dp_release(client, request)
        finally:
            self._hold_until(started + self.min_response_s)

    def _lock_for(self, client: str, request_id: str) -> threading.Lock:
        # Serialises retries of one request so a concurrent duplicate waits and then replays.
        # The caller keeps the returned lock alive (a strong reference) while it uses it.
        with self._locks_guard:
            lock = self._request_locks.get((client, request_id))
            if lock is None:
                lock = threading.Lock()
                self._request_locks[(client, request_id)] = lock
            return lock

    @staticmethod
    def _hold_until(deadline: float) -> None:
        remaining = deadline - time.monotonic()
        if remaining > 0:
            time.sleep(remaining)

    # -- DP feedback -----------------------------------------------------------------------
    def _dp_release(self, client: str, request: EvaluateInputs) -> ReleaseResult:
        budget = self.budget
        with budget.lock:
            existing = budget.ledger.find(client, request.request_id)
            if existing is not None:
                if existing.pending.request_fingerprint != request.fingerprint():
                    raise invalid(
                        errors.INVALID_REQUEST,
                        "request_id was already used for a different request; use a fresh request_id",
                    )
                if existing.completed:
                    self.audit.append(
                        "release_replayed",
                        client=client,
                        release_id=existing.pending.release_id,
                        request_id=request.request_id,
                    )
                    log_event("release_replayed", client=client, release_id=existing.pending.release_id)
                    self.metrics.count_replay()
                    return self._result_of(existing)
                if existing.pending.recovered:  # rebuilt ledger: its subsample and noise are gone
                    raise invalid(errors.INVALID_REQUEST, RECOVERED_NOT_RESUMABLE)
                pending = existing.pending
                log_event("release_resumed", client=client, release_id=pending.release_id)
            else:
                pending = self._charge(client, request)
        values = self._evaluate_pending(pending)
        budget.ledger.append_completed(pending.release_id, values)
        result = self._result_of(LedgerRelease(pending, values))
        self._audit_release(client, request, result)
        return result

    def _charge(self, client: str, request: EvaluateInputs) -> PendingRelease:
        budget = self.budget
        release = request.release
        num_values = release.released(len(request.checkpoint_ids))
        event = budget.event_for(num_values)
        n, rate = self.facts.heldout_size, budget.privacy.sample_rate
        source = release_source(self._source(), request.fingerprint())
        # One row moves each released sum by at most 1 (a score in [0, 1]) or c (a difference clipped to
        # [-c, c]): noise of std z times that bound on every sum gives the same event either way.
        noise_std_sum = budget.noise_multiplier * (release.clip if release.is_difference else 1.0)

        cap = self.rows_per_query

        def make_pending(charge: Charge) -> PendingRelease:
            # The subsample and the noise are drawn before evaluation and stored with the charge,
            # so a crash-and-retry releases exactly what was paid for.
            mask = capped_poisson_mask(n, rate, cap, source)
            noise = gaussian_noise(noise_std_sum, num_values, source)
            return PendingRelease(
                release_id=uuid.uuid4().hex,
                request_id=request.request_id,
                client=client,
                time=time.time(),
                request_fingerprint=request.fingerprint(),
                checkpoint_ids=request.checkpoint_ids,
                decoding=request.decoding.to_json(),
                event=to_record(event),
                epsilon_before=charge.epsilon_before,
                epsilon_total_after=charge.epsilon_after,
                client_epsilon_after=charge.client_epsilon_after,
                heldout_size=n,
                expected_size=rate * n,
                noise_std_sum=noise_std_sum,
                mask=mask,
                noise_draws=noise,
                release=release,
            )

        try:
            pending = budget.charge(client, event, make_pending)
        except ProtocolError as error:
            if error.reason in errors.NON_RETRYABLE:
                self.audit.append(
                    "release_refused",
                    client=client,
                    reason=error.reason,
                    checkpoint_ids=list(request.checkpoint_ids),
                    metadata=error.metadata,
                )
                log_event("release_refused", client=client, reason=error.reason, **error.metadata)
            raise
        self.metrics.set_budget(budget)
        log_event(
            "release_charged",
            client=client,
            release_id=pending.release_id,
            checkpoint_ids=list(request.checkpoint_ids),
            epsilon_total=pending.epsilon_total_after,
        )
        return pending

    def _evaluate_pending(self, pending: PendingRelease) -> tuple[float, ...]:
        if pending.heldout_size != self.facts.heldout_size:
            raise ProtocolError(
                grpc.StatusCode.INTERNAL,
                errors.EVALUATION_FAILED,
                "the owner's held-out set changed since this release was charged; it cannot be replayed",
            )
        for checkpoint_id in pending.checkpoint_ids:
            if not self.store.exists(checkpoint_id):
                raise invalid(errors.UNKNOWN_CHECKPOINT, "a checkpoint of this release is no longer stored")
        sampled = np.flatnonzero(pending.mask)
        rows = self._padded_rows(sampled)
        release = pending.release
        scores = self._score(FEEDBACK, pending.checkpoint_ids, rows, pending.decoding, release)
        if release.is_difference:
            released = replay_difference_release(scores[:, : len(sampled)], pending.expected_size,
                                                 pending.noise_draws, release.clip)
        else:
            released = replay_release(scores[:, : len(sampled)], pending.expected_size, pending.noise_draws)
        return tuple(float(v) for v in np.asarray(released).reshape(-1))

    def _padded_rows(self, sampled: np.ndarray) -> np.ndarray:
        """The sampled rows first, then random held-out rows up to the public rows_per_query.

        The padding rows are real rows (drawn uniformly, scores discarded), so even work that
        depends on a row's content (verifying a generation) has the same distribution whatever
        the subsample size: time reveals neither how many nor which rows were sampled.
        """
        missing = self.rows_per_query - len(sampled)
        if missing <= 0:
            return sampled
        generator = np.random.default_rng(int.from_bytes(os.urandom(16), "little"))
        padding = generator.integers(0, self.facts.heldout_size, size=missing)
        return np.concatenate([sampled, padding]).astype(np.int64)

    # -- exact releases --------------------------------------------------------------------
    def _exact(self, client: str, request: EvaluateInputs, split: str) -> ReleaseResult:
        size = self.facts.heldout_size if split == FEEDBACK else self.facts.test_size
        indices = np.arange(size)
        scores = self._score(split, request.checkpoint_ids, indices, request.decoding.to_json(), request.release)
        values = tuple(float(v) for v in scores.mean(axis=1))
        domains: tuple[dict[str, float], ...] = ()
        if split == TEST:
            labels = np.asarray(self.facts.test_domains)
            domains = tuple(
                {domain: float(row[labels == domain].mean()) for domain in sorted(set(labels.tolist()))}
                for row in scores
            )
        spent = self.budget.spent() if self.budget else 0.0
        result = ReleaseResult(
            release_id=uuid.uuid4().hex,
            checkpoint_ids=request.checkpoint_ids,
            values=values,
            domain_accuracy=domains,
            epsilon_spent_total=spent,
            epsilon_remaining=self.budget.remaining() if self.budget else 0.0,
            delta=self.budget.privacy.delta if self.budget else 0.0,
            release=request.release,
        )
        self._audit_release(client, request, result)
        return result

    # -- helpers ---------------------------------------------------------------------------
    def _score(self, split: str, checkpoint_ids, indices: np.ndarray, decoding: dict,
               release: ReleaseSpec = ACCURACY_RELEASE) -> np.ndarray:
        """(values, rows): each checkpoint's row scores, or each candidate's clipped row differences
        from the base (checkpoint_ids[0]) for a difference release."""
        from target_owner_node.evaluate_request import Decoding

        started = time.monotonic()
        try:
            checkpoints = [(cid, self.store.materialize(cid)) for cid in checkpoint_ids]
            with self.metrics.evaluation():
                if release.is_difference:
                    scores = self.scorer.differences(split, checkpoints, indices, Decoding.from_json(decoding),
                                                     release.metric, release.clip)
                else:
                    scores = self.scorer.score(split, checkpoints, indices, Decoding.from_json(decoding))
        except Exception as error:  # noqa: BLE001 - one fixed error, whatever failed and on which rows
            log_event("evaluation_incomplete", split=split, type=type(error).__name__)
            raise evaluation_incomplete() from None
        log_event(
            "evaluated",
            split=split,
            checkpoint_ids=list(checkpoint_ids),
            seconds=round(time.monotonic() - started, 3),
        )
        # The bounds the sensitivity rests on are enforced here, whatever the scorer returned.
        bounds = (-release.clip, release.clip) if release.is_difference else (0.0, 1.0)
        return np.clip(scores, *bounds)

    def _source(self):
        if self.random_source is None:
            from protocol.privacy.mechanisms import SecureRandom

            self.random_source = SecureRandom()
        return self.random_source

    def _result_of(self, release: LedgerRelease) -> ReleaseResult:
        pending = release.pending
        budget = self.budget.privacy
        return ReleaseResult(
            release_id=pending.release_id,
            checkpoint_ids=pending.checkpoint_ids,
            values=release.values,
            noise_std=pending.noise_std_sum / pending.expected_size,
            epsilon_this_release=max(0.0, pending.epsilon_total_after - pending.epsilon_before),
            epsilon_spent_total=pending.epsilon_total_after,
            epsilon_remaining=max(0.0, budget.epsilon_budget - pending.epsilon_total_after),
            delta=budget.delta,
            release=pending.release,
        )

    def _audit_release(self, client: str, request: EvaluateInputs, result: ReleaseResult) -> None:
        checkpoints = {
            cid: [[e.name, e.sha256] for e in self.store.manifest(cid)] for cid in result.checkpoint_ids
        }
        self.audit.append(
            "release",
            client=client,
            release_id=result.release_id,
            request_id=request.request_id,
            split=request.split,
            dp=self.budget is not None and request.split == FEEDBACK,
            release=request.release.to_json(),
            checkpoints=checkpoints,
            decoding=request.decoding.to_json(),
            values=list(result.values),
            domain_accuracy=[dict(d) for d in result.domain_accuracy],
            noise_std=result.noise_std,
            epsilon_this_release=result.epsilon_this_release,
            epsilon_spent_total=result.epsilon_spent_total,
        )
        self.metrics.count_release(dp=self.budget is not None and request.split == FEEDBACK)
        log_event(
            "released",
            client=client,
            release_id=result.release_id,
            split=request.split,
            checkpoint_ids=list(result.checkpoint_ids),
            epsilon_this_release=result.epsilon_this_release,
            epsilon_spent_total=result.epsilon_spent_total,
        )
