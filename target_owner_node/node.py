"""Assembling a node from its config, with every startup check in one place.

`open_node` refuses to start (raising `NodeStartupError` with the fix) when:
the held-out set is smaller than data.min_heldout_size; a test row's domain is not declared
in data.test_domains; privacy.delta is not below 1 / held-out size; the privacy ledger is
corrupt; the audit chain is broken; the ledger and the audit log disagree about the charges
(`ledger_audit`; the one allowed gap, the last charge unaudited after a crash, is repaired);
the state marker says the storage folder spent budget but neither file records a charge
(`state_marker`). The noise multiplier is calibrated here, from the config's privacy targets,
or read from the storage folder's calibration cache when those targets match (noise_cache.py).
"""

from __future__ import annotations

import functools
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from protocol.privacy.accountants import calibrate_noise_multiplier
from target_owner_node.audit import AuditChainError, AuditLog
from target_owner_node.budget import PrivacyBudget
from target_owner_node.checkpoint_store import CheckpointStore
from target_owner_node.config import OwnerConfig
from target_owner_node.evaluator import Scorer, WorkerScorer
from target_owner_node.heldout import HeldoutError, SplitFacts, split_facts
from target_owner_node.ledger import LEDGER_FILE, Ledger, LedgerCorruptError
from target_owner_node.ledger_audit import (
    REBUILD_COMMAND,
    VERIFY_COMMAND,
    AuditRecordError,
    Consistency,
    check_consistency,
    repair_last_charge,
)
from target_owner_node.logs import log_event
from target_owner_node.noise_cache import cached_noise_multiplier, cached_rows_per_query
from target_owner_node.release import ReleaseService
from target_owner_node.state_marker import (
    StateMarker,
    StateMarkerError,
    event_key,
    refuse_if_rolled_back,
    refuse_if_storage_lost,
)
from target_owner_node.worker import WorkerSpec

AUDIT_FILE = "audit.jsonl"


class NodeStartupError(RuntimeError):
    """The node cannot start safely; the message says what to fix."""


@dataclass
class OwnerNode:
    config: OwnerConfig
    facts: SplitFacts
    store: CheckpointStore
    audit: AuditLog
    budget: PrivacyBudget | None
    releases: ReleaseService
    scorer: Scorer

    @property
    def noise_multiplier(self) -> float:
        return self.budget.noise_multiplier if self.budget else 0.0

    def close(self) -> None:
        self.scorer.close()


@functools.lru_cache(maxsize=32)
def derived_noise_multiplier(
    epsilon: float, delta: float, sample_rate: float, releases: int, accountant: str
) -> float:
    """The noise multiplier z for which `releases` single-candidate releases spend `epsilon`
    (memoised in-process; across restarts noise_cache.py keeps it in the storage folder)."""
    return float(calibrate_noise_multiplier(epsilon, delta, sample_rate, releases, accountant=accountant))


def audit_path(config: OwnerConfig) -> Path:
    return config.storage.dir / AUDIT_FILE


def ledger_path(config: OwnerConfig) -> Path:
    return config.storage.dir / LEDGER_FILE


def served_test_path(config: OwnerConfig) -> Path | None:
    """The test split file, or None when the test split is not enabled (then it is never read)."""
    return config.data.test_path if config.data.test_split_enabled else None


def worker_spec(config: OwnerConfig) -> WorkerSpec:
    data, evaluation = config.data, config.evaluation
    rendering = data.rendering()
    return WorkerSpec(
        heldout_path=data.heldout_path,
        test_path=served_test_path(config),
        verifier=data.verifier,
        prompt_template=data.prompt_template,
        engine=evaluation.engine,
        device=evaluation.device,
        dtype=evaluation.dtype,
        batch_size=evaluation.batch_size,
        model_cache_size=evaluation.model_cache_size,
        max_prompt_tokens=evaluation.max_prompt_tokens,
        max_new_tokens=evaluation.max_new_tokens,
        max_samples_per_prompt=evaluation.max_samples_per_prompt,
        task_description=data.task_description,
        chat_template=rendering.chat_template,
        chat_format=rendering.chat_format,
        feedback_verifier=data.feedback_verifier or "",
        answer_template=data.answer_template,
        teacher_forcing=bool(evaluation.difference_metrics),
    )


def open_node(
    config: OwnerConfig, scorer: Scorer | None = None, random_source: object | None = None
) -> OwnerNode:
    """Check everything, then build the node. `scorer`/`random_source` are for tests."""
    data, privacy = config.data, config.privacy
    try:
        facts = split_facts(
            data.heldout_path, served_test_path(config), data.verifier, data.min_heldout_size, data.test_domains
        )
    except HeldoutError as error:
        raise NodeStartupError(str(error)) from None
    if privacy.enabled and privacy.delta >= 1.0 / facts.heldout_size:
        raise NodeStartupError(
            f"privacy.delta: must be below 1 / held-out size = {1.0 / facts.heldout_size:.3g}; got {privacy.delta:g}. "
            f"A delta that large allows releasing a whole row; use e.g. 1e-6."
        )
    config.storage.dir.mkdir(parents=True, exist_ok=True)
    try:
        audit = AuditLog(audit_path(config))
    except AuditChainError as error:
        raise NodeStartupError(str(error)) from None
    budget = None
    if privacy.enabled:
        try:
            ledger = Ledger(ledger_path(config))
        except LedgerCorruptError as error:
            raise NodeStartupError(str(error)) from None
        consistency = _check_ledger_against_audit(config, ledger, audit)
        marker = StateMarker(config.storage.state_marker_path, config.storage.dir)
        try:
            refuse_if_storage_lost(
                marker, ledger.path, audit.path, consistency.ledger_charges + consistency.audit_charges
            )
            refuse_if_rolled_back(marker, ledger.path, len(ledger.releases()), ledger_event_counts(ledger),
                                  str(config.config_path or "CONFIG"))
        except StateMarkerError as error:
            raise NodeStartupError(str(error)) from None
        usable_marker = _usable_marker(config, marker)
        z = cached_noise_multiplier(  # noise_cache.py: a restart with the same targets skips calibration
            config.storage.dir,
            privacy.epsilon_budget,
            privacy.delta,
            privacy.sample_rate,
            privacy.planned_releases,
            privacy.accountant,
            calibrate=derived_noise_multiplier,
        )
        try:
            budget = PrivacyBudget(privacy, z, ledger, audit, usable_marker)
        except StateMarkerError as error:
            raise NodeStartupError(str(error)) from None
    if scorer is None:
        sizes = {"feedback": facts.heldout_size, "test": facts.test_size}
        scorer = WorkerScorer(worker_spec(config), config.evaluation.timeout_s, sizes)
    store = CheckpointStore(
        config.storage.dir,
        config.storage.max_checkpoint_bytes,
        config.storage.quota_bytes,
        probe=getattr(scorer, "probe", None),
    )
    if hasattr(scorer, "file_digests"):
        scorer.file_digests = store.file_digests  # the worker applies only a candidate's changed files
    releases = ReleaseService(
        facts, store, scorer, audit, budget, random_source, min_response_s=config.evaluation.min_response_s
    )
    if budget is not None:  # noise_cache.py: a restart with the same public numbers skips scipy's import
        releases.known_rows_per_query = cached_rows_per_query(
            config.storage.dir, facts.heldout_size, privacy.sample_rate, privacy.row_cap_tail
        )
    return OwnerNode(config, facts, store, audit, budget, releases, scorer)


def _check_ledger_against_audit(config: OwnerConfig, ledger: Ledger, audit: AuditLog) -> Consistency:
    """Refuse to start unless both files hold the same charges; repair the one allowed gap."""
    shown = config.config_path or "CONFIG"
    try:
        consistency = check_consistency(ledger, audit.path)
    except AuditRecordError as error:
        raise NodeStartupError(f"{error}. Refusing to start; inspect it with "
                               f"`target-owner-node audit verify --config {shown}`.") from None
    if not consistency.ok:
        raise NodeStartupError(
            f"{consistency.describe()}\nRefusing to start: the privacy spend must never be undercounted. If the "
            f"ledger was lost or damaged, rebuild it from the audit log with `{REBUILD_COMMAND.format(config=shown)}` "
            f"(--force moves the present ledger aside, never deletes it); "
            f"`{VERIFY_COMMAND.format(config=shown)}` repeats this check."
        )
    if consistency.missing_last is not None:
        repair_last_charge(consistency, audit)
        log_event("audit_charge_recovered", release_id=consistency.missing_last.release_id)
    return consistency


def _usable_marker(config: OwnerConfig, marker: StateMarker) -> StateMarker | None:
    """The marker if it can be written (PrivacyBudget records the ledger's mark in it at once, so storage
    folders charged before marks existed are covered too)."""
    if not marker.writable():
        message = (
            f"the state marker {marker.path} cannot be written (its folder is missing or read-only); without it, "
            f"losing the whole storage folder {config.storage.dir}, or rolling it back to an older copy, would go "
            f"unnoticed and undercount the spend. Set storage.state_marker to a writable path outside storage.dir"
        )
        if config.storage.state_marker_explicit:
            raise NodeStartupError(message + ".")
        log_event("state_marker_unavailable", level="warning", message=message)
        return None
    return marker


def ledger_event_counts(ledger: Ledger) -> Counter:
    """state_marker.event_key -> count over the ledger's charges (what a high-water mark is compared with)."""
    counts: Counter = Counter()
    for release in ledger.releases():
        event = release.pending.event
        counts[event_key(event.noise_multiplier, event.sample_rate)] += event.count
    return counts
