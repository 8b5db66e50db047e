"""GetInfo and GetBudget: the public card and the budget bookkeeping are sane and consistent."""

from __future__ import annotations

import math

from protocol import PROTOCOL_VERSION
from protocol.conformance.context import SuiteContext
from protocol.conformance.recorder import Received
from protocol.conformance.registry import check, expect
from protocol.conformance.scan import canary_hits
from protocol.conformance.wire import set_field_paths, undeclared_fields
from protocol.generated.target_feedback.v1 import target_feedback_pb2 as pb
from protocol.validation import ALLOWED_ARCHITECTURES, MAX_CHUNK_BYTES

PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt", ".joblib", ".npy", ".npz")
# The declared public fields of GetInfoResponse, written out (not read from the descriptor):
# a field added to the proto must be reviewed for what it reveals before the suite accepts it.
PUBLIC_INFO_FIELDS = frozenset({
    "protocol_version", "task_description", "answer_format", "verifier_kind", "verifier_name", "heldout_size",
    "prompt_template", "chat_template", "chat_format", "test_split_enabled", "test_size", "test_domains",
    "privacy", "privacy.enabled", "privacy.epsilon_budget", "privacy.delta", "privacy.planned_releases",
    "privacy.sample_rate", "privacy.noise_multiplier", "privacy.accountant", "privacy.expected_sample_size",
    "privacy.noise_std", "privacy.per_client_epsilon_cap", "privacy.rows_per_query", "privacy.row_cap_tail",
    "decoding_limits", "decoding_limits.max_new_tokens", "decoding_limits.max_samples_per_prompt",
    "decoding_limits.max_candidates_per_query", "decoding_limits.max_prompt_tokens",
    "upload_limits", "upload_limits.max_checkpoint_bytes", "upload_limits.max_chunk_bytes",
    "upload_limits.allowed_architectures", "upload_limits.allowed_file_names",
    "delta_support", "delta_support.tensor_shards", "delta_support.lora_adapters", "delta_support.max_lora_rank",
    "delta_support.max_adapter_bytes",
    # the kinds of release served and the public settings of difference releases: config facts, no data
    "release_kinds", "difference_support", "difference_support.metrics", "difference_support.max_clip",
    "difference_support.answer_template",
})


def close(a: float, b: float, rel: float = 1e-6, abs_: float = 1e-12) -> bool:
    return math.isclose(a, b, rel_tol=rel, abs_tol=abs_)


def info_problems(info: pb.GetInfoResponse) -> list[str]:
    """Every way the card is inconsistent (empty when sane)."""
    p: list[str] = []
    if info.protocol_version != PROTOCOL_VERSION:
        p.append(f"protocol_version {info.protocol_version!r}, this suite speaks {PROTOCOL_VERSION!r}")
    if info.heldout_size < 1:
        p.append(f"heldout_size {info.heldout_size} < 1")
    p += verifier_problems(info)
    p += rendering_problems(info)
    d = info.decoding_limits
    for name in ("max_new_tokens", "max_samples_per_prompt", "max_candidates_per_query"):
        if getattr(d, name) < 1:
            p.append(f"decoding_limits.{name} = {getattr(d, name)} < 1")
    u = info.upload_limits
    if u.max_checkpoint_bytes < 1:
        p.append(f"upload_limits.max_checkpoint_bytes = {u.max_checkpoint_bytes} < 1")
    if not 0 < u.max_chunk_bytes <= MAX_CHUNK_BYTES:
        p.append(f"upload_limits.max_chunk_bytes = {u.max_chunk_bytes}, must be in (0, {MAX_CHUNK_BYTES}]")
    extra = sorted(set(u.allowed_architectures) - set(ALLOWED_ARCHITECTURES))
    if extra:
        p.append(f"upload_limits.allowed_architectures beyond the protocol allowlist: {extra}")
    for name in u.allowed_file_names:
        if name.lower().endswith(PICKLE_SUFFIXES) or not name.endswith((".json", ".safetensors")):
            p.append(f"upload_limits.allowed_file_names admits {name!r} (only safetensors and JSON are allowed)")
    delta = info.delta_support
    if delta.lora_adapters and not (delta.max_lora_rank >= 1 and delta.max_adapter_bytes >= 1):
        p.append(f"delta_support.lora_adapters is set but max_lora_rank={delta.max_lora_rank}, "
                 f"max_adapter_bytes={delta.max_adapter_bytes}")
    if not delta.lora_adapters and (delta.max_lora_rank or delta.max_adapter_bytes):
        p.append("delta_support: adapter limits are declared but lora_adapters is false")
    if info.test_split_enabled != (info.test_size > 0):
        p.append(f"test_split_enabled={info.test_split_enabled} but test_size={info.test_size}")
    p += release_kind_problems(info)
    p += privacy_problems(info)
    return p


def release_kind_problems(info: pb.GetInfoResponse) -> list[str]:
    """release_kinds and difference_support agree: the difference kind is listed exactly when metrics are
    declared, with a positive finite max_clip and an answer_template that places the answer once."""
    kinds = list(info.release_kinds)
    p = [f"release_kinds holds an unknown or unspecified kind {k}" for k in kinds
         if k not in pb.ReleaseKind.values() or k == pb.RELEASE_KIND_UNSPECIFIED]
    if len(set(kinds)) != len(kinds):
        p.append("release_kinds lists a kind twice")
    if kinds and pb.RELEASE_KIND_ACCURACY not in kinds:
        p.append("release_kinds does not list RELEASE_KIND_ACCURACY, which every v1 server answers")
    support = info.difference_support
    declared = pb.RELEASE_KIND_ACCURACY_DIFFERENCE in kinds
    if declared != bool(support.metrics):
        p.append(f"release_kinds {'lists' if declared else 'does not list'} RELEASE_KIND_ACCURACY_DIFFERENCE but "
                 f"difference_support.metrics is {list(support.metrics) or 'empty'}")
    if support.metrics:
        if not (support.max_clip > 0 and math.isfinite(support.max_clip)):
            p.append(f"difference_support.max_clip {support.max_clip} is not a positive finite number")
        if support.answer_template.count("{answer}") != 1:
            p.append("difference_support.answer_template does not contain {answer} exactly once")
    return p


def verifier_problems(info: pb.GetInfoResponse) -> list[str]:
    """The declared verifier: a known kind; VERIFIER_KIND_NAMED needs verifier_name, PER_EXAMPLE has none."""
    kind, name = info.verifier_kind, info.verifier_name
    if kind not in pb.VerifierKind.values() or kind == pb.VERIFIER_KIND_UNSPECIFIED:
        return [f"verifier_kind {kind} is unspecified or unknown"]
    if kind == pb.VERIFIER_KIND_NAMED and not name.strip():
        return [("verifier_kind is VERIFIER_KIND_NAMED but verifier_name is empty: a trainer cannot tell which "
                 "verifier scores its answers")]
    if kind == pb.VERIFIER_KIND_PER_EXAMPLE and name:
        return ["verifier_kind is VERIFIER_KIND_PER_EXAMPLE (each row names its verifier) but verifier_name is set"]
    return []


def rendering_problems(info: pb.GetInfoResponse) -> list[str]:
    """The published rendering must be one a trainer can reproduce: a prompt_template with
    {prompt}, and a chat_template (if any) that parses as Jinja in a sandboxed environment (the
    parties render it in jinja2's ImmutableSandboxedEnvironment)."""
    problems = []
    if "{prompt}" not in info.prompt_template:
        problems.append("prompt_template does not contain {prompt}")
    if info.chat_format and not info.chat_template:
        problems.append(f"chat_format {info.chat_format!r} is declared but chat_template is empty")
    if info.chat_template:
        from jinja2 import TemplateSyntaxError
        from jinja2.ext import loopcontrols
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        try:
            ImmutableSandboxedEnvironment(extensions=[loopcontrols]).parse(info.chat_template)
        except TemplateSyntaxError as error:
            problems.append(f"chat_template does not parse as Jinja (line {error.lineno}): a trainer cannot "
                            "render prompts the way the owner does")
    return problems


def privacy_problems(info: pb.GetInfoResponse) -> list[str]:
    """Inconsistencies of the declared privacy parameters. Any non-empty accountant name is
    accepted: a third-party server may compose with an accountant this project does not ship,
    and the suite never re-derives epsilon from the name (it checks the budget arithmetic the
    server reports); `accountant_note` says what the suite knows about the name."""
    q, p = info.privacy, []
    if not q.enabled:
        if q.noise_std != 0 or q.noise_multiplier != 0:
            p.append("privacy disabled but a noise std / multiplier is declared")
        return p
    if not (q.epsilon_budget > 0 and math.isfinite(q.epsilon_budget)):
        p.append(f"privacy.epsilon_budget {q.epsilon_budget} is not a positive finite number")
    if not 0 < q.delta < 1.0 / max(info.heldout_size, 1):
        p.append(f"privacy.delta {q.delta:g} is not in (0, 1/heldout_size = {1.0 / max(info.heldout_size, 1):.3g})")
    if q.planned_releases < 1:
        p.append(f"privacy.planned_releases {q.planned_releases} < 1")
    if not 0 < q.sample_rate <= 1:
        p.append(f"privacy.sample_rate {q.sample_rate} not in (0, 1]")
    if not q.noise_multiplier > 0:
        p.append(f"privacy.noise_multiplier {q.noise_multiplier} must be > 0 when DP is on")
    if not q.accountant.strip():
        p.append("privacy.accountant is empty: the card must name the accountant that composes the releases")
    expected = q.sample_rate * info.heldout_size
    if not close(q.expected_sample_size, expected):
        p.append(f"privacy.expected_sample_size {q.expected_sample_size:g} != sample_rate * heldout_size = {expected:g}")
    if q.expected_sample_size > 0 and not close(q.noise_std, q.noise_multiplier / q.expected_sample_size):
        p.append(f"privacy.noise_std {q.noise_std:g} != noise_multiplier / expected_sample_size = "
                 f"{q.noise_multiplier / q.expected_sample_size:g}")
    if q.per_client_epsilon_cap < 0:
        p.append(f"privacy.per_client_epsilon_cap {q.per_client_epsilon_cap} < 0")
    return p


def accountant_note(name: str) -> str:
    """What this suite's accountant registry says about a declared accountant name."""
    from protocol.privacy.accountants import ACCOUNTANTS

    if name not in ACCOUNTANTS:
        return f"accountant {name!r} (not one this suite ships: accepted, its epsilon taken as reported)"
    if ACCOUNTANTS.get(name).valid_privacy_filter:
        return f"accountant {name} (a privacy filter under adaptive composition)"
    return f"accountant {name} (its budget check is heuristic under adaptive composition)"


@check(
    "rpc.get_info.contract",
    title="GetInfo returns a sane, self-consistent public task card",
    rationale="""The trainer plans its budget from GetInfo: protocol_version must match, heldout_size >= 1, limits
    positive, upload allowlists free of pickle formats, and the privacy parameters consistent
    (expected_sample_size = sample_rate * heldout_size, noise_std = noise_multiplier / expected_sample_size,
    delta < 1/heldout_size, a non-empty accountant name: any accountant is accepted, since the suite checks the
    budget arithmetic the server reports, not the accountant's). Two calls must return identical bytes: the card
    is static.""",
    order=10,
)
def get_info_contract(ctx: SuiteContext) -> str:
    info = ctx.info(refresh=True)
    problems = info_problems(info)
    expect(not problems, "; ".join(problems))
    again = ctx.info(refresh=True)
    expect(again.SerializeToString() == info.SerializeToString(), "two GetInfo calls returned different cards")
    q = info.privacy
    dp = (
        f"DP on, eps={q.epsilon_budget:g}, q={q.sample_rate:g}, noise_std={q.noise_std:.4g}, "
        f"{accountant_note(q.accountant)}"
        if q.enabled
        else "DP off"
    )
    return f"heldout_size={info.heldout_size}, {dp}"


@check(
    "rpc.get_info.public_fields_only",
    title="GetInfo carries only the declared public fields",
    rationale="""GetInfo is readable by any authenticated client, so it must reveal nothing derived from held-out data
    beyond the declared public fields. The fields actually set are compared with an explicit allowlist, and the
    raw wire bytes are walked for field numbers the v1 schema does not declare (unknown fields a parser would
    silently keep). The free-text fields must not contain any canary.""",
    order=11,
)
def get_info_public_fields(ctx: SuiteContext) -> str:
    info = ctx.info(refresh=True)
    extra = sorted(set_field_paths(info) - PUBLIC_INFO_FIELDS)
    expect(not extra, f"GetInfo sets fields outside the public allowlist: {extra}")
    undeclared = undeclared_fields(info.SerializeToString(), pb.GetInfoResponse.DESCRIPTOR)
    expect(not undeclared, f"GetInfo carries fields the v1 schema does not declare: {undeclared}")
    text = [Received(f"GetInfo.{name}", getattr(info, name).encode()) for name in
            ("task_description", "answer_format", "prompt_template", "chat_template", "chat_format", "verifier_name")]
    hits = canary_hits(ctx.options.canaries, text)
    expect(not hits, f"canary in the public card: {hits}")
    return f"{len(set_field_paths(info))} fields set, all public"


@check(
    "rpc.get_budget.contract",
    title="GetBudget is consistent with GetInfo and reading it is free",
    rationale="""The budget view must agree with the card (dp_enabled, epsilon_budget, delta, per-client cap), satisfy
    0 <= spent <= budget and spent + remaining = budget, count the caller's spend within the total, and not
    change when read twice (reading the budget spends nothing).""",
    order=12,
)
def get_budget_contract(ctx: SuiteContext) -> str:
    info, first = ctx.info(), ctx.budget()
    second = ctx.budget()
    q = info.privacy
    expect(first.dp_enabled == q.enabled, f"dp_enabled={first.dp_enabled} but GetInfo privacy.enabled={q.enabled}")
    expect(
        (second.epsilon_spent, second.releases_made) == (first.epsilon_spent, first.releases_made),
        "reading the budget twice changed it",
    )
    if not q.enabled:
        expect(first.epsilon_spent == 0 and first.epsilon_budget == 0, "DP disabled but the budget reports spend")
        return "DP disabled: nothing is charged"
    problems = []
    if not close(first.epsilon_budget, q.epsilon_budget):
        problems.append(f"epsilon_budget {first.epsilon_budget:g} != GetInfo {q.epsilon_budget:g}")
    if not close(first.delta, q.delta):
        problems.append(f"delta {first.delta:g} != GetInfo {q.delta:g}")
    if not close(first.client_epsilon_cap, q.per_client_epsilon_cap):
        problems.append(f"client_epsilon_cap {first.client_epsilon_cap:g} != GetInfo {q.per_client_epsilon_cap:g}")
    if not 0 <= first.epsilon_spent <= first.epsilon_budget * (1 + 1e-9):
        problems.append(f"epsilon_spent {first.epsilon_spent:g} outside [0, budget {first.epsilon_budget:g}]")
    if not close(first.epsilon_spent + first.epsilon_remaining, first.epsilon_budget, rel=1e-9, abs_=1e-9):
        problems.append(f"spent {first.epsilon_spent:g} + remaining {first.epsilon_remaining:g} != budget {first.epsilon_budget:g}")
    if first.client_epsilon_spent > first.epsilon_spent * (1 + 1e-9) + 1e-12:
        problems.append(f"client_epsilon_spent {first.client_epsilon_spent:g} exceeds the node total {first.epsilon_spent:g}")
    if first.releases_made < 0 or first.releases_remaining_estimate < 0:
        problems.append("negative release counts")
    expect(not problems, "; ".join(problems))
    return (f"spent {first.epsilon_spent:.4g} of {first.epsilon_budget:g}, {first.releases_made} releases made, "
            f"~{first.releases_remaining_estimate} remain")


def fixed_shape_problems(info: pb.GetInfoResponse) -> list[str]:
    """What is missing or inconsistent in the declared fixed shapes (empty when sound)."""
    from scipy import stats

    p: list[str] = []
    if info.decoding_limits.max_prompt_tokens < 1:
        p.append(f"decoding_limits.max_prompt_tokens = {info.decoding_limits.max_prompt_tokens}: no fixed prompt "
                 "shape is declared")
    q = info.privacy
    if not q.enabled:
        return p
    if q.rows_per_query < q.expected_sample_size:
        p.append(f"privacy.rows_per_query = {q.rows_per_query} < expected_sample_size {q.expected_sample_size:g}: "
                 "no fixed number of rows per query is declared")
    if not 0 <= q.row_cap_tail < 1:
        p.append(f"privacy.row_cap_tail = {q.row_cap_tail:g} is not in [0, 1)")
    elif q.rows_per_query >= 1 and 0 < q.sample_rate <= 1:
        # P(Binomial(N, q) > rows_per_query): the declared tail must not understate it.
        tail = float(stats.binom.sf(q.rows_per_query, info.heldout_size, q.sample_rate))
        if q.row_cap_tail < tail * (1 - 1e-6) - 1e-15:
            p.append(f"privacy.row_cap_tail = {q.row_cap_tail:.3g} understates P(subsample > rows_per_query) = "
                     f"{tail:.3g} for N={info.heldout_size}, q={q.sample_rate:g}")
    return p


@check(
    "info.fixed_shape_declared",
    title="GetInfo declares the public fixed shapes: max_prompt_tokens and, with DP, rows_per_query and row_cap_tail",
    rationale="""A query's time and memory may depend only on public parameters: every prompt is padded or cut to
    decoding_limits.max_prompt_tokens (> 0) and, with DP on, every feedback query evaluates exactly
    privacy.rows_per_query rows (>= expected_sample_size; the Poisson-sampled rows padded with discarded ones).
    privacy.row_cap_tail, the probability that a subsample holds more rows than that, must be in [0, 1) and at least
    P(Binomial(heldout_size, sample_rate) > rows_per_query). A server that declares none of them does not say how
    it keeps the shape of a release independent of the data.""",
    order=14,
)
def fixed_shape_declared(ctx: SuiteContext) -> str:
    info = ctx.info()
    problems = fixed_shape_problems(info)
    expect(not problems, "; ".join(problems))
    q = info.privacy
    rows = f", rows_per_query={q.rows_per_query}, row_cap_tail={q.row_cap_tail:.3g}" if q.enabled else " (DP off)"
    return f"max_prompt_tokens={info.decoding_limits.max_prompt_tokens}{rows}"


@check(
    "info.test_domains_declared",
    title="The test split's domain names are a declared public list, and only they appear as keys",
    rationale="""Per-domain accuracies of the test split are map keys sent verbatim, so their names must be public:
    with the test split enabled GetInfo.test_domains lists them (non-empty, no duplicates) and every
    domain_accuracy key of a test-split Evaluate is in that list; with it disabled the list is empty.""",
    order=15,
)
def test_domains_declared(ctx: SuiteContext) -> str:
    info = ctx.info()
    declared = list(info.test_domains)
    if not info.test_split_enabled:
        expect(not declared, f"the test split is disabled but GetInfo declares test_domains {declared[:5]}")
        return "test split disabled, no domains declared"
    expect(bool(declared), "the test split is enabled but GetInfo.test_domains is empty")
    expect(len(set(declared)) == len(declared), f"GetInfo.test_domains has duplicates: {declared}")
    decoding = pb.DecodingSettings(max_new_tokens=1, samples_per_prompt=1, temperature=0.0, seed=0)
    response = ctx.evaluate(ctx.evaluate_request([ctx.checkpoint_id()], split=pb.SPLIT_TEST, decoding=decoding))
    keys = {key for result in response.results for key in result.domain_accuracy}
    undeclared = sorted(keys - set(declared))
    expect(not undeclared, f"{len(undeclared)} domain_accuracy key(s) not in GetInfo.test_domains")
    return f"{len(declared)} declared domains; the test split's keys are among them"
