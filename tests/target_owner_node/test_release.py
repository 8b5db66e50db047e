"""Releases without gRPC: noise calibration, budget, idempotency, crash recovery, concurrency.

A FakeScorer gives every row of a checkpoint the same score, so a release's only randomness
is the subsample and the noise (SeededRandom makes them reproducible).
"""

from __future__ import annotations

import base64
import threading

import grpc
import numpy as np
import pytest

from protocol import errors
from protocol.errors import ProtocolError
from protocol.privacy.accountants import build_accountant
from protocol.privacy.events import SampledGaussianEvent
from protocol.privacy.mechanisms import SeededRandom, replay_release
from target_owner_node.evaluate_request import FEEDBACK, TEST, Decoding, EvaluateInputs
from target_owner_node.ledger import LEDGER_FILE
from target_owner_node.node import open_node

from .conftest import HELDOUT_SIZE, FakeScorer, make_config, read_jsonl, upload_messages

DECODING = Decoding(max_new_tokens=4, samples_per_prompt=1, temperature=0.0, seed=1)


def request(ids, request_id="", split=FEEDBACK) -> EvaluateInputs:
    return EvaluateInputs(tuple(ids), DECODING, split, request_id)


@pytest.fixture()
def node_factory(tmp_path, data_dir, pki, tiny_checkpoint):
    """open_node(config) on one storage folder; reopening it simulates a restart."""
    opened = []

    def open_(privacy=None, scorer=None, seed=0, **sections):
        config = make_config(tmp_path, data_dir, pki, privacy=privacy or {}, **sections)
        node = open_node(config, scorer=scorer or FakeScorer(), random_source=SeededRandom(seed))
        opened.append(node)
        return node

    yield open_
    for node in opened:
        node.close()


def _upload(node, tiny_checkpoint) -> str:
    return node.store.receive(upload_messages(tiny_checkpoint)).checkpoint_id


def _second_checkpoint(node, tiny_checkpoint, tmp_path) -> str:
    import shutil

    other = tmp_path / "other"
    shutil.copytree(tiny_checkpoint, other)
    (other / "generation_config.json").write_text('{"do_sample": false}')
    return node.store.receive(upload_messages(other)).checkpoint_id


def test_noise_std_matches_calibration_and_budget_ends_on_time(node_factory, tiny_checkpoint):
    """q = 1: released = true mean + N(0, z/N). `planned_releases` releases fit; one more does not."""
    planned = 150
    node = node_factory(privacy={"sample_rate": 1.0, "planned_releases": planned, "epsilon_budget": 2.0})
    cid = _upload(node, tiny_checkpoint)
    z = node.noise_multiplier
    values = np.array([node.releases.evaluate("trainer", request([cid])).values[0] for _ in range(planned)])
    expected_std = z / HELDOUT_SIZE
    errors_ = values - 0.5
    assert abs(errors_.mean()) < 4 * expected_std / np.sqrt(planned)
    # chi-square bounds on the sample variance (about 4 sigma for 150 draws)
    ratio = errors_.var(ddof=1) / expected_std**2
    assert 0.55 < ratio < 1.5, ratio
    with pytest.raises(ProtocolError) as caught:
        node.releases.evaluate("trainer", request([cid]))
    assert caught.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert caught.value.reason == errors.PRIVACY_BUDGET_EXHAUSTED
    assert float(caught.value.metadata["limit"]) == 2.0
    assert float(caught.value.metadata["spent"]) <= 2.0 + 1e-9


def test_subsampled_release_divides_the_subsample_sum_by_the_public_expected_size(
    node_factory, tiny_checkpoint
):
    """q < 1: each release scores a fresh Poisson subsample of size m (secret) and releases
    clip((score * m + noise) / (q N)); m itself never appears in the response. The scorer
    always sees the public rows_per_query rows: the m sampled ones first, then padding."""
    from protocol.privacy.mechanisms import rows_per_query

    q, score = 0.2, 0.5
    node = node_factory(privacy={"sample_rate": q, "planned_releases": 100, "epsilon_budget": 3.0})
    cid = _upload(node, tiny_checkpoint)
    values = [node.releases.evaluate("trainer", request([cid])).values[0] for _ in range(4)]
    entries = [e for e in read_jsonl(node.config.storage.dir / LEDGER_FILE) if e["type"] == "pending"]
    masks = [
        np.unpackbits(np.frombuffer(base64.b64decode(e["mask_b64"]), np.uint8))[:HELDOUT_SIZE].astype(bool)
        for e in entries
    ]
    sizes = [int(m.sum()) for m in masks]
    rows = rows_per_query(HELDOUT_SIZE, q, node.config.privacy.row_cap_tail)
    assert node.releases.rows_per_query == rows and rows < HELDOUT_SIZE
    assert [call[2] for call in node.scorer.calls] == [rows] * 4, "every query evaluates the same public count"
    for seen, mask in zip(node.scorer.rows, masks):
        assert list(seen[: mask.sum()]) == list(np.flatnonzero(mask)), "the sampled rows come first"
        assert ((0 <= seen) & (seen < HELDOUT_SIZE)).all(), "padding rows are real held-out rows"
    assert len({m.tobytes() for m in masks}) == 4, "every release draws a fresh subsample"
    assert all(0 < size < HELDOUT_SIZE for size in sizes)
    for value, size, entry in zip(values, sizes, entries):
        assert entry["expected_size"] == pytest.approx(q * HELDOUT_SIZE)
        expected = np.clip((score * size + entry["noise_draws"][0]) / (q * HELDOUT_SIZE), 0, 1)
        assert value == pytest.approx(expected), "padding scores are discarded"
    assert node.releases.noise_std == pytest.approx(node.noise_multiplier / (q * HELDOUT_SIZE))


def test_scorer_work_does_not_depend_on_the_subsample_size(node_factory, tiny_checkpoint):
    """Whatever the secret subsample size, the scorer is asked for exactly rows_per_query rows."""
    node = node_factory(privacy={"sample_rate": 0.3, "planned_releases": 100, "epsilon_budget": 8.0})
    cid = _upload(node, tiny_checkpoint)
    for _ in range(12):
        node.releases.evaluate("trainer", request([cid]))
    masks = [e["mask_b64"] for e in read_jsonl(node.config.storage.dir / LEDGER_FILE) if e["type"] == "pending"]
    assert len(set(masks)) == 12
    assert {call[2] for call in node.scorer.calls} == {node.releases.rows_per_query}


def test_a_subsample_above_the_cap_is_cut_to_a_random_subset_of_the_public_size():
    from protocol.privacy.mechanisms import cap_subsample, capped_poisson_mask, rows_per_query

    source = SeededRandom(3)
    kept = cap_subsample(np.arange(50), 10, source)
    assert len(kept) == 10 and len(set(kept.tolist())) == 10 and list(kept) == sorted(kept)
    assert list(cap_subsample(np.arange(5), 10, source)) == list(range(5))
    mask = capped_poisson_mask(100, 0.9, 20, source)
    assert mask.sum() == 20
    assert rows_per_query(100, 1.0, 1e-10) == 100
    # P(Binomial(2000, 0.1) > M) <= tail, and M - 1 would not do.
    from scipy.stats import binom

    m = rows_per_query(2000, 0.1, 1e-10)
    assert binom.sf(m, 2000, 0.1) <= 1e-10 < binom.sf(m - 1, 2000, 0.1)


def test_every_post_charge_failure_is_one_fixed_error_and_the_charge_stays(node_factory, tiny_checkpoint):
    """A failure no row explains (worker crash, timeout, model error) gives one fixed error: the
    kind of failure must not depend on the rows. The charge stays; a retry costs nothing."""
    node = node_factory()
    cid = _upload(node, tiny_checkpoint)
    messages = set()
    for i, failure in enumerate(
        [ValueError("x"), RuntimeError("y"), ProtocolError(grpc.StatusCode.INTERNAL, "EVALUATION_FAILED", "z")]
    ):
        node.scorer.fail_next = failure
        spent = node.budget.spent()
        with pytest.raises(ProtocolError) as caught:
            node.releases.evaluate("trainer", request([cid], f"fail-{i}"))
        assert node.budget.spent() > spent, "the charge stands"
        messages.add((caught.value.code, caught.value.reason, caught.value.message))
        spent = node.budget.spent()
        node.releases.evaluate("trainer", request([cid], f"fail-{i}"))  # the retry replays for free
        assert node.budget.spent() == spent
        if node.budget.remaining() < 0.35:
            break
    assert len(messages) == 1
    ((code, reason, _),) = messages
    assert code == grpc.StatusCode.UNAVAILABLE and reason == errors.EVALUATION_FAILED


def test_min_response_s_holds_a_dp_reply(node_factory, tiny_checkpoint):
    import time

    node = node_factory(evaluation={"min_response_s": 0.4})
    cid = _upload(node, tiny_checkpoint)
    started = time.monotonic()
    node.releases.evaluate("trainer", request([cid]))
    assert time.monotonic() - started >= 0.4


def test_request_lock_table_does_not_grow(node_factory, tiny_checkpoint):
    import gc

    node = node_factory()
    cid = _upload(node, tiny_checkpoint)
    for i in range(8):
        node.releases.evaluate("trainer", request([cid], f"req-{i}"))
    gc.collect()
    assert len(node.releases._request_locks) == 0


def test_idempotent_retry_returns_the_recorded_release(node_factory, tiny_checkpoint):
    node = node_factory()
    cid = _upload(node, tiny_checkpoint)
    first = node.releases.evaluate("trainer", request([cid], "req-1"))
    spent = node.budget.spent()
    again = node.releases.evaluate("trainer", request([cid], "req-1"))
    assert again == first and node.budget.spent() == spent and node.budget.releases_made == 1
    # the same id from ANOTHER client is another request
    other = node.releases.evaluate("someone-else", request([cid], "req-1"))
    assert other.release_id != first.release_id and node.budget.releases_made == 2
    # reusing an id for a different request is refused, not silently replayed
    changed = EvaluateInputs((cid,), Decoding(4, 2, 0.0, 1), FEEDBACK, "req-1")
    with pytest.raises(ProtocolError) as caught:
        node.releases.evaluate("trainer", changed)
    assert caught.value.reason == errors.INVALID_REQUEST


def test_budget_exhaustion_survives_restart_and_refusals_spend_nothing(node_factory, tiny_checkpoint):
    privacy = {"planned_releases": 2, "epsilon_budget": 1.0}
    node = node_factory(privacy=privacy)
    cid = _upload(node, tiny_checkpoint)
    for _ in range(2):
        node.releases.evaluate("trainer", request([cid]))
    with pytest.raises(ProtocolError):
        node.releases.evaluate("trainer", request([cid]))
    ledger_path = node.config.storage.dir / LEDGER_FILE
    lines = ledger_path.read_text()
    spent = node.budget.spent()
    node.close()
    restarted = node_factory(privacy=privacy, seed=5)
    assert restarted.budget.spent() == pytest.approx(spent) and restarted.budget.releases_made == 2
    with pytest.raises(ProtocolError) as caught:
        restarted.releases.evaluate("trainer", request([cid]))
    assert caught.value.reason == errors.PRIVACY_BUDGET_EXHAUSTED
    assert ledger_path.read_text() == lines, "a refused release wrote to the ledger"


def test_crash_mid_evaluation_counts_and_retry_replays_the_same_release(node_factory, tiny_checkpoint):
    scorer = FakeScorer(default=0.25)
    node = node_factory(scorer=scorer)
    cid = _upload(node, tiny_checkpoint)
    scorer.fail_next = ProtocolError(grpc.StatusCode.UNAVAILABLE, errors.EVALUATION_FAILED, "worker crashed")
    with pytest.raises(ProtocolError):
        node.releases.evaluate("trainer", request([cid], "req-crash"))
    spent = node.budget.spent()
    assert spent > 0, "a charged release must count even though it was never completed"
    pending = read_jsonl(node.config.storage.dir / LEDGER_FILE)
    assert [e["type"] for e in pending] == ["pending"]
    node.close()

    restarted = node_factory(scorer=FakeScorer(default=0.25), seed=99)  # different randomness
    assert restarted.budget.spent() == pytest.approx(spent)
    result = restarted.releases.evaluate("trainer", request([cid], "req-crash"))
    assert restarted.budget.spent() == pytest.approx(spent) and restarted.budget.releases_made == 1
    entry = pending[0]
    kept = int(
        np.unpackbits(np.frombuffer(base64.b64decode(entry["mask_b64"]), np.uint8))[:HELDOUT_SIZE].sum()
    )
    expected = replay_release(
        np.full((1, kept), 0.25), entry["expected_size"], np.array(entry["noise_draws"])
    )
    assert result.values[0] == pytest.approx(float(np.asarray(expected).reshape(-1)[0]))
    assert restarted.scorer.calls[-1][2] == kept, "the retry must use the stored subsample"


def test_concurrent_clients_cannot_overspend(node_factory, tiny_checkpoint):
    node = node_factory(privacy={"planned_releases": 3, "epsilon_budget": 1.0})
    cid = _upload(node, tiny_checkpoint)
    outcomes: list[str] = []
    lock = threading.Lock()

    def client(i: int) -> None:
        try:
            node.releases.evaluate(f"client-{i}", request([cid], f"r{i}"))
            outcome = "ok"
        except ProtocolError as error:
            outcome = error.reason
        with lock:
            outcomes.append(outcome)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert outcomes.count("ok") == 3 and outcomes.count(errors.PRIVACY_BUDGET_EXHAUSTED) == 5
    assert node.budget.spent() <= 1.0 + 1e-9 and node.budget.releases_made == 3


def test_per_client_cap(node_factory, tiny_checkpoint):
    node = node_factory(privacy={"planned_releases": 4, "epsilon_budget": 2.0, "per_client_epsilon_cap": 1.0})
    cid = _upload(node, tiny_checkpoint)
    node.releases.evaluate("alice", request([cid]))
    with pytest.raises(ProtocolError) as caught:
        for _ in range(4):
            node.releases.evaluate("alice", request([cid]))
    assert caught.value.reason == errors.CLIENT_BUDGET_EXHAUSTED
    assert caught.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert float(caught.value.metadata["limit"]) == 1.0
    assert node.budget.client_spent("alice") <= 1.0 + 1e-9
    node.releases.evaluate("bob", request([cid]))  # bob has his own allowance


def test_several_candidates_share_one_subsample_and_pay_for_each(node_factory, tiny_checkpoint, tmp_path):
    scorer = FakeScorer()
    node = node_factory(scorer=scorer, privacy={"planned_releases": 50, "epsilon_budget": 4.0})
    a = _upload(node, tiny_checkpoint)
    b = _second_checkpoint(node, tiny_checkpoint, tmp_path)
    scorer.values = {a: 0.2, b: 0.8}
    pair = node.releases.evaluate("trainer", request([a, b]))
    single = node.releases.evaluate("trainer", request([a]))
    assert scorer.calls[0][1] == (a, b), "both candidates are scored in one call (one subsample)"
    assert pair.noise_std == single.noise_std, "the noise std per released accuracy is constant"
    # One 2-candidate release (multiplier z / sqrt 2) costs what two single releases cost.
    twice = build_accountant("rdp")
    twice.compose(SampledGaussianEvent(node.noise_multiplier, 1.0, 2))
    assert pair.epsilon_this_release == pytest.approx(twice.get_epsilon(node.config.privacy.delta), rel=1e-6)
    events = [e["event"] for e in read_jsonl(node.config.storage.dir / LEDGER_FILE) if e["type"] == "pending"]
    assert events[0]["noise_multiplier"] == pytest.approx(node.noise_multiplier / np.sqrt(2))


def test_without_dp_release_is_exact_and_uncharged(node_factory, tiny_checkpoint):
    node = node_factory(privacy={"enabled": False})
    cid = _upload(node, tiny_checkpoint)
    result = node.releases.evaluate("trainer", request([cid]))
    assert result.values == (0.5,) and result.epsilon_this_release == 0 and result.noise_std == 0
    assert node.scorer.calls[-1][2] == HELDOUT_SIZE
    assert not (node.config.storage.dir / LEDGER_FILE).exists()


def test_test_split_is_exact_per_domain_and_not_charged(node_factory, tiny_checkpoint):
    node = node_factory()
    cid = _upload(node, tiny_checkpoint)
    result = node.releases.evaluate("trainer", request([cid], split=TEST))
    assert result.values == (0.5,) and result.domain_accuracy == ({"easy": 0.5, "hard": 0.5},)
    assert node.budget.spent() == 0 and node.budget.releases_made == 0
    audit = read_jsonl(node.config.storage.dir / "audit.jsonl")
    assert audit[-1]["event"] == "release" and audit[-1]["split"] == TEST


def test_the_release_is_built_from_the_pure_mechanisms(node_factory, tiny_checkpoint, monkeypatch):
    """The mechanism that is tested (protocol/privacy/mechanisms.py) is the mechanism that runs:
    the owner draws the subsample and the noise, and computes the value, through those functions."""
    import target_owner_node.release as release
    from protocol.privacy import mechanisms

    used = []

    def spy(name):
        real = getattr(mechanisms, name)

        def call(*args, **kwargs):
            used.append(name)
            return real(*args, **kwargs)

        monkeypatch.setattr(release, name, call)

    for name in ("capped_poisson_mask", "gaussian_noise", "replay_release"):
        spy(name)
    node = node_factory(privacy={"sample_rate": 0.5, "planned_releases": 50, "epsilon_budget": 4.0})
    node.releases.evaluate("trainer", request([_upload(node, tiny_checkpoint)]))
    assert used == ["capped_poisson_mask", "gaussian_noise", "replay_release"]
