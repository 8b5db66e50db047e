"""The shape of a release reveals nothing: status, sensitivity and latency do not depend on
which held-out rows were sampled (issue 11's holes 1-3).

Each check runs on owners the suite launches itself (--launch-cmd, see launcher.py) on held-out
files it writes, so it knows what a correct owner must answer; without --launch-cmd they SKIP.
Their output says what was planted and that it ran on a suite-launched owner.
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from collections import Counter

import grpc
import numpy as np

from protocol.conformance.checkpoints import tiny_checkpoint_files, with_added_token, with_nonce
from protocol.conformance.context import SuiteContext
from protocol.conformance.fixed_output_model import coin_checkpoint, constant_checkpoint, context_for
from protocol.conformance.heldout_file import HeldoutRow, arithmetic_rows
from protocol.conformance.launcher import LaunchedOwner, LaunchSettings
from protocol.conformance.recorder import describe_failure
from protocol.conformance.registry import CheckSkipped, check, expect
from protocol.conformance.timing_stats import (
    DRIFT_WINDOW,
    SPIKE_MADS,
    correlation_threshold,
    latency_correlation,
)
from protocol.generated.target_feedback.v1 import target_feedback_pb2 as pb

INVALID = grpc.StatusCode.INVALID_ARGUMENT

# status_independent: marker rows among plain ones; at q = 1/2 a query misses all four with
# probability 1/16, so a status that depends on them shows within a few queries.
STATUS_ROWS = 40
MARKER_POSITIONS = (3, 14, 22, 35)

# add_one_row: rows whose answers are "3" or "7" under a model that samples each with p = 1/2.
# A row moved by one position under a positional random stream gets fresh draws, so with 55 rows
# behind the insertion point the sum moves by about N(0, 1.9^2): inside [0, 1] by chance with
# probability ~0.2 per comparison, and 8 comparisons (2 temperatures x 2 seeds x add/remove)
# all pass by chance with probability ~3e-6.
COIN_ROWS = 60
ADD_AT, REMOVE_AT = 5, 7
COIN_DECODINGS = ((1.0, 11), (1.0, 12), (2.0, 21), (2.0, 22))   # (temperature, seed)
SUM_TOLERANCE = 1e-6

# latency_independent: 85% of the rows are answered correctly by a constant model, so each
# release is a noisy count of the secret subsample (85% keeps the mean clear of the clamp at 1).
LATENCY_ROWS = 200
LATENCY_HITS = 170
LATENCY_WARMUP = 3
LATENCY_ALPHA = 1e-4
# Every step emits "7", so a row answered "7" * LATENCY_NEW_TOKENS scores 1. Several steps make each
# row's work (on an owner whose work grows with the subsample) large against timing noise.
LATENCY_NEW_TOKENS = 8
LATENCY_SETTINGS = {"sample_rate": 0.5, "epsilon": 50.0}


def require_launched_dp(info: pb.GetInfoResponse, wanted: bool) -> None:
    if info.privacy.enabled != wanted:
        raise CheckSkipped(f"the launched owner runs with DP {'on' if info.privacy.enabled else 'off'} although the "
                           f"launch asked for {{dp}}={'true' if wanted else 'false'}: pass {{dp}} or "
                           "{owner_options} in --launch-cmd")


def _response_shape(response: pb.EvaluateResponse) -> tuple:
    """What a release looks like, without its values."""
    return (len(response.results), tuple(len(r.domain_accuracy) for r in response.results),
            bool(response.release_id), response.HasField("privacy"))


@check(
    "privacy.shape.status_independent",
    title="Whether an evaluation fails does not depend on the secret subsample (suite-launched owner)",
    rationale=f"""The suite launches an owner on its own held-out file, with a rare marker string planted in
    {len(MARKER_POSITIONS)} of {STATUS_ROWS} rows (DP on, q = 1/2), and uploads its tiny checkpoint with one added
    token for exactly that marker whose id is the embedding's row count: embedding it fails exactly on marker
    rows. The owner must refuse the upload (INVALID_ARGUMENT), or else every one of N evaluations
    (--status-calls, default 8) must succeed with the same response shape and count one release each: a status
    that depends on which rows were drawn is a noise-free release of membership. Needs --launch-cmd.""",
    order=110,
)
def status_independent(ctx: SuiteContext) -> str:
    launcher = ctx.launcher("the status-independence check")
    marker = f"zqj{uuid.uuid4().hex[:10]}"
    rows = arithmetic_rows(STATUS_ROWS, "status")
    for i in MARKER_POSITIONS:
        rows[i] = dataclasses.replace(rows[i], prompt=f"{rows[i].prompt} {marker}")
    calls = ctx.options.status_calls
    planted = (f"planted marker {marker!r} in {len(MARKER_POSITIONS)} of {STATUS_ROWS} held-out rows of a "
               f"suite-launched owner")
    settings = LaunchSettings(dp=True, sample_rate=0.5, epsilon=8.0, planned_releases=calls + 10)
    with launcher.owner(rows, settings, launcher.new_workdir("status")).start_serving() as owner:
        require_launched_dp(owner.info(), True)
        files, token_id = with_added_token(with_nonce(tiny_checkpoint_files(0), uuid.uuid4().hex), marker)
        try:
            checkpoint_id = owner.upload(files)
        except grpc.RpcError as error:
            failure = describe_failure("UploadCheckpoint", error)
            expect(failure.code == INVALID,
                   f"{planted}; the upload with token id {token_id} for the marker failed with {failure.code.name} "
                   f"{failure.reason}, expected INVALID_ARGUMENT")
            return (f"{planted}; the owner refused the tokenizer (marker token id {token_id} >= embedding rows) at "
                    f"upload ({failure.reason}): no evaluation can fail on the marker")
        before = owner.budget()
        outcomes: list[tuple[str, tuple | None]] = []
        for seed in range(calls):
            decoding = pb.DecodingSettings(max_new_tokens=1, samples_per_prompt=1, temperature=0.0, seed=seed)
            try:
                outcomes.append(("OK", _response_shape(owner.evaluate([checkpoint_id], decoding))))
            except grpc.RpcError as error:
                failure = describe_failure("Evaluate", error)
                outcomes.append((f"{failure.code.name} {failure.reason or '(no ErrorInfo)'}", None))
        after = owner.budget()
    statuses = Counter(status for status, _ in outcomes)
    failed = {status: n for status, n in statuses.items() if status != "OK"}
    expect(not failed,
           f"{planted}; the owner accepted a tokenizer whose marker token (id {token_id}) it cannot embed, and "
           f"{sum(failed.values())} of {calls} evaluations failed ({dict(failed)}) while {statuses['OK']} "
           f"succeeded: evaluation fails on rows it cannot embed, so whether a call fails depends on whether the "
           f"secret subsample holds a marker row")
    shapes = {shape for _, shape in outcomes}
    expect(len(shapes) == 1, f"{planted}; the {calls} responses have {len(shapes)} different shapes: {sorted(shapes)}")
    made = after.releases_made - before.releases_made
    expect(made == calls, f"{planted}; {calls} successful evaluations counted {made} releases")
    return f"{planted}; upload accepted, and all {calls} evaluations succeeded with one response shape"


def coin_rows() -> list[HeldoutRow]:
    answers = np.random.default_rng(2024).choice(["3", "7"], size=COIN_ROWS)
    return [HeldoutRow(f"coin-{i:03d}", f"Row {i}: say a digit.", str(a)) for i, a in enumerate(answers)]


def neighbouring_datasets() -> dict[str, list[HeldoutRow]]:
    """D, D plus one row inserted at ADD_AT, D minus the row at REMOVE_AT (ids stay with their rows)."""
    rows = coin_rows()
    added = HeldoutRow("coin-added", "Row added: say a digit.", "7")
    return {"D": rows, "D+1": rows[:ADD_AT] + [added] + rows[ADD_AT:], "D-1": rows[:REMOVE_AT] + rows[REMOVE_AT + 1:]}


def exact_releases(owner: LaunchedOwner, size: int) -> tuple[list[float], int]:
    """The exact accuracy of the coin checkpoint for every COIN_DECODINGS entry, and k."""
    info = owner.info()
    require_launched_dp(info, False)
    expect(info.heldout_size == size, f"the launched owner serves {info.heldout_size} rows; the suite gave it {size}")
    limits = info.decoding_limits
    samples = min(8, limits.max_samples_per_prompt)
    checkpoint_id = owner.upload(coin_checkpoint("3", "7", context_for(limits.max_prompt_tokens, 1)))
    values = []
    for temperature, seed in COIN_DECODINGS:
        decoding = pb.DecodingSettings(max_new_tokens=1, samples_per_prompt=samples, temperature=temperature, seed=seed)
        values.append(owner.evaluate([checkpoint_id], decoding).results[0].accuracy)
    return values, samples


@check(
    "privacy.shape.add_one_row",
    title="Adding or removing one held-out row moves the exact sum by at most that row's score (sensitivity 1)",
    rationale=f"""DP noise is calibrated for sensitivity 1: one row may change the sum of row scores by at most 1.
    The suite launches three owners with DP off (exact mean over all rows): on D ({COIN_ROWS} rows), on D with one
    row inserted at position {ADD_AT}, and on D without the row at position {REMOVE_AT}; row ids stay with their
    rows. Its GPT-2 checkpoint samples the answers "3" and "7" with probability 1/2 each at every position,
    whatever the prompt (final LayerNorm weight 0), and each row's answer is one of them; with k samples per row at
    temperatures 1 and 2 and two seeds each, N' v' - N v must lie in [0, 1] when a row is added and N v - N' v' in
    [0, 1] when one is removed. A row whose randomness depends on its position (or batch-mates) moves the sum by
    several units. Needs --launch-cmd.""",
    order=111,
)
def add_one_row(ctx: SuiteContext) -> str:
    launcher = ctx.launcher("the add-one-row check")
    datasets = neighbouring_datasets()
    values: dict[str, list[float]] = {}
    samples = 0
    for label, rows in datasets.items():
        workdir = launcher.new_workdir("rows-" + label.replace("+", "plus").replace("-", "minus"))
        with launcher.owner(rows, LaunchSettings(dp=False), workdir).start_serving() as owner:
            values[label], samples = exact_releases(owner, len(rows))
    n = {label: len(rows) for label, rows in datasets.items()}
    problems = []
    for i, (temperature, seed) in enumerate(COIN_DECODINGS):
        base = n["D"] * values["D"][i]
        moves = {"adding": n["D+1"] * values["D+1"][i] - base, "removing": base - n["D-1"] * values["D-1"][i]}
        for what, move in moves.items():
            if not -SUM_TOLERANCE <= move <= 1 + SUM_TOLERANCE:
                problems.append(f"T={temperature:g} seed {seed}: {what} one row moved the sum by {move:+.3f}")
    planted = (f"suite-launched owners (DP off) on {n['D']} rows, plus one at position {ADD_AT}, minus the one at "
               f"{REMOVE_AT}; k={samples} samples of a coin-flip GPT-2")
    expect(not problems, f"{planted}: {'; '.join(problems[:4])} (allowed: [0, 1]): a row's sampling randomness "
                         f"depends on the other rows, e.g. on its position in the list")
    return f"{planted}: every add/remove moved the exact sum by a value in [0, 1] ({len(COIN_DECODINGS) * 2} cases)"


def latency_rows(new_tokens: int) -> list[HeldoutRow]:
    """LATENCY_ROWS rows of varied length; LATENCY_HITS of them answered with the constant model's
    output over `new_tokens` steps ("7" repeated)."""
    order = np.random.default_rng(7).permutation(LATENCY_ROWS)
    rows = []
    for i in range(LATENCY_ROWS):
        answer = "7" * new_tokens if order[i] < LATENCY_HITS else "8"
        words = " ".join(["count these words"] * (i % 6 + 1))
        rows.append(HeldoutRow(f"time-{i:03d}", f"Row {i}: {words}. Which digit?", answer))
    return rows


@check(
    "privacy.shape.latency_independent",
    title="Latency does not track the secret subsample (suite-launched owner, DP on)",
    rationale=f"""The suite launches an owner (DP on, q = 1/2, epsilon {LATENCY_SETTINGS['epsilon']:g}) on
    {LATENCY_ROWS} rows, {LATENCY_HITS} of them answered "7" x {LATENCY_NEW_TOKENS}, and uploads a GPT-2 that greedily
    emits "7" at every step ({LATENCY_NEW_TOKENS} new tokens): each release is a noisy count of the secret subsample's
    size. After {LATENCY_WARMUP} warm-up calls it
    times K releases (--latency-calls, default 60): the Pearson r of latency (log, minus its rolling median over
    {DRIFT_WINDOW} calls, clipped to median +- {SPIKE_MADS:g} MADs: functions of the latencies alone) with the
    released value must satisfy |r| < r*(K), the two-sided {LATENCY_ALPHA:g} quantile of r under independence
    (r sqrt((K-2)/(1-r^2)) ~ t(K-2), exact when the released values are normal, whatever the latency's noise): a
    server with fixed work fails with probability {LATENCY_ALPHA:g} on any machine; one whose time grows with the
    sampled rows shows r near its correlation with the count. Needs --launch-cmd.""",
    order=112,
)
def latency_independent(ctx: SuiteContext) -> str:
    launcher = ctx.launcher("the latency check")
    calls = ctx.options.latency_calls
    settings = LaunchSettings(dp=True, planned_releases=calls + LATENCY_WARMUP + 10, **LATENCY_SETTINGS)
    values, latencies = [], []
    workdir = launcher.new_workdir("latency")
    # The rows depend on max_new_tokens, which the owner's limits cap: a first launch cannot know them,
    # so the suite asks for LATENCY_NEW_TOKENS and SKIPs if the owner caps it lower.
    with launcher.owner(latency_rows(LATENCY_NEW_TOKENS), settings, workdir).start_serving() as owner:
        info = owner.info()
        require_launched_dp(info, True)
        limits = info.decoding_limits
        if limits.max_new_tokens < LATENCY_NEW_TOKENS:
            raise CheckSkipped(f"the launched owner allows max_new_tokens {limits.max_new_tokens} < {LATENCY_NEW_TOKENS}")
        context = context_for(limits.max_prompt_tokens, LATENCY_NEW_TOKENS)
        checkpoint_id = owner.upload(constant_checkpoint("7", context))
        for seed in range(LATENCY_WARMUP + calls):
            decoding = pb.DecodingSettings(max_new_tokens=LATENCY_NEW_TOKENS, samples_per_prompt=1, temperature=0.0,
                                           seed=seed)
            started = time.monotonic()
            response = owner.evaluate([checkpoint_id], decoding)
            elapsed = time.monotonic() - started
            if seed >= LATENCY_WARMUP:
                values.append(response.results[0].accuracy)
                latencies.append(elapsed)
    threshold = correlation_threshold(calls, LATENCY_ALPHA)
    r = latency_correlation(np.asarray(values), np.asarray(latencies))
    planted = (f"suite-launched owner, {LATENCY_ROWS} rows ({LATENCY_HITS} scoring 1), q={info.privacy.sample_rate:g}, "
               f"K={calls} timed releases, median latency {np.median(latencies) * 1000:.0f} ms")
    expect(np.isfinite(r), f"{planted}: the released values (or latencies) do not vary, so nothing can be judged")
    expect(abs(r) < threshold, f"{planted}: latency correlates with the released value, r = {r:+.3f} (|r| must stay "
                               f"below {threshold:.3f}, the {LATENCY_ALPHA:g} two-sided quantile under independence):"
                               f" response time reveals the secret subsample")
    return f"{planted}: r = {r:+.3f}, |r| < {threshold:.3f} (false-failure rate {LATENCY_ALPHA:g})"
