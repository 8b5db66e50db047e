"""Difference releases (RELEASE_KIND_ACCURACY_DIFFERENCE): served only where GetInfo declares them,
refused before any charge when their settings are bad, charged as the accuracy release of as many
values, with noise calibrated to the request's clip.

In such a request checkpoint_ids[0] is the BASE; for each further checkpoint (a candidate) the owner
sums its per-row differences from the base, each clipped to the public [-clip, clip], over the
secret subsample, adds Gaussian noise of std z * clip and divides by the public q N. The privacy of
that rests on three things the wire alone cannot show, so the last three checks run on owners the
suite launches on its own rows (--launch-cmd) with fixed-distribution GPT-2s
(fixed_output_model.py), whose per-row differences the suite knows exactly: every row is clipped,
one row moves a sum by at most the clip, and the noise is calibrated to the clip, not to 1.
"""

from __future__ import annotations

import math
import uuid

import grpc
import numpy as np

from protocol import errors
from protocol.conformance.checkpoints import with_nonce
from protocol.conformance.checks.evaluate import charge_moved
from protocol.conformance.checks.info import close
from protocol.conformance.checks.shape import neighbouring_datasets, require_launched_dp
from protocol.conformance.context import SuiteContext
from protocol.conformance.fixed_output_model import (
    coin_checkpoint,
    completion_ids,
    completion_probability,
    context_for,
    fixed_distribution_files,
)
from protocol.conformance.heldout_file import HeldoutRow, arithmetic_rows
from protocol.conformance.launcher import LaunchedOwner, LaunchSettings
from protocol.conformance.noise_stats import known_mean_variance_interval
from protocol.conformance.recorder import describe_failure
from protocol.conformance.registry import CheckFailed, CheckSkipped, check, expect
from protocol.generated.target_feedback.v1 import target_feedback_pb2 as pb

INVALID = grpc.StatusCode.INVALID_ARGUMENT
DIFFERENCE = pb.RELEASE_KIND_ACCURACY_DIFFERENCE
ANSWER_FIELD = "{answer}"  # where DifferenceSupport.answer_template puts a row's answer

# The metric names the protocol documents (proto DifferenceSupport.metrics). The launched checks need
# one metric of each family: the reference answer's probability, and a weighing of the base's own samples.
ANSWER_METRIC = "answer_probability"
SAMPLING_METRIC = "importance"
DOCUMENTED_METRICS = (ANSWER_METRIC, SAMPLING_METRIC, "log_ratio")
# A clip for requests to a server that declares no difference support (so no max_clip): any value in (0, 1].
UNDECLARED_CLIP = 0.25

# clip_honoured: rows answered "7", "3" or "5"; the base model puts its mass on the tokens of the
# completion for "3", the candidate on those for "7", so each row's difference is known exactly.
CLIP_ANSWERS = ("7", "3", "7", "3", "7", "5")  # 15 x "7", 10 x "3", 5 x "5" over CLIP_ROWS rows
CLIP_ROWS = 30
BASE_ANSWER, CANDIDATE_ANSWER = "3", "7"
EXACT_TOLERANCE = 1e-5

# add_one_row: a coin base ("3"/"7" with p 1/2) against a weighted coin, the sampling metric on k = 2
# samples per row: a row's value is 0 or +-0.2 (its sign set by its answer), each with probability 1/2,
# and the clip 0.2 keeps it. A row redrawn by a positional random stream changes by 0 or 0.2 at random,
# so the 53-55 rows behind the change move the sum by about N(0, 1^2): one seed passes both comparisons
# by chance with probability ~0.07 (simulated), all DIFFERENCE_SEEDS with ~2e-6.
CANDIDATE_WEIGHTS = {"3": 0.6, "7": 0.4}
DIFFERENCE_SAMPLES = 2
DIFFERENCE_CLIP = 0.2
DIFFERENCE_SEEDS = (31, 32, 33, 34, 35)
SUM_TOLERANCE = 1e-6

# noise_calibrated_to_clip: identical base and candidate, so every difference is 0 and a release is pure
# noise; a clip far below 1 tells noise calibrated to it from noise calibrated to 1 (or to clip / 10).
NOISE_ROWS = 40
NOISE_SETTINGS = {"sample_rate": 0.5, "epsilon": 50.0}
NOISE_CLIP_FRACTION = 0.05  # of min(max_clip, 1)
NOISE_ALPHA = 1e-4


# -- requests ---------------------------------------------------------------------------------------
def difference_decoding(ctx: SuiteContext, seed: int = 0) -> pb.DecodingSettings:
    """A decoding every documented metric accepts: one sample at temperature 1 (a sampling metric weighs
    samples drawn at a temperature > 0; the reference-answer metric scores one completion)."""
    return pb.DecodingSettings(max_new_tokens=ctx.decoding().max_new_tokens, samples_per_prompt=1, temperature=1.0,
                               seed=seed)


def difference_request(ctx: SuiteContext, checkpoint_ids: list[str], metric: str, clip: float,
                       **fields) -> pb.EvaluateRequest:
    """A difference release of checkpoint_ids[1:] against checkpoint_ids[0] (fields override kind, split, ...)."""
    fields.setdefault("decoding", difference_decoding(ctx))
    fields.setdefault("kind", DIFFERENCE)
    return ctx.evaluate_request(checkpoint_ids, difference=pb.DifferenceRequest(metric=metric, clip=clip), **fields)


def refuse_in_turn(ctx: SuiteContext, cases: dict[str, pb.EvaluateRequest], reason: str | None = None) -> None:
    """Each request must be refused with INVALID_ARGUMENT (and `reason`) and leave the budget as it
    was. One GetBudget between consecutive cases says which case charged."""
    before = ctx.budget()
    for what, request in cases.items():
        try:
            ctx.evaluate(request)
        except grpc.RpcError as error:
            failure = describe_failure("Evaluate", error)
        else:
            raise CheckFailed(f"{what}: evaluated{charge_moved(before, ctx.budget())}; expected INVALID_ARGUMENT "
                              f"{'/ ' + reason + ' ' if reason else ''}before any charge")
        after = ctx.budget()
        charged = charge_moved(before, after)
        expect(failure.code == INVALID and not charged and (reason is None or failure.reason == reason),
               f"{what}: ended {failure.code.name} {failure.reason or '(no ErrorInfo)'}{charged}; expected "
               f"INVALID_ARGUMENT{' / ' + reason if reason else ''} before any charge")
        before = after


def difference_support(info: pb.GetInfoResponse, what: str) -> pb.DifferenceSupport:
    """GetInfo's difference support; SKIP when the kind is not declared."""
    if DIFFERENCE not in info.release_kinds:
        raise CheckSkipped(f"GetInfo.release_kinds does not list RELEASE_KIND_ACCURACY_DIFFERENCE: {what} applies "
                           "only to servers that serve it")
    support = info.difference_support
    expect(len(support.metrics) > 0, "GetInfo.release_kinds lists RELEASE_KIND_ACCURACY_DIFFERENCE but "
                                     "difference_support.metrics is empty")
    return support


# -- any server ---------------------------------------------------------------------------------------
@check(
    "evaluate.difference.refused_when_not_served",
    title="A difference release of an undeclared kind or metric is refused (INVALID_ARGUMENT / "
          "RELEASE_KIND_NOT_SERVED, nothing charged)",
    rationale=f"""A trainer learns from GetInfo what a server releases; a server that serves what it does not
    declare releases values nobody audited (an owner's card is its contract). If GetInfo.release_kinds does not
    list RELEASE_KIND_ACCURACY_DIFFERENCE, a difference release (base + one candidate, valid clip
    {UNDECLARED_CLIP:g}, one sample at temperature 1) with each documented metric ({', '.join(DOCUMENTED_METRICS)})
    must be refused with INVALID_ARGUMENT / RELEASE_KIND_NOT_SERVED, GetBudget unchanged; if it lists it, so must
    each documented metric difference_support.metrics does not list, and an invented one. A server from before
    release kinds, which ignores the kind and releases accuracy, fails too: its trainer would read accuracy as a
    difference.""",
    order=39,
)
def refused_when_not_served(ctx: SuiteContext) -> str:
    info = ctx.info()
    ids = [ctx.checkpoint_id(0), ctx.checkpoint_id(1)]
    if DIFFERENCE not in info.release_kinds:
        cases = {f"a difference release with metric {metric!r} from a server whose GetInfo.release_kinds does not "
                 f"list RELEASE_KIND_ACCURACY_DIFFERENCE": difference_request(ctx, ids, metric, UNDECLARED_CLIP)
                 for metric in DOCUMENTED_METRICS}
        refuse_in_turn(ctx, cases, errors.RELEASE_KIND_NOT_SERVED)
        return f"kind not declared; {len(cases)} difference releases refused (RELEASE_KIND_NOT_SERVED), budget unchanged"
    served = list(info.difference_support.metrics)
    unlisted = [metric for metric in DOCUMENTED_METRICS if metric not in served]
    unlisted.append(f"conformance-unlisted-{uuid.uuid4().hex[:8]}")
    clip = min(info.difference_support.max_clip, UNDECLARED_CLIP) or UNDECLARED_CLIP
    cases = {f"difference.metric {metric!r}, which GetInfo.difference_support.metrics ({', '.join(served)}) does not "
             "list": difference_request(ctx, ids, metric, clip) for metric in unlisted}
    refuse_in_turn(ctx, cases, errors.RELEASE_KIND_NOT_SERVED)
    return (f"kind declared with metrics {', '.join(served)}; {len(cases)} unlisted metrics refused "
            "(RELEASE_KIND_NOT_SERVED), budget unchanged")


@check(
    "evaluate.difference.refuse_bad_settings",
    title="Difference releases with bad settings are refused before the charge (INVALID_ARGUMENT, budget unchanged)",
    rationale="""The clip is the sensitivity the noise is calibrated to, so a clip of 0, below 0, NaN, infinite or
    above difference_support.max_clip can never be released; a difference release needs the base and at least one
    candidate, exists for the feedback split only, and carries its settings exactly when its kind says so. Each of
    these requests (a served metric, one sample at temperature 1) must be refused with INVALID_ARGUMENT and
    GetBudget's epsilon_spent and releases_made unchanged: a refusal after the charge spends budget on a request
    that fails on every retry. SKIP on a server that does not declare the kind.""",
    order=39,
)
def refuse_bad_settings(ctx: SuiteContext) -> str:
    support = difference_support(ctx.info(), "the bad-settings check")
    metric, top = support.metrics[0], support.max_clip
    ids = [ctx.checkpoint_id(0), ctx.checkpoint_id(1)]
    clip = min(top, UNDECLARED_CLIP)
    cases = {
        "difference.clip = 0": difference_request(ctx, ids, metric, 0.0),
        f"difference.clip = {-clip:g}": difference_request(ctx, ids, metric, -clip),
        "difference.clip = nan": difference_request(ctx, ids, metric, float("nan")),
        "difference.clip = inf": difference_request(ctx, ids, metric, float("inf")),
    }
    if math.isfinite(top * 2):
        cases[f"difference.clip = {top * 2:g}, above difference_support.max_clip {top:g}"] = \
            difference_request(ctx, ids, metric, top * 2)
    cases.update({
        "checkpoint_ids holding the base only": difference_request(ctx, ids[:1], metric, clip),
        "split = SPLIT_TEST": difference_request(ctx, ids, metric, clip, split=pb.SPLIT_TEST),
        "kind unspecified with difference settings": difference_request(ctx, ids, metric, clip,
                                                                         kind=pb.RELEASE_KIND_UNSPECIFIED),
        "kind RELEASE_KIND_ACCURACY with difference settings": difference_request(ctx, ids, metric, clip,
                                                                                   kind=pb.RELEASE_KIND_ACCURACY),
        "kind RELEASE_KIND_ACCURACY_DIFFERENCE without difference settings": ctx.evaluate_request(
            ids, kind=DIFFERENCE, decoding=difference_decoding(ctx)),
    })
    refuse_in_turn(ctx, cases)
    return f"{len(cases)} bad difference releases (metric {metric!r}) refused, budget unchanged"


def kind_name(kind: int) -> str:
    return pb.ReleaseKind.Name(kind) if kind in pb.ReleaseKind.values() else str(kind)


def _bookkeeping_problems(what: str, response: pb.EvaluateResponse, before: pb.GetBudgetResponse,
                          after: pb.GetBudgetResponse) -> list[str]:
    """GetBudget moved by exactly one release and by the release's own epsilon_this_release."""
    problems = []
    if after.releases_made != before.releases_made + 1:
        problems.append(f"{what}: releases_made {before.releases_made} -> {after.releases_made}, expected +1")
    moved, charged = after.epsilon_spent - before.epsilon_spent, response.privacy.epsilon_this_release
    if not close(moved, charged, rel=1e-6, abs_=1e-9):
        problems.append(f"{what}: GetBudget moved by {moved:.6g}, the release says {charged:.6g}")
    return problems


@check(
    "evaluate.difference.noise_reported",
    title="A difference release reports noise_std = GetInfo noise_std x clip and is charged as one accuracy value",
    rationale="""The noise on a released difference is calibrated to its clip c: its std is GetInfo's
    privacy.noise_std (z / qN) times c, and the event charged is that of an accuracy release of as many values
    (one per candidate; the base has none). The suite makes an accuracy release of one checkpoint, a difference
    release of one candidate (a served metric, c = min(max_clip, 1) / 4) and another accuracy release, with GetBudget
    around each. The difference release must have kind RELEASE_KIND_ACCURACY_DIFFERENCE, exactly one result, for the
    candidate, a value in [-1, 1] and PrivacySpend.noise_std = noise_std x c (relative 1e-6); GetBudget must move by
    each release's epsilon_this_release and one release; and the difference release's epsilon_this_release must lie
    between the two accuracy releases' (tolerance 1e-6): the same event composed in turn costs a non-increasing
    amount (RDP's epsilon is a minimum of functions linear in the number of events, hence concave). A charge of two
    values (the base counted) costs about twice as much. Three releases; SKIP without DP or the kind.""",
    order=39,
)
def noise_reported(ctx: SuiteContext) -> str:
    ctx.require_dp()
    info = ctx.info()
    support = difference_support(info, "the difference-noise report check")
    ctx.require_releases(4, "the difference-noise report check (3 releases)")
    metric, clip = support.metrics[0], min(support.max_clip, 1.0) / 4
    base, candidate = ctx.checkpoint_id(0), ctx.checkpoint_id(1)
    budgets = [ctx.budget()]
    responses = []
    for make in (lambda: ctx.release([candidate]),
                 lambda: ctx.evaluate(difference_request(ctx, [base, candidate], metric, clip)),
                 lambda: ctx.release([candidate])):
        responses.append(make())
        budgets.append(ctx.budget())
    released = responses[1]
    problems = []
    if released.kind != DIFFERENCE:
        problems.append(f"response.kind is {kind_name(released.kind)}, expected RELEASE_KIND_ACCURACY_DIFFERENCE")
    named = [r.checkpoint_id for r in released.results]
    if named != [candidate]:
        problems.append(f"the results name {named}, expected exactly the candidate {candidate[:12]}... (the base has "
                        "no value)")
    elif not (math.isfinite(released.results[0].accuracy_difference)
              and -1 <= released.results[0].accuracy_difference <= 1):
        problems.append(f"accuracy_difference {released.results[0].accuracy_difference} is outside [-1, 1]")
    declared = info.privacy.noise_std
    if not close(released.privacy.noise_std, declared * clip, rel=1e-6):
        problems.append(f"PrivacySpend.noise_std {released.privacy.noise_std:.6g} != GetInfo privacy.noise_std "
                        f"{declared:.6g} x clip {clip:g} = {declared * clip:.6g}")
    for what, response, before, later in zip(("the first accuracy release", "the difference release",
                                              "the accuracy release after it"), responses, budgets[:-1], budgets[1:],
                                             strict=True):
        problems += _bookkeeping_problems(what, response, before, later)
    charges = [r.privacy.epsilon_this_release for r in responses]
    low, high = min(charges[0], charges[2]), max(charges[0], charges[2])
    if not low * (1 - 1e-6) - 1e-12 <= charges[1] <= high * (1 + 1e-6) + 1e-12:
        problems.append(f"the difference release of one candidate charged epsilon {charges[1]:.6g}, outside "
                        f"[{low:.6g}, {high:.6g}] charged by the accuracy releases of one checkpoint just before and "
                        "after it: it is not charged as the same event")
    expect(not problems, "; ".join(problems))
    return (f"noise_std {released.privacy.noise_std:.4g} = {declared:.4g} x clip {clip:g}; epsilon {charges[1]:.4g} "
            f"between the accuracy releases' {charges[0]:.4g} and {charges[2]:.4g}")


# -- suite-launched owners ----------------------------------------------------------------------------
def launched_support(info: pb.GetInfoResponse, metric: str | None = None) -> pb.DifferenceSupport:
    """The launched owner's difference support; SKIP unless it serves the kind (and `metric`)."""
    support = info.difference_support
    if DIFFERENCE not in info.release_kinds or not support.metrics:
        raise CheckSkipped("the launched owner does not serve RELEASE_KIND_ACCURACY_DIFFERENCE (GetInfo release_kinds)")
    if metric is not None and metric not in support.metrics:
        raise CheckSkipped(f"the launched owner does not serve the difference metric {metric!r} "
                           f"(difference_support.metrics: {', '.join(support.metrics)})")
    return support


def clip_rows() -> list[HeldoutRow]:
    return [HeldoutRow(f"clip-{i:03d}", f"Row {i}: say a digit.", CLIP_ANSWERS[i % len(CLIP_ANSWERS)])
            for i in range(CLIP_ROWS)]


def uniform_over(ids: list[int]) -> dict[int, float]:
    """A fixed distribution spread evenly over the distinct tokens of `ids`."""
    support = sorted(set(ids))
    return {token: 1.0 / len(support) for token in support}


@check(
    "privacy.difference.clip_honoured",
    title="Every row of a difference release is clipped to the request's clip (suite-launched owner, exact)",
    rationale=f"""The noise of a difference release is calibrated to the clip c, so each row's value must be cut to
    [-c, c] before the sum: one unclipped row moves it by more than c, a noise-free release of that row. The suite
    launches an owner with DP off (exact mean over all rows) on {CLIP_ROWS} rows answered "7", "3" or "5", builds the
    reference completion of each answer from the owner's GetInfo answer_template with its own tokenizer (plus EOS),
    and uploads a base GPT-2 whose next-token distribution is uniform over the tokens of the completion for
    "{BASE_ANSWER}" and a candidate over those for "{CANDIDATE_ANSWER}", at every position whatever the prompt. Each
    row's {ANSWER_METRIC} difference d_i = p_candidate - p_base of its completion is then known exactly (e.g. -1/27,
    +1/4, 0); with c half the smallest non-zero |d_i| the release must equal mean_i clip(d_i, -c, c) within
    {EXACT_TOLERANCE:g}, far from the unclipped mean. Needs --launch-cmd.""",
    order=113,
)
def clip_honoured(ctx: SuiteContext) -> str:
    launcher = ctx.launcher("the difference clip check")
    rows = clip_rows()
    with launcher.owner(rows, LaunchSettings(dp=False), launcher.new_workdir("difference-clip")).start_serving() as owner:
        info = owner.info()
        require_launched_dp(info, False)
        support = launched_support(info, ANSWER_METRIC)
        template, limits = support.answer_template, info.decoding_limits
        completions = {a: completion_ids(template.replace(ANSWER_FIELD, a)) for a in set(CLIP_ANSWERS)}
        new_tokens = min(limits.max_new_tokens, max(len(ids) for ids in completions.values()))
        completions = {a: ids[:new_tokens] for a, ids in completions.items()}
        base, candidate = uniform_over(completions[BASE_ANSWER]), uniform_over(completions[CANDIDATE_ANSWER])
        d = np.array([completion_probability(candidate, completions[r.answer])
                      - completion_probability(base, completions[r.answer]) for r in rows])
        nonzero = np.abs(d[d != 0])
        if not nonzero.size:
            raise CheckSkipped(f"with answer_template {template!r} the suite's completions give every row the same "
                               "probability under both models: nothing to clip")
        clip = min(support.max_clip, float(nonzero.min()) / 2)
        expected, unclipped = float(np.clip(d, -clip, clip).mean()), float(d.mean())
        if abs(expected - unclipped) <= 100 * EXACT_TOLERANCE:
            raise CheckSkipped(f"with answer_template {template!r} clipping at {clip:g} does not change the mean")
        context = context_for(limits.max_prompt_tokens, new_tokens)
        ids = [owner.upload(fixed_distribution_files(base, context)),
               owner.upload(fixed_distribution_files(candidate, context))]
        decoding = pb.DecodingSettings(max_new_tokens=new_tokens, samples_per_prompt=1, temperature=1.0, seed=1)
        response = owner.evaluate_difference(ids, decoding, ANSWER_METRIC, clip)
    planted = (f"suite-launched owner (DP off) on {CLIP_ROWS} rows; base/candidate GPT-2 on the tokens of "
               f"{template!r} for {BASE_ANSWER!r}/{CANDIDATE_ANSWER!r} + EOS: d_i in "
               f"{{{', '.join(f'{v:.4g}' for v in sorted(set(d.tolist())))}}}, clip {clip:.4g}")
    expect(response.kind == DIFFERENCE and [r.checkpoint_id for r in response.results] == ids[1:],
           f"{planted}: the response is not one difference result for the candidate (kind {kind_name(response.kind)}, "
           f"{len(response.results)} results)")
    value = response.results[0].accuracy_difference
    unclipped_hint = ": the rows were not clipped" if abs(value - unclipped) <= EXACT_TOLERANCE else ""
    expect(abs(value - expected) <= EXACT_TOLERANCE,
           f"{planted}: released {value:.6f}, expected mean_i clip(d_i) = {expected:.6f} (unclipped mean "
           f"{unclipped:.6f}){unclipped_hint}")
    return f"{planted}: released {value:.6f} = mean of the clipped rows (unclipped {unclipped:.6f})"


def exact_differences(owner: LaunchedOwner, size: int) -> tuple[list[float], float]:
    """The exact sampling-metric difference of a weighted coin from a coin for every DIFFERENCE_SEEDS
    entry, and the clip used."""
    info = owner.info()
    require_launched_dp(info, False)
    expect(info.heldout_size == size, f"the launched owner serves {info.heldout_size} rows; the suite gave it {size}")
    support = launched_support(info, SAMPLING_METRIC)
    limits = info.decoding_limits
    if limits.max_samples_per_prompt < DIFFERENCE_SAMPLES:
        raise CheckSkipped(f"the launched owner allows {limits.max_samples_per_prompt} samples per prompt; the check "
                           f"needs {DIFFERENCE_SAMPLES}")
    context = context_for(limits.max_prompt_tokens, 1)
    ids = [owner.upload(coin_checkpoint("3", "7", context)),
           owner.upload(fixed_distribution_files(CANDIDATE_WEIGHTS, context))]
    clip = min(support.max_clip, DIFFERENCE_CLIP)
    values = []
    for seed in DIFFERENCE_SEEDS:
        decoding = pb.DecodingSettings(max_new_tokens=1, samples_per_prompt=DIFFERENCE_SAMPLES, temperature=1.0,
                                       seed=seed)
        values.append(owner.evaluate_difference(ids, decoding, SAMPLING_METRIC, clip).results[0].accuracy_difference)
    return values, clip


@check(
    "privacy.difference.add_one_row",
    title="Adding or removing one held-out row moves a difference release's exact sum by at most the clip",
    rationale=f"""A difference release's noise is calibrated for sensitivity c: one row may change each candidate's
    sum of clipped differences by at most c. The suite launches three owners with DP off (exact mean over all rows)
    on the add-one-row check's neighbouring sets (D, D plus one row, D minus one; row ids stay with their rows) and
    asks each for a {SAMPLING_METRIC!r} difference release of a GPT-2 drawing "3" or "7" with probability 1/2
    against one drawing them with {CANDIDATE_WEIGHTS['3']:g}/{CANDIDATE_WEIGHTS['7']:g}, {DIFFERENCE_SAMPLES}
    samples per row at temperature 1, clip c = min(max_clip, {DIFFERENCE_CLIP:g}), seeds
    {', '.join(map(str, DIFFERENCE_SEEDS))}: N' v' - N v must lie in [-c, c] when a row is added and when one is
    removed. The metric weighs the base's own samples, so a row whose samples depend on its position (or on its
    batch-mates) moves the sum by about c x 5; all {2 * len(DIFFERENCE_SEEDS)} comparisons pass by chance with
    probability ~2e-6. Needs --launch-cmd.""",
    order=114,
)
def difference_add_one_row(ctx: SuiteContext) -> str:
    launcher = ctx.launcher("the difference add-one-row check")
    datasets = neighbouring_datasets()
    values: dict[str, list[float]] = {}
    clip = DIFFERENCE_CLIP
    for label, rows in datasets.items():
        workdir = launcher.new_workdir("difference-rows-" + label.replace("+", "plus").replace("-", "minus"))
        with launcher.owner(rows, LaunchSettings(dp=False), workdir).start_serving() as owner:
            values[label], clip = exact_differences(owner, len(rows))
    n = {label: len(rows) for label, rows in datasets.items()}
    problems = []
    for i, seed in enumerate(DIFFERENCE_SEEDS):
        base = n["D"] * values["D"][i]
        moves = {"adding": n["D+1"] * values["D+1"][i] - base, "removing": base - n["D-1"] * values["D-1"][i]}
        for what, move in moves.items():
            if not abs(move) <= clip + SUM_TOLERANCE:
                problems.append(f"seed {seed}: {what} one row moved the sum by {move:+.3f}")
    planted = (f"suite-launched owners (DP off) on {n['D']} rows, plus one, minus one; {SAMPLING_METRIC!r} difference "
               f"of a {CANDIDATE_WEIGHTS['3']:g}/{CANDIDATE_WEIGHTS['7']:g} coin from a fair one, "
               f"k={DIFFERENCE_SAMPLES}, clip {clip:g}")
    expect(not problems, f"{planted}: {'; '.join(problems[:4])} (allowed: [-{clip:g}, {clip:g}]): a row's samples "
                         "depend on the other rows, e.g. on its position in the list")
    return f"{planted}: every add/remove moved the exact sum by at most the clip ({len(DIFFERENCE_SEEDS) * 2} cases)"


@check(
    "privacy.difference.noise_calibrated_to_clip",
    title="The noise of a difference release has std noise_std x clip (suite-launched owner, DP on)",
    rationale=f"""A difference release must add Gaussian noise of std z x c to each sum (c the clip), i.e. std
    sigma = GetInfo noise_std x c on the released value: less is a weaker guarantee than declared, more wastes the
    clip. The suite launches an owner (DP on, q = {NOISE_SETTINGS['sample_rate']:g}, epsilon
    {NOISE_SETTINGS['epsilon']:g}) on {NOISE_ROWS} rows and uploads one GPT-2 twice (two ids, identical weights), so
    every row's difference is exactly 0 and each release of the copy against the original, with c =
    {NOISE_CLIP_FRACTION:g} x min(max_clip, 1), is pure noise (far from the clamp at +-1). Over K releases
    (--difference-noise-releases, default 32) sum(v^2) / sigma^2 ~ chi^2(K) must lie in its two-sided {NOISE_ALPHA:g}
    interval (false-failure rate {NOISE_ALPHA:g}): noise calibrated to 1 (sigma / c) or to c / 10 is far outside.
    Needs --launch-cmd.""",
    order=116,
)
def noise_calibrated_to_clip(ctx: SuiteContext) -> str:
    launcher = ctx.launcher("the difference-noise check")
    releases = ctx.options.difference_noise_releases
    settings = LaunchSettings(dp=True, planned_releases=releases + 10, **NOISE_SETTINGS)
    rows = arithmetic_rows(NOISE_ROWS, "difference-noise")
    with launcher.owner(rows, settings, launcher.new_workdir("difference-noise")).start_serving() as owner:
        info = owner.info()
        require_launched_dp(info, True)
        support = launched_support(info)
        metric, clip = support.metrics[0], NOISE_CLIP_FRACTION * min(support.max_clip, 1.0)
        sigma = info.privacy.noise_std * clip
        if not 0 < 6 * sigma < 1:
            raise CheckSkipped(f"the launched owner's noise std on a released difference ({sigma:.3g}) is 0 or so large "
                               "that the clamp to [-1, 1] would shape it")
        files = coin_checkpoint("3", "7", context_for(info.decoding_limits.max_prompt_tokens, 1))
        ids = [owner.upload(files), owner.upload(with_nonce(files, uuid.uuid4().hex))]
        values = np.array([
            owner.evaluate_difference(ids, pb.DecodingSettings(max_new_tokens=1, samples_per_prompt=1, temperature=1.0,
                                                               seed=seed), metric, clip).results[0].accuracy_difference
            for seed in range(releases)])
    ratio = float(np.mean(values**2) / sigma**2)
    low, high = known_mean_variance_interval(releases, NOISE_ALPHA)
    planted = (f"suite-launched owner (DP on), {NOISE_ROWS} rows, q={info.privacy.sample_rate:g}: {releases} {metric!r} "
               f"releases of a copy against its original (every difference 0), clip {clip:.3g}, declared sigma "
               f"{info.privacy.noise_std:.4g} x {clip:.3g} = {sigma:.3g}")
    expect(low <= ratio <= high,
           f"{planted}: mean(v^2) / sigma^2 = {ratio:.3g} outside [{low:.3g}, {high:.3g}] (the {NOISE_ALPHA:g} "
           f"chi-square interval): the noise is as if calibrated to a clip of {clip * math.sqrt(ratio):.3g}, not "
           f"{clip:.3g}")
    return f"{planted}: mean(v^2) / sigma^2 = {ratio:.3g} in [{low:.3g}, {high:.3g}] (false-failure rate {NOISE_ALPHA:g})"
