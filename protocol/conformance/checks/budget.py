"""Budget behaviour over time: idempotency, concurrency, monotonic spend, restarts, exhaustion."""

from __future__ import annotations

import threading
from itertools import pairwise

import grpc

from protocol import errors
from protocol.conformance.checks.info import close
from protocol.conformance.context import SuiteContext
from protocol.conformance.recorder import Failure, describe_failure
from protocol.conformance.registry import CheckSkipped, check, expect
from protocol.conformance.scan import canary_hits, error_contract_problems
from protocol.generated.target_feedback.v1 import target_feedback_pb2 as pb


def same_release(a: pb.EvaluateResponse, b: pb.EvaluateResponse) -> bool:
    return (
        [(r.checkpoint_id, r.accuracy) for r in a.results] == [(r.checkpoint_id, r.accuracy) for r in b.results]
        and a.release_id == b.release_id
        and a.privacy.epsilon_this_release == b.privacy.epsilon_this_release
    )


@check(
    "budget.idempotent_request_id",
    title="The same request_id twice returns the same release, charged once",
    rationale="""Clients retry UNAVAILABLE with the same request_id; the owner must return the recorded release
    (same values, same release_id) instead of evaluating and charging again - otherwise every network hiccup
    spends budget and hands out a second independent noisy value.""",
    order=70,
)
def idempotent_request_id(ctx: SuiteContext) -> str:
    ctx.require_releases(1, "the idempotency check")
    request = ctx.evaluate_request([ctx.checkpoint_id()])
    before = ctx.budget()
    first = ctx.evaluate(request)
    middle = ctx.budget()
    second = ctx.evaluate(request)
    after = ctx.budget()
    expect(same_release(first, second), f"a replayed request_id returned a different release: "
                                        f"{first.results[0].accuracy!r}/{first.release_id} then "
                                        f"{second.results[0].accuracy!r}/{second.release_id}")
    if ctx.dp_enabled:
        expect(middle.releases_made == before.releases_made + 1, "the first request did not count one release")
        expect(after.epsilon_spent == middle.epsilon_spent and after.releases_made == middle.releases_made,
               f"the replay was charged again: spent {middle.epsilon_spent:.6g} -> {after.epsilon_spent:.6g}")
    return f"replay returned release {first.release_id[:12]}... unchanged, charged once"


@check(
    "budget.concurrent_clients",
    title="Concurrent clients get no errors and cause no double spend",
    rationale="""N clients (separate channels, released together by a barrier) each ask for one release. All must
    succeed; GetBudget must grow by exactly the sum of their epsilon_this_release and releases_made by N; every
    release must report a distinct epsilon_spent_total (each saw its own ledger position: the check-and-charge
    is atomic).""",
    order=72,
)
def concurrent_clients(ctx: SuiteContext) -> str:
    n = ctx.options.concurrency
    ctx.require_releases(n + 1, f"{n} concurrent releases")
    checkpoint_id = ctx.checkpoint_id()
    connections = [ctx.connect(unique=f"concurrent-{i}") for i in range(n)]
    barrier = threading.Barrier(n)
    responses: list[pb.EvaluateResponse | None] = [None] * n
    failures: list[Failure | str | None] = [None] * n

    def client(i: int) -> None:
        try:
            barrier.wait(timeout=30)
            responses[i] = ctx.evaluate(ctx.evaluate_request([checkpoint_id]), connection=connections[i])
        except grpc.RpcError as error:
            failures[i] = describe_failure("Evaluate", error)
        except Exception as error:  # noqa: BLE001 - reported as a failure of this client
            failures[i] = f"{type(error).__name__}: {error}"

    before = ctx.budget()
    threads = [threading.Thread(target=client, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(ctx.options.evaluate_deadline_s + 30)
    after = ctx.budget()
    for connection in connections:
        connection.close()
    errors_seen = [f if isinstance(f, str) else f"{f.code.name} {f.reason}" for f in failures if f is not None]
    expect(not errors_seen, f"{len(errors_seen)} of {n} concurrent releases failed: {errors_seen[:3]}")
    expect(all(r is not None for r in responses), "a concurrent client did not finish")
    if not ctx.dp_enabled:
        return f"{n} concurrent exact evaluations succeeded"
    total = sum(r.privacy.epsilon_this_release for r in responses)
    grew = after.epsilon_spent - before.epsilon_spent
    expect(after.releases_made == before.releases_made + n,
           f"releases_made grew by {after.releases_made - before.releases_made}, expected {n}")
    expect(close(grew, total, rel=1e-6, abs_=1e-9),
           f"spent grew by {grew:.6g} but the releases report {total:.6g} in total (double or lost spend)")
    positions = {r.privacy.epsilon_spent_total for r in responses}
    expect(len(positions) == n, f"only {len(positions)} distinct epsilon_spent_total values among {n} releases")
    expect(len({r.release_id for r in responses}) == n, "two concurrent releases share a release_id")
    return f"{n} concurrent releases, spend grew by {grew:.4g} = sum of their charges"


@check(
    "budget.monotonic",
    title="Spend is monotonic and never exceeds the budget",
    rationale="""Over consecutive releases GetBudget's epsilon_spent strictly increases, equals each release's
    epsilon_spent_total, and stays <= epsilon_budget; across every release seen in this run no two share a ledger
    position and none reports a total above the budget.""",
    order=80,
)
def spend_monotonic(ctx: SuiteContext) -> str:
    ctx.require_dp()
    ctx.require_releases(3, "the monotonic-spend check")
    budget_total = ctx.info().privacy.epsilon_budget
    spent = [ctx.budget().epsilon_spent]
    for _ in range(3):
        response = ctx.release()
        now = ctx.budget().epsilon_spent
        expect(close(now, response.privacy.epsilon_spent_total, rel=1e-9, abs_=1e-9),
               f"GetBudget {now:.6g} != the release's epsilon_spent_total {response.privacy.epsilon_spent_total:.6g}")
        spent.append(now)
    expect(all(b > a for a, b in pairwise(spent)), f"spend is not strictly increasing: {spent}")
    expect(spent[-1] <= budget_total * (1 + 1e-9), f"spent {spent[-1]:.6g} exceeds the budget {budget_total:g}")
    seen = {r.release_id: r.privacy.epsilon_spent_total for r in ctx.releases}
    over = [t for t in seen.values() if t > budget_total * (1 + 1e-9)]
    expect(not over, f"a release reported epsilon_spent_total {max(over, default=0):.6g} above the budget")
    expect(len(set(seen.values())) == len(seen), "two distinct releases report the same epsilon_spent_total")
    return f"spent {' < '.join(f'{s:.4g}' for s in spent)} <= {budget_total:g}; {len(seen)} releases consistent"


@check(
    "budget.persists_across_restart",
    title="The spent budget survives a restart",
    rationale="""The ledger is written durably before a value is released; after a restart (--restart-cmd) the
    server must report at least the spend and the release count it had before. A server that forgets its
    ledger hands out a fresh budget on every restart.""",
    order=90,
)
def persists_across_restart(ctx: SuiteContext) -> str:
    ctx.require_dp()
    if ctx.options.restart is None:
        raise CheckSkipped("no --restart-cmd given: the suite cannot restart the server")
    seen = ctx.restart_once()
    before, after = seen.before, seen.after
    expect(after.epsilon_spent >= before.epsilon_spent - 1e-12,
           f"after the restart epsilon_spent is {after.epsilon_spent:.6g}, before it was {before.epsilon_spent:.6g}")
    expect(after.releases_made >= before.releases_made,
           f"after the restart releases_made is {after.releases_made}, before it was {before.releases_made}")
    expect(before.epsilon_spent > 0, "nothing had been spent before the restart, so persistence was not exercised")
    return f"spent {before.epsilon_spent:.4g} before, {after.epsilon_spent:.4g} after the restart"


@check(
    "budget.idempotency_after_restart",
    title="A request_id released before a restart replays after it, uncharged",
    rationale="""A client retries UNAVAILABLE - which is what a restart looks like - with the same request_id. The
    recorded release must come back unchanged after the restart and cost nothing: idempotency records are as
    durable as the budget.""",
    order=91,
)
def idempotency_after_restart(ctx: SuiteContext) -> str:
    ctx.require_dp()
    if ctx.options.restart is None:
        raise CheckSkipped("no --restart-cmd given: the suite cannot restart the server")
    seen = ctx.restart_once()
    if seen.release_request is None:
        raise CheckSkipped("no budget was left for a release before the restart")
    ctx.checkpoint_id()  # re-upload if the restart lost it (content addressing: cheap)
    with ctx.budget_unchanged("replaying a pre-restart request_id"):
        replay = ctx.evaluate(seen.release_request)
    expect(same_release(seen.release_before, replay),
           f"the replay after the restart differs: {seen.release_before.results[0].accuracy!r} / "
           f"{seen.release_before.release_id} then {replay.results[0].accuracy!r} / {replay.release_id}")
    return "pre-restart release replayed unchanged, not charged"


@check(
    "budget.exhaustion",
    title="At exhaustion releases are refused with RESOURCE_EXHAUSTED / PRIVACY_BUDGET_EXHAUSTED",
    rationale="""Spending the remaining budget one release at a time, the spend never exceeds the budget and the
    first refused release is RESOURCE_EXHAUSTED with reason PRIVACY_BUDGET_EXHAUSTED (or CLIENT_BUDGET_EXHAUSTED
    under a per-client cap); later attempts are refused too, refusals cost nothing, the estimate of remaining
    releases is 0, and the server keeps answering GetInfo and health. Opt-in (--allow-exhaust): it spends the
    server's whole remaining budget, so it runs last.""",
    order=1000,
)
def exhaustion(ctx: SuiteContext) -> str:
    if not ctx.options.allow_exhaust:
        raise CheckSkipped("opt-in: pass --allow-exhaust to spend the server's whole remaining budget")
    ctx.require_dp()
    mark = ctx.recorder.mark()
    start = ctx.budget()
    budget_total = start.epsilon_budget
    if start.releases_remaining_estimate > ctx.options.max_exhaust_releases:
        raise CheckSkipped(f"exhausting needs ~{start.releases_remaining_estimate} releases, above the "
                           f"limit of {ctx.options.max_exhaust_releases}; use a smaller budget for this check")
    checkpoint_id = ctx.checkpoint_id()
    refusal, made = None, 0
    for _ in range(start.releases_remaining_estimate + 20):
        try:
            response = ctx.release([checkpoint_id])
        except grpc.RpcError as error:
            refusal = describe_failure("Evaluate", error)
            break
        made += 1
        expect(response.privacy.epsilon_spent_total <= budget_total * (1 + 1e-9),
               f"release {made} brought the spend to {response.privacy.epsilon_spent_total:.6g} > {budget_total:g}")
    expect(refusal is not None, f"still releasing {made} releases after an estimate of {start.releases_remaining_estimate}")
    allowed = (errors.PRIVACY_BUDGET_EXHAUSTED, errors.CLIENT_BUDGET_EXHAUSTED)
    expect(refusal.code == grpc.StatusCode.RESOURCE_EXHAUSTED and refusal.reason in allowed,
           f"the refusal was {refusal.code.name} {refusal.reason}, expected RESOURCE_EXHAUSTED PRIVACY_BUDGET_EXHAUSTED")
    at_refusal = ctx.budget()
    expect(at_refusal.epsilon_spent <= budget_total * (1 + 1e-9), f"spent {at_refusal.epsilon_spent:.6g} > budget")
    with ctx.budget_unchanged("refused releases"):
        for _ in range(2):
            ctx.expect_error(lambda: ctx.release([checkpoint_id]), grpc.StatusCode.RESOURCE_EXHAUSTED, allowed,
                             "a release after exhaustion")
    if refusal.reason == errors.PRIVACY_BUDGET_EXHAUSTED:
        expect(at_refusal.releases_remaining_estimate == 0,
               f"releases_remaining_estimate is {at_refusal.releases_remaining_estimate} at exhaustion")
    ctx.info(refresh=True)
    expect(ctx.conn.health_status() == "SERVING", "health is not SERVING after exhaustion")
    hits = canary_hits(ctx.options.canaries, ctx.recorder.received_since(mark))
    expect(not hits, f"canary leaked while exhausting: {hits[:3]}")
    problems = error_contract_problems(ctx.recorder.failures_since(mark))
    expect(not problems, f"error contract broken at exhaustion: {problems[:3]}")
    return f"{made} releases then {refusal.reason}; spent {at_refusal.epsilon_spent:.4g} of {budget_total:g}"


@check(
    "budget.ledger_deletion_detected",
    title="Deleting the ledger file does not reset the budget (suite-launched owner)",
    rationale="""The suite launches an owner (DP on), makes one DP release, stops it, deletes the file that
    --ledger-path names, and launches the same owner again on the same work folder. It must refuse to start
    (exit, or never report SERVING within the launch timeout) or report an epsilon_spent and releases_made at
    least as large as before: a node that starts with a fresh budget when its ledger is gone lets every
    deletion buy a new budget. Nothing is restored afterwards (the folder is the suite's). Needs --launch-cmd and
    --ledger-path.""",
    order=115,
)
def ledger_deletion_detected(ctx: SuiteContext) -> str:
    from protocol.conformance.checkpoints import tiny_checkpoint_files
    from protocol.conformance.heldout_file import arithmetic_rows
    from protocol.conformance.launcher import LaunchSettings

    launcher = ctx.launcher("the ledger-deletion check")
    if launcher.ledger_path is None:
        raise CheckSkipped("no --ledger-path given: the suite does not know which file is the launched owner's ledger")
    rows, settings = arithmetic_rows(40, "ledger"), LaunchSettings(dp=True, sample_rate=0.5, planned_releases=20)
    workdir = launcher.new_workdir("ledger")
    decoding = pb.DecodingSettings(max_new_tokens=1, samples_per_prompt=1, temperature=0.0, seed=0)
    with launcher.owner(rows, settings, workdir).start_serving() as owner:
        if not owner.info().privacy.enabled:
            raise CheckSkipped("the launched owner runs with DP off although the launch asked for {dp}=true")
        owner.evaluate([owner.upload(tiny_checkpoint_files(0))], decoding)
        before = owner.budget()
    ledger = launcher.ledger_path.path(workdir)
    expect(ledger.is_file(), f"after a DP release the launched owner has no file at --ledger-path {ledger}: "
                             "the template does not name its ledger")
    ledger.unlink()
    where = f"suite-launched owner relaunched after deleting {ledger.name}"
    with launcher.owner(rows, settings, workdir) as owner:
        outcome = owner.start()
        if not outcome.serving:
            return f"{where}: it refused to start ({outcome.describe()}); spent {before.epsilon_spent:.4g} before"
        after = owner.budget()
    expect(after.epsilon_spent >= before.epsilon_spent - 1e-12 and after.releases_made >= before.releases_made,
           f"{where}: it started and reports epsilon_spent {after.epsilon_spent:.6g} and {after.releases_made} releases; "
           f"before the deletion {before.epsilon_spent:.6g} and {before.releases_made}: deleting the ledger reset the budget")
    return f"{where}: it serves and still reports spent {after.epsilon_spent:.4g} >= {before.epsilon_spent:.4g}"
