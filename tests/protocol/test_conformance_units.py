"""Unit tests of the conformance suite's parts: registry, wire walker, noise bounds, leak and
error-contract judges, the recording interceptor, checkpoints and the CLI."""

from __future__ import annotations

from concurrent import futures

import grpc
import numpy as np
import pytest
from scipy import stats

from protocol import errors
from protocol.cli import main as feedback_protocol
from protocol.conformance import SuiteOptions, all_checks, read_canaries, restart_from_command
from protocol.conformance.checkpoints import checkpoint_id_for, tiny_checkpoint_files, write_checkpoint
from protocol.conformance.checks.info import accountant_note, privacy_problems
from protocol.conformance.connection import plaintext_connection
from protocol.conformance.noise_stats import lower_std_threshold, upper_std_threshold
from protocol.conformance.recorder import Failure, Received, Recorder
from protocol.conformance.registry import CHECKS, Check, check, select_checks
from protocol.conformance.scan import canary_hits, error_contract_problems, protocol_reasons
from protocol.conformance.wire import undeclared_fields
from protocol.generated.target_feedback.v1 import target_feedback_pb2 as pb
from protocol.generated.target_feedback.v1 import target_feedback_pb2_grpc as pb_grpc


def test_registry_has_enough_distinct_documented_checks():
    checks = all_checks()
    assert len(checks) >= 25
    assert len({c.id for c in checks}) == len(checks)
    assert all(c.title and len(c.rationale) >= 40 for c in checks)
    assert checks[-1].id == "budget.exhaustion", "the check that spends the whole budget must run last"


def test_select_checks_by_id_and_prefix_and_refuses_unknown_ids():
    assert [c.id for c in select_checks(["rpc.latency"])] == ["rpc.latency"]
    assert {c.id for c in select_checks(["mtls.*"])} >= {"mtls.plaintext", "mtls.foreign_ca"}
    with pytest.raises(ValueError, match="known checks: .*health.serving"):
        select_checks(["no.such.check"])


def test_checkpoint_id_is_the_owner_content_address():
    from target_owner_node.checkpoint_store import ManifestEntry
    from target_owner_node.checkpoint_store import checkpoint_id_for as owner_id

    entries = [f.entry for f in tiny_checkpoint_files(0)]
    assert checkpoint_id_for(entries) == owner_id([ManifestEntry(e.name, e.size, e.sha256) for e in entries])
    assert checkpoint_id_for(list(reversed(entries))) == checkpoint_id_for(entries)


def test_tiny_checkpoint_passes_the_protocol_validator(tmp_path):
    from protocol.validation import validate_checkpoint_dir

    checked = validate_checkpoint_dir(write_checkpoint(tiny_checkpoint_files(3), tmp_path / "ckpt"))
    assert checked.config["architectures"] == ["Qwen2ForCausalLM"]
    assert tiny_checkpoint_files(3) == tiny_checkpoint_files(3), "the checkpoint is deterministic per seed"


def test_checks_live_in_the_registry_with_one_registration_style(monkeypatch):
    assert [entry.name for entry in CHECKS] == sorted(c.id for c in all_checks())
    assert CHECKS.entry_point_group == "target_feedback.conformance_checks"
    with pytest.raises(ValueError, match="conformance check 'rpc.latency' is already registered"):
        check("rpc.latency", title="again", rationale="x" * 40, order=1)(lambda ctx: None)
    scratch = CHECKS.copy()
    monkeypatch.setattr("protocol.conformance.registry.CHECKS", scratch)

    @check("zz.plugin", title="A plug-in check", rationale="registered by a third party, in its place", order=999)
    def plugin_check(ctx):
        return "seen"

    assert isinstance(plugin_check, Check) and plugin_check(None) == "seen"  # still callable as a function
    assert all_checks()[-2:] == [plugin_check, CHECKS.get("budget.exhaustion")]  # order 999 < 1000
    assert "zz.plugin" not in CHECKS  # the real registry is untouched
    with pytest.raises(TypeError, match="must be a Check"):
        scratch.add("zz.bare", lambda ctx: None)
    with pytest.raises(ValueError, match="registered under another id"):
        scratch.add("zz.other", plugin_check)


def _card(accountant: str) -> pb.GetInfoResponse:
    privacy = pb.PrivacyParameters(
        enabled=True, epsilon_budget=4.0, delta=1e-6, planned_releases=10, sample_rate=0.5, noise_multiplier=2.0,
        accountant=accountant, expected_sample_size=50.0, noise_std=2.0 / 50.0,
    )
    return pb.GetInfoResponse(heldout_size=100, privacy=privacy)


def test_any_named_accountant_is_accepted_and_the_note_says_what_the_suite_knows():
    for name in ("rdp", "prv", "gdp-by-another-vendor"):
        assert privacy_problems(_card(name)) == []
    assert privacy_problems(_card(" ")) == [
        "privacy.accountant is empty: the card must name the accountant that composes the releases"]
    assert "a privacy filter" in accountant_note("rdp")
    assert "heuristic" in accountant_note("prv")
    assert "not one this suite ships" in accountant_note("gdp-by-another-vendor")


def _field(number: int, payload: bytes) -> bytes:
    assert number < 2048 and len(payload) < 128
    tag = (number << 3) | 2
    varint = bytes([tag]) if tag < 128 else bytes([(tag & 0x7F) | 0x80, tag >> 7])
    return varint + bytes([len(payload)]) + payload


def test_undeclared_fields_are_found_at_any_depth():
    info = pb.GetInfoResponse(protocol_version="target_feedback.v1", privacy=pb.PrivacyParameters(enabled=True))
    clean = info.SerializeToString()
    assert undeclared_fields(clean, pb.GetInfoResponse.DESCRIPTOR) == []
    top = clean + _field(99, b"heldout row 17: the answer is 42")
    assert undeclared_fields(top, pb.GetInfoResponse.DESCRIPTOR) == [
        "#99 (wire type 2, 32 bytes): not in target_feedback.v1.GetInfoResponse"]
    nested = _field(6, info.privacy.SerializeToString() + _field(14, b"secret"))
    assert undeclared_fields(nested, pb.GetInfoResponse.DESCRIPTOR)[0].startswith("privacy.#14")
    assert "unparsable" in undeclared_fields(b"\x0a\x7f", pb.GetInfoResponse.DESCRIPTOR)[0]


def test_noise_lower_bound_has_its_stated_false_failure_rate_under_clamping():
    sigma, releases, alpha = 0.1, 20, 0.01
    threshold = lower_std_threshold(sigma, releases, alpha)
    rng = np.random.default_rng(123)  # not the threshold's own seed
    for mu in (0.0, 0.05, 0.5, 1.0):  # clamped at 0, partly clamped, free, clamped at 1
        stds = np.clip(mu + sigma * rng.standard_normal((20_000, releases)), 0, 1).std(axis=1, ddof=1)
        assert (stds < threshold).mean() <= 1.5 * alpha, mu
    without_clamping = sigma * np.sqrt(stats.chi2.ppf(alpha, releases - 1) / (releases - 1))
    assert threshold < without_clamping, "clamping near 0 or 1 must lower the threshold"
    assert upper_std_threshold(sigma, 0.1, 100, releases, alpha) > sigma


def test_canary_hits_cover_case_and_name_where():
    received = [Received("Evaluate error message", b"bad row: canary-XYZ-123"), Received("GetInfo response", b"ok")]
    assert canary_hits(["CANARY-xyz-123"], received) == ["'CANARY-xyz-123' in Evaluate error message"]
    assert canary_hits(["CANARY-xyz-123"], received[1:]) == []


def _failure(code, reason, domain=errors.ERROR_DOMAIN, count=1, matches=True):
    return Failure("/target_feedback.v1.TargetFeedbackService/Evaluate", code, "m", reason is not None, matches,
                   reason, domain if reason else None, count if reason else 0)


def test_error_contract_judge():
    invalid, internal = grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.INTERNAL
    assert errors.UNKNOWN_CHECKPOINT in protocol_reasons() and "ERROR_DOMAIN" not in protocol_reasons()
    assert error_contract_problems([_failure(invalid, errors.UNKNOWN_CHECKPOINT)]) == []
    assert error_contract_problems([_failure(grpc.StatusCode.DEADLINE_EXCEEDED, None)]) == []
    problems = error_contract_problems([
        _failure(internal, None),
        _failure(invalid, "MADE_UP"),
        _failure(invalid, errors.PRIVACY_BUDGET_EXHAUSTED),
        _failure(invalid, errors.UNKNOWN_CHECKPOINT, domain="elsewhere"),
        _failure(invalid, errors.UNKNOWN_CHECKPOINT, count=2),
        _failure(invalid, errors.UNKNOWN_CHECKPOINT, matches=False),
    ])
    expected = ["carries no google.rpc.ErrorInfo", "not one of protocol/errors.py", "belongs with RESOURCE_EXHAUSTED",
                "ErrorInfo.domain is 'elsewhere'", "2 ErrorInfo details", "disagrees with the call"]
    assert len(problems) == len(expected)
    assert all(words in problem for words, problem in zip(expected, problems)), problems


class _FailingServicer(pb_grpc.TargetFeedbackServiceServicer):
    def GetInfo(self, request, context):
        context.send_initial_metadata((("x-debug", "header-CANARY-meta-1"),))
        error = errors.invalid(errors.UNKNOWN_CHECKPOINT, "no such checkpoint CANARY-msg-2")
        context.abort_with_status(error.to_status())


def test_recorder_keeps_messages_details_and_metadata_of_failed_calls():
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    pb_grpc.add_TargetFeedbackServiceServicer_to_server(_FailingServicer(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    recorder = Recorder()
    try:
        with plaintext_connection(f"127.0.0.1:{port}", recorder) as connection, pytest.raises(grpc.RpcError):
            connection.stub.GetInfo(pb.GetInfoRequest(), timeout=5)
    finally:
        server.stop(None)
    [failure] = recorder.failures
    assert (failure.code, failure.reason, failure.domain) == (
        grpc.StatusCode.INVALID_ARGUMENT, errors.UNKNOWN_CHECKPOINT, errors.ERROR_DOMAIN)
    wheres = {item.where for item in recorder.received}
    assert {"GetInfo error message", "GetInfo trailing metadata grpc-status-details-bin"} <= wheres
    hits = canary_hits(["CANARY-meta-1", "CANARY-msg-2"], recorder.received)
    assert "'CANARY-meta-1' in GetInfo initial metadata x-debug" in hits
    assert "'CANARY-msg-2' in GetInfo trailing metadata grpc-status-details-bin" in hits


def test_cli_lists_checks_and_refuses_bad_usage(tmp_path, capsys):
    assert feedback_protocol(["conformance", "--list"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == len(all_checks())
    assert feedback_protocol(["conformance", "--target", "127.0.0.1:1"]) == 2
    assert "--ca, --cert, --key required" in capsys.readouterr().err
    pem = tmp_path / "x.pem"
    pem.write_text("x")
    args = ["conformance", "--target", "127.0.0.1:1", "--ca", str(pem), "--cert", str(pem), "--key", str(pem)]
    assert feedback_protocol(args + ["--only", "nope"]) == 2
    assert "unknown conformance check 'nope'" in capsys.readouterr().err


def test_options_and_helpers_validate_their_inputs(tmp_path):
    with pytest.raises(ValueError, match="noise_releases"):
        SuiteOptions(target="h:1", ca=tmp_path, cert=tmp_path, key=tmp_path, noise_releases=2)
    (tmp_path / "short.txt").write_text("abc\n")
    with pytest.raises(ValueError, match="at least 6 characters"):
        read_canaries(tmp_path / "short.txt")
    (tmp_path / "ok.txt").write_text("CANARY-one\n\n  CANARY-two  \n")
    assert read_canaries(tmp_path / "ok.txt") == ["CANARY-one", "CANARY-two"]
    with pytest.raises(RuntimeError, match="exited 3"):
        restart_from_command("exit 3")()
