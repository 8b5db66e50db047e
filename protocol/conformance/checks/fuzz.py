"""Malformed requests fuzzed with hypothesis: no crash, no hang, no leak, only client-error codes.

Hypothesis draws request fields (random strings, ids, huge and negative integers, NaN and
infinite floats, undefined enum values, random upload streams) from a fixed seed, so a run is
reproducible. Examples are sent until options.fuzz_examples or options.fuzz_time_s is
reached; shrinking is off (each example costs a round trip) and every violation is collected
rather than raised, so one run reports up to five distinct problems.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import grpc

from protocol.conformance.context import SuiteContext
from protocol.conformance.recorder import describe_failure
from protocol.conformance.registry import CheckSkipped, check, expect
from protocol.conformance.scan import canary_hits, error_contract_problems
from protocol.generated.target_feedback.v1 import target_feedback_pb2 as pb

CLIENT_ERROR_CODES = frozenset({
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.OUT_OF_RANGE,
    grpc.StatusCode.FAILED_PRECONDITION,
})
FUZZ_DEADLINE_S = 10.0
MAX_PROBLEMS = 5


def _hypothesis():
    try:
        import hypothesis  # noqa: F401
    except ImportError:
        raise CheckSkipped("hypothesis is not installed (pip install hypothesis)") from None
    from hypothesis import strategies

    return strategies


def evaluate_requests():
    st = _hypothesis()
    ids = st.one_of(
        st.text(max_size=80),
        st.from_regex(r"[0-9a-f]{64}", fullmatch=True),
        st.just(""),
        st.text(alphabet="./\\%\x00~*?", max_size=20),
        st.text(min_size=1000, max_size=3000),
    )
    int32 = st.integers(-(2**31), 2**31 - 1)
    decoding = st.builds(
        pb.DecodingSettings,
        max_new_tokens=int32,
        samples_per_prompt=int32,
        temperature=st.floats(allow_nan=True, allow_infinity=True),
        seed=st.integers(0, 2**64 - 1),
    )
    return st.builds(
        pb.EvaluateRequest,
        checkpoint_ids=st.lists(ids, max_size=12),
        decoding=decoding,
        split=st.integers(-3, 10),
        request_id=st.text(max_size=200),
    )


def upload_streams():
    st = _hypothesis()
    names = st.one_of(
        st.sampled_from(["config.json", "tokenizer.json", "model.safetensors", "pytorch_model.bin", "../x.safetensors",
                         "/abs", "", "model-00001-of-00002.safetensors", "a/b.json", "CON", "model.safetensors\x00.bin"]),
        st.text(max_size=40),
    )
    int64 = st.integers(-(2**63), 2**63 - 1)
    digest = st.one_of(st.from_regex(r"[0-9a-f]{64}", fullmatch=True), st.text(max_size=70))
    entry = st.builds(pb.FileEntry, name=names, size=int64, sha256=digest)
    manifest = st.builds(lambda files: pb.UploadCheckpointRequest(manifest=pb.CheckpointManifest(files=files)),
                         st.lists(entry, max_size=6))
    chunk = st.builds(lambda n, o, d: pb.UploadCheckpointRequest(chunk=pb.FileChunk(name=n, offset=o, data=d)),
                      names, int64, st.binary(max_size=300))
    return st.lists(st.one_of(manifest, chunk), max_size=6)


def fuzz(ctx: SuiteContext, strategy, send: Callable[[object], object], allowed: frozenset, label: str) -> str:
    """Send hypothesis examples with `send`; collect and report every violation."""
    from hypothesis import HealthCheck, Phase, Verbosity, given, seed, settings

    options = ctx.options
    problems: list[str] = []
    sent = [0]
    stop_at = time.monotonic() + options.fuzz_time_s
    mark = ctx.recorder.mark()
    before = ctx.budget()

    @seed(options.fuzz_seed)
    @settings(max_examples=options.fuzz_examples, deadline=None, database=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck), verbosity=Verbosity.quiet)
    @given(strategy)
    def probe(example: object) -> None:
        if time.monotonic() > stop_at or len(problems) >= MAX_PROBLEMS:
            return
        sent[0] += 1
        try:
            send(example)
        except grpc.RpcError as error:
            failure = describe_failure("", error)
            if failure.code == grpc.StatusCode.DEADLINE_EXCEEDED:
                problems.append(f"no answer within {FUZZ_DEADLINE_S:g} s (hang) for {_short(example)}")
            elif failure.code not in allowed:
                problems.append(f"{failure.code.name} {failure.reason} for {_short(example)}")
        else:
            problems.append(f"accepted a malformed {label}: {_short(example)}")

    probe()
    status = ctx.conn.health_status()
    expect(status == "SERVING", f"health after fuzzing: {status}")
    ctx.info(refresh=True)
    after = ctx.budget()
    expect((after.epsilon_spent, after.releases_made) == (before.epsilon_spent, before.releases_made),
           "fuzzed requests changed the budget")
    problems += [f"leak: {hit}" for hit in canary_hits(options.canaries, ctx.recorder.received_since(mark))][:3]
    service = [f for f in ctx.recorder.failures_since(mark) if "TargetFeedbackService" in f.method]
    problems += error_contract_problems(service)[:3]
    expect(not problems, f"{len(problems)} problem(s) in {sent[0]} fuzzed {label}s: " + "; ".join(problems[:MAX_PROBLEMS]))
    return f"{sent[0]} fuzzed {label}s: only {', '.join(sorted(c.name for c in allowed))}; server healthy"


def _short(example: object) -> str:
    text = " ".join(str(example).split())
    return text[:160] + ("..." if len(text) > 160 else "")


@check(
    "robustness.fuzz.evaluate",
    title="Fuzzed Evaluate requests: no crash, hang, leak or server-error code",
    rationale="""Random checkpoint ids (unicode, path-like, 3000-char, sha-shaped), extreme integers, NaN/inf
    temperatures, undefined split values and odd request ids must each get a client-error code
    (INVALID_ARGUMENT, NOT_FOUND, OUT_OF_RANGE, FAILED_PRECONDITION) with a valid ErrorInfo within the deadline -
    never INTERNAL/UNKNOWN - spend nothing, leak no canary, and leave the server healthy.""",
    order=60,
)
def fuzz_evaluate(ctx: SuiteContext) -> str:
    strategy = evaluate_requests()
    return fuzz(ctx, strategy, lambda r: ctx.conn.stub.Evaluate(r, timeout=FUZZ_DEADLINE_S), CLIENT_ERROR_CODES,
                "Evaluate request")


@check(
    "robustness.fuzz.upload",
    title="Fuzzed upload streams: no crash, hang, leak or server-error code",
    rationale="""Random sequences of manifests and chunks (odd names, negative and huge sizes and offsets, malformed
    digests, random bytes, empty streams) must each be refused with a client-error code (or RESOURCE_EXHAUSTED
    for size/quota) and a valid ErrorInfo, within the deadline, leaving the server healthy.""",
    order=61,
)
def fuzz_upload(ctx: SuiteContext) -> str:
    strategy = upload_streams()
    allowed = CLIENT_ERROR_CODES | {grpc.StatusCode.RESOURCE_EXHAUSTED}
    return fuzz(ctx, strategy, lambda messages: ctx.conn.stub.UploadCheckpoint(iter(messages), timeout=FUZZ_DEADLINE_S),
                allowed, "upload stream")
