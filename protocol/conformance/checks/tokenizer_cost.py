"""An uploaded tokenizer must not make a row's cost depend on the row's content (issue 41).

A normalizer is code the trainer ships to the owner: a Sequence of literal Replace steps that turns a
guessed secret string into a control character and then multiplies that character makes exactly the
held-out prompts holding the guess costly to tokenize. The owner then answers slower, or fails after
charging, exactly when the secret subsample holds such a row: membership without reading a value.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
import uuid

import grpc

from protocol.conformance.checkpoints import edit_json, tiny_checkpoint_files, with_nonce
from protocol.conformance.checks.shape import require_launched_dp
from protocol.conformance.context import SuiteContext
from protocol.conformance.heldout_file import HeldoutRow, arithmetic_rows
from protocol.conformance.launcher import LaunchSettings
from protocol.conformance.recorder import describe_failure
from protocol.conformance.registry import check, expect
from protocol.generated.target_feedback.v1 import target_feedback_pb2 as pb

INVALID = grpc.StatusCode.INVALID_ARGUMENT
COST_ROWS = 8
COST_CALLS = 4
AMPLIFY_STEPS = 5            # 16^5 ~ one million characters for each occurrence of the marker
AMPLIFY_FACTOR = 16
# An owner whose cost does not depend on the marker answers both owners in about the same time; the
# attack as issue 41 found it made every marked row cost ~0.1-1 s more on this suite's tiny model.
SLOWDOWN_RATIO, SLOWDOWN_SLACK_S = 2.0, 0.5
CONTROL = "\u0001"


def amplifying_normalizer(secret: str, steps: int = AMPLIFY_STEPS) -> dict:
    """secret -> one control character, then `steps` Replace steps each multiplying it AMPLIFY_FACTOR-fold."""
    return {"type": "Sequence", "normalizers": [
        {"type": "Replace", "pattern": {"String": secret}, "content": CONTROL},
        *[{"type": "Replace", "pattern": {"String": CONTROL}, "content": CONTROL * AMPLIFY_FACTOR}
          for _ in range(steps)],
    ]}


def with_amplifying_tokenizer(files, secret: str):
    def edit(tokenizer: dict) -> None:
        tokenizer["normalizer"] = amplifying_normalizer(secret)

    return edit_json(files, "tokenizer.json", edit)


def _marked(rows: list[HeldoutRow], text: str) -> list[HeldoutRow]:
    return [dataclasses.replace(row, prompt=f"{row.prompt} {text}") for row in rows]


def _timed_outcomes(owner, checkpoint_id: str, calls: int) -> list[tuple[str, float]]:
    outcomes = []
    for seed in range(calls):
        decoding = pb.DecodingSettings(max_new_tokens=1, samples_per_prompt=1, temperature=0.0, seed=seed)
        start = time.perf_counter()
        try:
            owner.evaluate([checkpoint_id], decoding)
            status = "OK"
        except grpc.RpcError as error:
            failure = describe_failure("Evaluate", error)
            status = f"{failure.code.name} {failure.reason or '(no ErrorInfo)'}"
        outcomes.append((status, time.perf_counter() - start))
    return outcomes


@check(
    "privacy.shape.cost_independent",
    title="An uploaded tokenizer cannot make a held-out row's cost depend on its content (suite-launched owners)",
    rationale=f"""A normalizer is code the trainer ships: Replace(marker -> U+0001) followed by {AMPLIFY_STEPS}
    steps that each multiply U+0001 {AMPLIFY_FACTOR}-fold turns exactly the prompts holding the marker into
    ~{AMPLIFY_FACTOR ** AMPLIFY_STEPS:,} characters to tokenize, and upload's dry run never meets the marker. The
    suite launches two owners (DP on, q = 1/2) on {COST_ROWS} rows each, identical but for a random marker appended
    to every row of the first and a different string of the same length to every row of the second, and uploads
    the same tiny checkpoint with that normalizer to both. Each owner must refuse it (INVALID_ARGUMENT), or else
    {COST_CALLS} evaluations on each must end with the same statuses and the first owner's median time must stay
    under {SLOWDOWN_RATIO:g}x the second's + {SLOWDOWN_SLACK_S:g} s: a cost that grows with a row's content is a
    release of membership that no noise covers. Needs --launch-cmd.""",
    order=111,
)
def cost_independent(ctx: SuiteContext) -> str:
    launcher = ctx.launcher("the tokenizer-cost check")
    marker = f"zqj{uuid.uuid4().hex[:10]}"
    decoy = f"vwk{uuid.uuid4().hex[:10]}"
    files = with_amplifying_tokenizer(with_nonce(tiny_checkpoint_files(0), uuid.uuid4().hex), marker)
    settings = LaunchSettings(dp=True, sample_rate=0.5, epsilon=8.0, planned_releases=COST_CALLS + 10)
    runs: dict[str, list[tuple[str, float]]] = {}
    refused: list[str] = []
    for label, text in (("marked", marker), ("unmarked", decoy)):
        rows = _marked(arithmetic_rows(COST_ROWS, f"cost-{label}"), text)
        with launcher.owner(rows, settings, launcher.new_workdir(f"cost-{label}")).start_serving() as owner:
            require_launched_dp(owner.info(), True)
            try:
                checkpoint_id = owner.upload(files)
            except grpc.RpcError as error:
                failure = describe_failure("UploadCheckpoint", error)
                expect(failure.code == INVALID,
                       f"the {label} owner's upload of the amplifying tokenizer failed with {failure.code.name} "
                       f"{failure.reason}, expected INVALID_ARGUMENT")
                refused.append(label)
                continue
            runs[label] = _timed_outcomes(owner, checkpoint_id, COST_CALLS)
    what = (f"a normalizer multiplying the marker {AMPLIFY_FACTOR}^{AMPLIFY_STEPS}-fold, uploaded to an owner with "
            f"the marker in all {COST_ROWS} rows and to one without it (suite-launched owners)")
    expect(len(refused) in (0, 2), f"{what}: only the {' and '.join(refused)} owner refused the upload: whether an "
                                   "upload is accepted must not depend on the held-out rows")
    if refused:
        return f"{what}: both owners refused the tokenizer at upload (INVALID_ARGUMENT), before any charge"
    statuses = {label: [status for status, _ in outcomes] for label, outcomes in runs.items()}
    expect(statuses["marked"] == statuses["unmarked"],
           f"{what}: both accepted it, and the evaluations ended {statuses['marked']} on the marked owner against "
           f"{statuses['unmarked']} on the other: whether a call fails depends on the rows' content")
    medians = {label: statistics.median(t for _, t in outcomes) for label, outcomes in runs.items()}
    expect(medians["marked"] <= SLOWDOWN_RATIO * medians["unmarked"] + SLOWDOWN_SLACK_S,
           f"{what}: both accepted it, and the marked owner answered in a median {medians['marked']:.2f} s against "
           f"{medians['unmarked']:.2f} s: a row's cost depends on its content (a timing release of membership)")
    return (f"{what}: both accepted it; statuses {statuses['marked']} on both; median "
            f"{medians['marked']:.2f} s vs {medians['unmarked']:.2f} s")
