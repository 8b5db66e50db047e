"""Health service and deadlines: the server answers promptly and keeps serving."""

from __future__ import annotations

import threading
import time
import uuid

import grpc

from protocol.conformance.checkpoints import upload_messages, with_nonce
from protocol.conformance.connection import SERVICE_NAME
from protocol.conformance.context import SuiteContext
from protocol.conformance.recorder import describe_failure
from protocol.conformance.registry import check, expect
from protocol.generated.target_feedback.v1 import target_feedback_pb2 as pb

PROMPT_S = 2.0  # "promptly": a deadline must be reported within this much of its expiry


@check(
    "health.serving",
    title="grpc.health.v1 answers SERVING for '' and for the feedback service",
    rationale="""Orchestrators and the suite's own restart logic decide readiness from the standard health service;
    it must answer SERVING for the whole server ("") and for target_feedback.v1.TargetFeedbackService.""",
    order=1,
)
def health_serving(ctx: SuiteContext) -> str:
    statuses = {name or '""': ctx.conn.health_status(name) for name in ("", SERVICE_NAME)}
    bad = {k: v for k, v in statuses.items() if v != "SERVING"}
    expect(not bad, f"health status: {bad}")
    return "SERVING for both"


@check(
    "robustness.deadline",
    title="Deadlines are honoured and a stalled or impatient client does not stall the server",
    rationale=f"""A 1 ms GetInfo returns (OK or DEADLINE_EXCEEDED) at once; an Evaluate whose 50 ms deadline
    expires mid-evaluation returns DEADLINE_EXCEEDED within {PROMPT_S:g} s (or its result, if the server is
    that fast), and retrying it with the same request_id returns one release charged once; three uploads that
    send a manifest and then stall end with DEADLINE_EXCEEDED at their 0.5 s deadline. Afterwards GetInfo and
    health answer at once (no handler thread left blocked on a dead stream).""",
    order=62,
)
def deadlines(ctx: SuiteContext) -> str:
    # A fast server may answer GetInfo within 1 ms (gRPC timers are coarse): OK is fine too.
    code, elapsed = _timed_code(lambda: ctx.conn.stub.GetInfo(pb.GetInfoRequest(), timeout=0.001))
    expect(code in ("DEADLINE_EXCEEDED", "OK"), f"GetInfo with a 1 ms deadline ended {code}")
    expect(elapsed < PROMPT_S, f"GetInfo with a 1 ms deadline took {elapsed:.2f} s to return")
    evaluate_note = _impatient_evaluate(ctx)
    stalled_note = _stalled_uploads(ctx)
    t0 = time.monotonic()
    ctx.conn.stub.GetInfo(pb.GetInfoRequest(), timeout=5)
    status = ctx.conn.health_status()
    expect(status == "SERVING", f"health after the deadline tests: {status}")
    return f"1 ms GetInfo {code}; {evaluate_note}; {stalled_note}; GetInfo afterwards {(time.monotonic() - t0) * 1000:.0f} ms"


def _timed_code(call) -> tuple[str, float]:
    t0 = time.monotonic()
    try:
        call()
        code = "OK"
    except grpc.RpcError as error:
        code = describe_failure("", error).code.name
    return code, time.monotonic() - t0


def _impatient_evaluate(ctx: SuiteContext) -> str:
    """Evaluate with a 50 ms deadline, then the same request_id again with a long one."""
    if ctx.dp_enabled and ctx.budget().releases_remaining_estimate < 1:
        return "impatient Evaluate not tried (no budget left)"
    request = ctx.evaluate_request([ctx.checkpoint_id()])
    before = ctx.budget()
    code, elapsed = _timed_code(lambda: ctx.conn.stub.Evaluate(request, timeout=0.05))
    expect(code in ("DEADLINE_EXCEEDED", "OK"), f"Evaluate with a 50 ms deadline ended {code}")
    expect(elapsed < 0.05 + PROMPT_S, f"Evaluate with a 50 ms deadline took {elapsed:.2f} s to return")
    ctx.evaluate(request)  # the retry: waits for the evaluation the first call started, or replays it
    after = ctx.budget()
    if ctx.dp_enabled:
        expect(after.releases_made == before.releases_made + 1,
               f"an expired Evaluate and its retry made {after.releases_made - before.releases_made} releases, expected 1")
    return f"50 ms Evaluate ended {code} in {elapsed * 1000:.0f} ms, its retry charged once"


def _stalled_uploads(ctx: SuiteContext) -> str:
    release = threading.Event()
    manifest = upload_messages(with_nonce(ctx.checkpoint_files(), uuid.uuid4().hex))[0]

    def stalled():
        yield manifest
        release.wait(30)  # stall until the test is over

    outcomes: list[tuple[str, float]] = []

    def one_stalled_upload() -> None:
        outcomes.append(_timed_code(lambda: ctx.conn.stub.UploadCheckpoint(stalled(), timeout=0.5)))

    threads = [threading.Thread(target=one_stalled_upload) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(0.5 + PROMPT_S + 5)
    release.set()
    expect(len(outcomes) == 3, "a stalled upload did not return after its deadline")
    late = [o for o in outcomes if o[0] != "DEADLINE_EXCEEDED" or o[1] > 0.5 + PROMPT_S]
    expect(not late, f"stalled uploads (0.5 s deadline) ended {late}")
    return "3 stalled uploads ended at their deadline"


@check(
    "rpc.latency",
    title="GetInfo and GetBudget answer promptly",
    rationale="""Bookkeeping RPCs do no evaluation; clients call them every step with short deadlines (the trainer's
    default is 30 s). Each of three GetInfo and three GetBudget calls must answer within max_unary_latency_s
    (default 5 s). A slow GetBudget also lets any authenticated client saturate the owner's CPU and handler
    threads.""",
    order=13,
)
def unary_latency(ctx: SuiteContext) -> str:
    limit = ctx.options.max_unary_latency_s
    timings: dict[str, list[float]] = {"GetInfo": [], "GetBudget": []}
    for _ in range(3):
        for name, call in (("GetInfo", lambda: ctx.info(refresh=True)), ("GetBudget", ctx.budget)):
            t0 = time.monotonic()
            call()
            timings[name].append(time.monotonic() - t0)
    slow = {name: f"{max(values):.2f} s" for name, values in timings.items() if max(values) > limit}
    expect(not slow, f"slowest call above {limit:g} s: {slow}")
    return ", ".join(f"{name} max {max(values) * 1000:.0f} ms" for name, values in timings.items())
