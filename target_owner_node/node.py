"""Assembling a node from its config, with every startup check in one place.

`open_node` refuses to start (raising `NodeStartupError` with the fix) when:
the held-out set is smaller than data.min_heldout_size; privacy.delta is not below
1 / held-out size; the privacy ledger is corrupt; the audit chain is broken.
The noise multiplier is calibrated here, from the config's privacy targets.
"""

from __future__ import annotations

import functools
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
from target_owner_node.release import ReleaseService
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
    """The noise multiplier z for which `releases` single-candidate releases spend `epsilon`."""
    return float(calibrate_noise_multiplier(epsilon, delta, sample_rate, releases, accountant=accountant))


def audit_path(config: OwnerConfig) -> Path:
    return config.storage.dir / AUDIT_FILE


def worker_spec(config: OwnerConfig) -> WorkerSpec:
    data, evaluation = config.data, config.evaluation
    return WorkerSpec(
        heldout_path=data.heldout_path,
        test_path=data.test_path,
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
    )


def open_node(
    config: OwnerConfig, scorer: Scorer | None = None, random_source: object | None = None
) -> OwnerNode:
    """Check everything, then build the node. `scorer`/`random_source` are for tests."""
    data, privacy = config.data, config.privacy
    try:
        facts = split_facts(data.heldout_path, data.test_path, data.verifier, data.min_heldout_size)
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
            ledger = Ledger(config.storage.dir / LEDGER_FILE)
        except LedgerCorruptError as error:
            raise NodeStartupError(str(error)) from None
        z = derived_noise_multiplier(
            privacy.epsilon_budget,
            privacy.delta,
            privacy.sample_rate,
            privacy.planned_releases,
            privacy.accountant,
        )
        budget = PrivacyBudget(privacy, z, ledger)
    if scorer is None:
        sizes = {"feedback": facts.heldout_size, "test": facts.test_size}
        scorer = WorkerScorer(worker_spec(config), config.evaluation.timeout_s, sizes)
    store = CheckpointStore(
        config.storage.dir,
        config.storage.max_checkpoint_bytes,
        config.storage.quota_bytes,
        probe=getattr(scorer, "probe", None),
    )
    releases = ReleaseService(
        facts, store, scorer, audit, budget, random_source, min_response_s=config.evaluation.min_response_s
    )
    return OwnerNode(config, facts, store, audit, budget, releases, scorer)
