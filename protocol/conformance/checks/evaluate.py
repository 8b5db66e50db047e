"""UploadCheckpoint and Evaluate: the happy paths and every documented refusal."""

from __future__ import annotations

import math
import re
import secrets
import uuid

import grpc

from protocol import errors
from protocol.conformance.checkpoints import checkpoint_id_for, upload_messages, with_nonce
from protocol.conformance.checks.info import close
from protocol.conformance.context import SuiteContext
from protocol.conformance.recorder import describe_failure
from protocol.conformance.registry import CheckSkipped, check, expect
from protocol.generated.target_feedback.v1 import target_feedback_pb2 as pb

INVALID = grpc.StatusCode.INVALID_ARGUMENT
SHA256_HEX = re.compile(r"^[0-9a-f]{64}$")
# Uploading max_candidates + 1 real checkpoints is cheap (they share one weights blob), up to a point.
MAX_CANDIDATES_TO_UPLOAD = 32


def random_checkpoint_id() -> str:
    return secrets.token_hex(32)


@check(
    "rpc.upload.contract",
    title="UploadCheckpoint returns the content address and reuses held files",
    rationale="""A checkpoint id is the sha256 of the canonical manifest (sorted [name, size, sha256] rows), so
    identical uploads share an id and the id commits to every byte. A fresh upload reports every byte received;
    repeating the manifest without any chunk must return the same id with every file listed as reused.""",
    order=30,
)
def upload_contract(ctx: SuiteContext) -> str:
    files = with_nonce(ctx.checkpoint_files(), uuid.uuid4().hex)
    manifest = [f.entry for f in files]
    first = ctx.upload(upload_messages(files))
    expected = checkpoint_id_for(manifest)
    expect(SHA256_HEX.match(first.checkpoint_id) is not None, f"checkpoint_id {first.checkpoint_id!r} is not 64 lowercase hex")
    expect(first.checkpoint_id == expected, f"checkpoint_id {first.checkpoint_id} != sha256 of the canonical manifest {expected}")
    total = sum(f.entry.size for f in files)
    expect(first.bytes_received == total, f"bytes_received {first.bytes_received} != {total} bytes sent")
    expect(not first.reused_files, f"a fresh upload reported reused files {list(first.reused_files)}")
    again = ctx.upload(upload_messages(files, send=set()))
    expect(again.checkpoint_id == first.checkpoint_id, "re-uploading the same manifest gave a different id")
    expect(sorted(again.reused_files) == sorted(f.name for f in files),
           f"manifest-only re-upload reused {sorted(again.reused_files)}, expected every file")
    expect(again.bytes_received == 0, f"manifest-only re-upload reports {again.bytes_received} bytes received")
    return f"id = sha256(manifest), {total} bytes, re-upload reused {len(again.reused_files)} files"


@check(
    "rpc.evaluate.contract",
    title="Evaluate returns one bounded result per candidate and accounts for it",
    rationale="""A release returns exactly the requested candidate with an accuracy in [0, 1], a release id and the
    privacy spend: the declared noise_std, epsilon_this_release > 0, spent + remaining = budget, and GetBudget
    moving by exactly one release and epsilon_this_release. The feedback split returns no per-domain breakdown
    (aggregates over the secret subsample only).""",
    order=31,
)
def evaluate_contract(ctx: SuiteContext) -> str:
    ctx.require_releases(1, "one release")
    checkpoint_id = ctx.checkpoint_id()
    before = ctx.budget()
    response = ctx.release([checkpoint_id])
    after = ctx.budget()
    expect(len(response.results) == 1, f"{len(response.results)} results for one candidate")
    result = response.results[0]
    expect(result.checkpoint_id == checkpoint_id, "the result names another checkpoint")
    expect(math.isfinite(result.accuracy) and 0 <= result.accuracy <= 1, f"accuracy {result.accuracy} outside [0, 1]")
    expect(not result.domain_accuracy, "the feedback split returned per-domain accuracies")
    expect(bool(response.release_id), "no release_id")
    spend, info = response.privacy, ctx.info()
    if not info.privacy.enabled:
        expect(spend.epsilon_this_release == 0 and spend.noise_std == 0, "DP disabled but the release reports a spend")
        expect(after.releases_made == before.releases_made, "DP disabled but releases_made moved")
        return f"exact accuracy {result.accuracy:.4f} (DP disabled)"
    problems = []
    if not close(spend.noise_std, info.privacy.noise_std):
        problems.append(f"noise_std {spend.noise_std:g} != declared {info.privacy.noise_std:g}")
    if not spend.epsilon_this_release > 0:
        problems.append(f"epsilon_this_release {spend.epsilon_this_release:g} is not > 0")
    if not close(spend.epsilon_spent_total + spend.epsilon_remaining, info.privacy.epsilon_budget, rel=1e-9, abs_=1e-9):
        problems.append("epsilon_spent_total + epsilon_remaining != epsilon_budget")
    if not close(spend.delta, info.privacy.delta):
        problems.append(f"delta {spend.delta:g} != declared {info.privacy.delta:g}")
    if after.releases_made != before.releases_made + 1:
        problems.append(f"releases_made {before.releases_made} -> {after.releases_made}, expected +1")
    if not close(after.epsilon_spent - before.epsilon_spent, spend.epsilon_this_release, rel=1e-6, abs_=1e-9):
        problems.append(f"GetBudget moved by {after.epsilon_spent - before.epsilon_spent:g}, "
                        f"the release says {spend.epsilon_this_release:g}")
    if not close(after.epsilon_spent, spend.epsilon_spent_total, rel=1e-9, abs_=1e-9):
        problems.append(f"GetBudget spent {after.epsilon_spent:g} != release's epsilon_spent_total {spend.epsilon_spent_total:g}")
    expect(not problems, "; ".join(problems))
    return f"accuracy {result.accuracy:.4f}, epsilon {spend.epsilon_this_release:.4g} this release"


@check(
    "rpc.evaluate.multi_candidate",
    title="A multi-candidate Evaluate is one release with results in request order",
    rationale="""Candidates of one query are scored on the same secret subsample (paired comparison) and released
    together: one release (releases_made + 1), one result per candidate in the order requested. Comparing k
    candidates costs about k single releases of budget (more under RDP when the noise is small); if the server
    refuses it for budget, the check is skipped.""",
    order=32,
)
def evaluate_multi_candidate(ctx: SuiteContext) -> str:
    ctx.require_releases(4, "a two-candidate release")
    ids = [ctx.checkpoint_id(1), ctx.checkpoint_id(0)]
    before = ctx.budget()
    try:
        response = ctx.release(ids)
    except grpc.RpcError as error:
        failure = describe_failure("Evaluate", error)
        if failure.code == grpc.StatusCode.RESOURCE_EXHAUSTED and failure.reason in (
                errors.PRIVACY_BUDGET_EXHAUSTED, errors.CLIENT_BUDGET_EXHAUSTED):
            raise CheckSkipped(f"the remaining budget does not cover a two-candidate release ({failure.reason})") from None
        raise
    after = ctx.budget()
    got = [r.checkpoint_id for r in response.results]
    expect(got == ids, f"results for {got}, requested {ids}")
    expect(all(math.isfinite(r.accuracy) and 0 <= r.accuracy <= 1 for r in response.results), "an accuracy outside [0, 1]")
    if ctx.dp_enabled:
        expect(after.releases_made == before.releases_made + 1,
               f"releases_made {before.releases_made} -> {after.releases_made}, expected one release")
        expect(response.privacy.epsilon_this_release > 0, "no epsilon charged for a two-candidate release")
    return f"2 candidates, epsilon {response.privacy.epsilon_this_release:.4g}"


@check(
    "rpc.evaluate.unknown_checkpoint",
    title="Evaluate of an unknown checkpoint id: INVALID_ARGUMENT / UNKNOWN_CHECKPOINT, nothing charged",
    rationale="""An id the owner does not hold must be refused before anything is evaluated or charged, also when it
    sits beside a valid id, and also when it is not even shaped like a sha256.""",
    order=33,
)
def evaluate_unknown_checkpoint(ctx: SuiteContext) -> str:
    known = ctx.checkpoint_id()
    with ctx.budget_unchanged("refused Evaluate calls"):
        ctx.expect_error(lambda: ctx.evaluate(ctx.evaluate_request([random_checkpoint_id()])),
                         INVALID, errors.UNKNOWN_CHECKPOINT, "Evaluate of a random sha256 id")
        ctx.expect_error(lambda: ctx.evaluate(ctx.evaluate_request([known, random_checkpoint_id()])),
                         INVALID, errors.UNKNOWN_CHECKPOINT, "Evaluate of [known, unknown]")
        ctx.expect_error(lambda: ctx.evaluate(ctx.evaluate_request(["../../etc/passwd"])),
                         INVALID, None, "Evaluate of a non-hex id")
    return "refused with UNKNOWN_CHECKPOINT, budget unchanged"


@check(
    "rpc.evaluate.decoding_out_of_limits",
    title="Decoding above the declared limits: INVALID_ARGUMENT / DECODING_OUT_OF_LIMITS",
    rationale="""GetInfo declares max_new_tokens and max_samples_per_prompt; a request above them (or negative, or a
    negative temperature) must be refused before any compute or budget is spent.""",
    order=34,
)
def evaluate_decoding_limits(ctx: SuiteContext) -> str:
    limits, known = ctx.info().decoding_limits, ctx.checkpoint_id()
    cases = {
        "max_new_tokens above the limit": pb.DecodingSettings(max_new_tokens=limits.max_new_tokens + 1, samples_per_prompt=1),
        "samples_per_prompt above the limit": pb.DecodingSettings(max_new_tokens=1, samples_per_prompt=limits.max_samples_per_prompt + 1),
    }
    with ctx.budget_unchanged("refused Evaluate calls"):
        for what, decoding in cases.items():
            ctx.expect_error(lambda d=decoding: ctx.evaluate(ctx.evaluate_request([known], decoding=d)),
                             INVALID, errors.DECODING_OUT_OF_LIMITS, what)
        for what, decoding in {
            "negative max_new_tokens": pb.DecodingSettings(max_new_tokens=-1, samples_per_prompt=1),
            "negative temperature": pb.DecodingSettings(max_new_tokens=1, samples_per_prompt=1, temperature=-1.0),
        }.items():
            ctx.expect_error(lambda d=decoding: ctx.evaluate(ctx.evaluate_request([known], decoding=d)), INVALID, None, what)
    return "4 out-of-limit decodings refused, budget unchanged"


@check(
    "rpc.evaluate.too_many_candidates",
    title="More candidates than max_candidates_per_query: INVALID_ARGUMENT",
    rationale="""The candidate count bounds per-query compute and the privacy cost of one release. The suite uploads
    max_candidates_per_query + 1 distinct valid checkpoints (sharing one weights blob), so the count is the only
    thing wrong with the request.""",
    order=35,
)
def evaluate_too_many_candidates(ctx: SuiteContext) -> str:
    limit = ctx.info().decoding_limits.max_candidates_per_query
    if limit + 1 > MAX_CANDIDATES_TO_UPLOAD:
        raise CheckSkipped(f"max_candidates_per_query={limit}: uploading {limit + 1} checkpoints is too slow for the suite")
    base, nonce = ctx.checkpoint_files(), uuid.uuid4().hex
    ids = [ctx.upload(upload_messages(with_nonce(base, f"{nonce}-{i}"))).checkpoint_id for i in range(limit + 1)]
    with ctx.budget_unchanged("a refused Evaluate"):
        failure = ctx.expect_error(lambda: ctx.evaluate(ctx.evaluate_request(ids)), INVALID, None,
                                   f"Evaluate with {limit + 1} candidates")
    return f"{limit + 1} valid candidates refused ({failure.reason})"


@check(
    "rpc.evaluate.empty_candidates",
    title="Evaluate with no checkpoint ids: INVALID_ARGUMENT",
    rationale="An empty candidate list is a malformed request; it must be refused without a release.",
    order=36,
)
def evaluate_empty(ctx: SuiteContext) -> str:
    with ctx.budget_unchanged("a refused Evaluate"):
        failure = ctx.expect_error(lambda: ctx.evaluate(ctx.evaluate_request([])), INVALID, None, "Evaluate of []")
    return f"refused ({failure.reason})"


@check(
    "rpc.evaluate.split",
    title="Split handling: test split refused when disabled, exact when enabled; unknown split refused",
    rationale="""SPLIT_TEST is served only when GetInfo says test_split_enabled; otherwise INVALID_ARGUMENT /
    TEST_SPLIT_DISABLED. When served it is exact (two identical requests give identical values) with per-domain
    accuracies in [0, 1]. An undefined split value is INVALID_ARGUMENT.""",
    order=37,
)
def evaluate_split(ctx: SuiteContext) -> str:
    info, known = ctx.info(), ctx.checkpoint_id()
    with ctx.budget_unchanged("refused Evaluate calls"):
        ctx.expect_error(lambda: ctx.evaluate(ctx.evaluate_request([known], split=7)), INVALID, None, "Evaluate with split=7")
    if not info.test_split_enabled:
        with ctx.budget_unchanged("a refused test-split Evaluate"):
            ctx.expect_error(lambda: ctx.evaluate(ctx.evaluate_request([known], split=pb.SPLIT_TEST)),
                             INVALID, errors.TEST_SPLIT_DISABLED, "Evaluate of the disabled test split")
        return "test split disabled and refused"
    # The test split is evaluated whole, twice: one new token keeps that cheap.
    decoding = pb.DecodingSettings(max_new_tokens=1, samples_per_prompt=1, temperature=0.0, seed=0)
    first = ctx.evaluate(ctx.evaluate_request([known], split=pb.SPLIT_TEST, decoding=decoding))
    second = ctx.evaluate(ctx.evaluate_request([known], split=pb.SPLIT_TEST, decoding=decoding))
    expect(len(first.results) == 1, f"{len(first.results)} results for one candidate")
    a, b = first.results[0], second.results[0]
    expect(0 <= a.accuracy <= 1, f"test accuracy {a.accuracy} outside [0, 1]")
    expect(a.accuracy == b.accuracy, f"test split is not exact: {a.accuracy} then {b.accuracy}")
    expect(all(0 <= v <= 1 for v in a.domain_accuracy.values()), "a domain accuracy outside [0, 1]")
    return f"test accuracy {a.accuracy:.4f} over {info.test_size} rows, {len(a.domain_accuracy)} domains"


SEED_LIMIT = 2**63   # engines take seeds in [0, 2**63); the wire field is uint64


def _short_context_files(ctx: SuiteContext, positions: int) -> list:
    """The suite's checkpoint with a context of only `positions` tokens (prompt + completion)."""
    from protocol.conformance.checkpoints import edit_json

    def shorten(config: dict) -> None:
        config["max_position_embeddings"] = positions

    def shorten_tokenizer(config: dict) -> None:
        config["model_max_length"] = positions

    files = with_nonce(ctx.checkpoint_files(), uuid.uuid4().hex)
    return edit_json(edit_json(files, "config.json", shorten), "tokenizer_config.json", shorten_tokenizer)


def charge_moved(before: pb.GetBudgetResponse, after: pb.GetBudgetResponse) -> str:
    """'' when nothing was charged, else how the budget moved."""
    if (after.epsilon_spent, after.releases_made) == (before.epsilon_spent, before.releases_made):
        return ""
    return (f" after charging the budget (epsilon spent {before.epsilon_spent:.6g} -> {after.epsilon_spent:.6g}, "
            f"releases {before.releases_made} -> {after.releases_made})")


def refused_before_charge(ctx: SuiteContext, what: str, request: pb.EvaluateRequest,
                          reason: str | None = None, allow_success: bool = False) -> str:
    """`request` must be refused with INVALID_ARGUMENT (and `reason`) and leave the budget unchanged;
    with `allow_success` it may instead be evaluated. Returns the outcome in a few words."""
    before = ctx.budget()
    try:
        ctx.evaluate(request)
    except grpc.RpcError as error:
        failure = describe_failure("Evaluate", error)
    else:
        expect(allow_success, f"{what}: evaluated{charge_moved(before, ctx.budget())}; expected INVALID_ARGUMENT "
                              "before any charge")
        return "evaluated"
    charged = charge_moved(before, ctx.budget())
    expect(failure.code == INVALID and not charged and (reason is None or failure.reason == reason),
           f"{what}: ended {failure.code.name} {failure.reason or '(no ErrorInfo)'}{charged}; expected INVALID_ARGUMENT"
           f"{' / ' + reason if reason else ''} before any charge: the request can never be evaluated")
    return f"refused ({failure.reason})"


def _short_context_case(ctx: SuiteContext) -> str:
    """A checkpoint whose context cannot hold a prompt plus max_new_tokens: refused at upload, refused
    before the charge, or evaluated - never charged and then failed."""
    new_tokens = min(8, ctx.info().decoding_limits.max_new_tokens)
    what = f"a checkpoint with a {new_tokens}-token context and max_new_tokens={new_tokens}"
    try:
        checkpoint_id = ctx.upload(upload_messages(_short_context_files(ctx, new_tokens))).checkpoint_id
    except grpc.RpcError as error:
        failure = describe_failure("UploadCheckpoint", error)
        expect(failure.code == INVALID, f"uploading {what}: {failure.code.name} {failure.reason}, expected "
                                        "INVALID_ARGUMENT")
        return f"{what}: refused at upload"
    decoding = pb.DecodingSettings(max_new_tokens=new_tokens, samples_per_prompt=1, temperature=0.0, seed=1)
    return f"{what}: " + refused_before_charge(ctx, what, ctx.evaluate_request([checkpoint_id], decoding=decoding),
                                               allow_success=True)


@check(
    "evaluate.refuse.charge_then_fail",
    title="Requests that can never be evaluated are refused before the charge (INVALID_ARGUMENT, budget unchanged)",
    rationale="""A request that passes validation and is charged must not then fail for a reason knowable before
    the charge: it would spend budget, leave a pending ledger entry and fail again on every retry. A seed of 2**63
    and 2**64-1 (the wire field is uint64, engines take [0, 2**63)), a checkpoint id never uploaded and a NaN or
    infinite temperature must each be refused with INVALID_ARGUMENT with GetBudget's epsilon_spent and
    releases_made unchanged. A checkpoint whose context (8 tokens) cannot hold a prompt plus max_new_tokens must
    be refused at upload, refused before the charge, or evaluated.""",
    order=38,
)
def evaluate_charge_then_fail(ctx: SuiteContext) -> str:
    known = ctx.checkpoint_id()
    cases = {
        "decoding.seed = 2**63": pb.DecodingSettings(max_new_tokens=1, samples_per_prompt=1, seed=SEED_LIMIT),
        "decoding.seed = 2**64-1": pb.DecodingSettings(max_new_tokens=1, samples_per_prompt=1, seed=2**64 - 1),
        "decoding.temperature = nan": pb.DecodingSettings(max_new_tokens=1, samples_per_prompt=1,
                                                          temperature=float("nan")),
        "decoding.temperature = inf": pb.DecodingSettings(max_new_tokens=1, samples_per_prompt=1,
                                                          temperature=float("inf")),
    }
    for what, decoding in cases.items():
        refused_before_charge(ctx, what, ctx.evaluate_request([known], decoding=decoding))
    refused_before_charge(ctx, "a checkpoint id never uploaded", ctx.evaluate_request([random_checkpoint_id()]),
                          errors.UNKNOWN_CHECKPOINT)
    ctx.require_releases(2, "the short-context case")
    short = _short_context_case(ctx)
    return f"{len(cases) + 1} requests refused with the budget unchanged; {short}"
