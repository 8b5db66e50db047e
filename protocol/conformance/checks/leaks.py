"""Nothing held-out leaves the owner: canaries in no byte received, errors per contract, and
responses carrying only schema fields."""

from __future__ import annotations

import uuid

import grpc

from protocol.conformance.checkpoints import CheckpointFile, upload_messages, with_nonce
from protocol.conformance.checks.uploads import missing_file_data, wrong_sha256
from protocol.conformance.context import SuiteContext, is_service_failure
from protocol.conformance.registry import CheckSkipped, check, expect
from protocol.conformance.scan import canary_hits, error_contract_problems
from protocol.conformance.wire import undeclared_fields
from protocol.generated.target_feedback.v1 import target_feedback_pb2 as pb

RESPONSE_TYPES = {
    "GetInfo": pb.GetInfoResponse,
    "GetBudget": pb.GetBudgetResponse,
    "Evaluate": pb.EvaluateResponse,
    "UploadCheckpoint": pb.UploadCheckpointResponse,
}


def provoke_every_rpc(ctx: SuiteContext) -> int:
    """Call every RPC, mostly in ways that fail (bad ids, bad uploads, bad decoding); returns
    how many calls were made. Errors are expected and recorded by the interceptor. Done once
    per run: the checks that need it judge everything recorded since the run began."""
    if ctx.provoked:
        return 0
    ctx.provoked = True
    known = ctx.checkpoint_id()
    limits = ctx.info(refresh=True).decoding_limits
    ctx.budget()
    files = with_nonce(ctx.checkpoint_files(), uuid.uuid4().hex)
    evaluate_requests = [
        ctx.evaluate_request(["0" * 64]),
        ctx.evaluate_request([known, "f" * 64]),
        ctx.evaluate_request([]),
        ctx.evaluate_request([known], decoding=pb.DecodingSettings(max_new_tokens=limits.max_new_tokens + 1)),
        ctx.evaluate_request([known], decoding=pb.DecodingSettings(samples_per_prompt=limits.max_samples_per_prompt + 1)),
        ctx.evaluate_request([known], split=pb.SPLIT_TEST, decoding=pb.DecodingSettings(max_new_tokens=1)),
        ctx.evaluate_request([known], split=9),
        ctx.evaluate_request([known], request_id="../../\n<script>"),
    ]
    uploads = [
        upload_messages(files + [CheckpointFile("pytorch_model.bin", b"\x80\x02}q\x00.")]),
        upload_messages(files)[1:],
        wrong_sha256(files).messages,
        missing_file_data(files).messages,
        [],
    ]
    calls = 2
    for request in evaluate_requests:
        calls += 1
        try:
            ctx.evaluate(request)
        except grpc.RpcError:
            pass
    for messages in uploads:
        calls += 1
        try:
            ctx.upload(messages)
        except grpc.RpcError:
            pass
    if not ctx.dp_enabled or ctx.budget().releases_remaining_estimate >= 2:
        reused = ctx.evaluate_request([known])
        ctx.evaluate(reused)  # a successful release is scanned too
        conflicting = ctx.evaluate_request([known], request_id=reused.request_id, decoding=pb.DecodingSettings(
            max_new_tokens=1, samples_per_prompt=1, seed=12345))
        calls += 2
        try:
            ctx.evaluate(conflicting)  # same request_id, different request
        except grpc.RpcError:
            pass
    return calls


@check(
    "privacy.canaries.absent",
    title="No canary appears in any byte received, failing calls included",
    rationale="""The operator planted canary strings in held-out prompts and answers (--canaries). After provoking
    failures on every RPC (unknown ids, bad decoding, bad splits, conflicting request ids, pickle / truncated /
    mis-hashed uploads), every byte received during the whole run - serialized responses, error messages, error
    details (grpc-status-details-bin), initial and trailing metadata, refused mTLS connections - is searched for
    every canary (exact and case-insensitive).""",
    order=95,
)
def canaries_absent(ctx: SuiteContext) -> str:
    if not ctx.options.canaries:
        raise CheckSkipped("no --canaries given: plant canary strings in the held-out data and pass the file")
    calls = provoke_every_rpc(ctx)
    received = ctx.recorder.received_since()
    hits = canary_hits(ctx.options.canaries, received)
    expect(not hits, f"{len(hits)} canary hit(s): {'; '.join(sorted(set(hits))[:4])}")
    total = sum(len(r.data) for r in received)
    return (f"{len(ctx.options.canaries)} canaries absent from {len(received)} received parts ({total} bytes) "
            f"over {ctx.recorder.calls} calls ({calls} provoked here)")


@check(
    "rpc.errors.error_info",
    title="Every error carries exactly one ErrorInfo with a protocol reason under the right code",
    rationale="""Clients branch on ErrorInfo.reason (AIP-193), never on message text: every failed call of the
    feedback service seen in this run (after provoking failures on every RPC) must carry exactly one
    google.rpc.ErrorInfo in domain target-feedback.v1 whose reason is declared in protocol/errors.py and belongs
    with the status code (e.g. UNKNOWN_CHECKPOINT under INVALID_ARGUMENT), and the rich status must agree with
    the call's code and message.""",
    order=96,
)
def errors_carry_error_info(ctx: SuiteContext) -> str:
    provoke_every_rpc(ctx)
    failures = [f for f in ctx.recorder.failures_since() if is_service_failure(f)]
    problems = error_contract_problems(failures)
    unique = sorted(set(problems))
    expect(not unique, f"{len(unique)} error-contract problem(s): " + "; ".join(unique[:4]))
    reasons = sorted({f.reason for f in failures if f.reason})
    return f"{len(failures)} failures checked; reasons seen: {', '.join(reasons)}"


@check(
    "privacy.responses.schema_only",
    title="No response carries fields outside the v1 schema",
    rationale="""A field the client's schema does not declare is invisible to a parsed message but still on the wire -
    a side channel for per-example data. Every successful response received in this run is walked on the wire
    against the v1 descriptors, at every nesting level.""",
    order=97,
)
def responses_schema_only(ctx: SuiteContext) -> str:
    ctx.info(refresh=True)
    ctx.budget()
    problems, checked = [], 0
    for item in ctx.recorder.received_since():
        method, _, part = item.where.partition(" ")
        if part != "response" or method not in RESPONSE_TYPES:
            continue
        checked += 1
        for problem in undeclared_fields(item.data, RESPONSE_TYPES[method].DESCRIPTOR):
            problems.append(f"{method}: {problem}")
    expect(checked > 0, "no responses were recorded")
    expect(not problems, f"undeclared fields: {sorted(set(problems))[:4]}")
    return f"{checked} responses, no undeclared fields"
