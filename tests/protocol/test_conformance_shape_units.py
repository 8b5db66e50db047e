"""Unit tests of issue 11's conformance parts: the timing statistics (false-failure rate with
simulated latencies), the launch contract, the fixed-output checkpoints, held-out files, the
tokenizer attack builder and the fixed-shape judge."""

from __future__ import annotations

import json
import sys
import time

import numpy as np
import pytest

from protocol.conformance.checkpoints import (
    embedding_rows,
    file_data,
    tiny_checkpoint_files,
    with_added_token,
    write_checkpoint,
)
from protocol.conformance.checks.info import fixed_shape_problems
from protocol.conformance.checks.shape import LATENCY_ALPHA, LATENCY_HITS, LATENCY_ROWS, neighbouring_datasets
from protocol.conformance.fixed_output_model import coin_checkpoint, constant_checkpoint
from protocol.conformance.heldout_file import HeldoutRow, arithmetic_rows, write_heldout
from protocol.conformance.launcher import (
    LaunchedOwner,
    LaunchSettings,
    LaunchTemplate,
    LedgerPathTemplate,
    free_port,
)
from protocol.conformance.options import SuiteOptions
from protocol.conformance.timing_stats import correlation_threshold, steady_latencies
from protocol.generated.target_feedback.v1 import target_feedback_pb2 as pb

CALLS = 60   # the latency check's default K


def _pearson_rows(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    x = x - x.mean(axis=1, keepdims=True)
    y = y - y.mean(axis=1, keepdims=True)
    return (x * y).sum(axis=1) / np.sqrt((x * x).sum(axis=1) * (y * y).sum(axis=1))


def _released(hits: np.ndarray, rng: np.random.Generator, z: float = 0.75) -> np.ndarray:
    """What the check's owner releases: (hits in the subsample + noise) / (q N), clamped."""
    return np.clip((hits + rng.normal(0, z, hits.shape)) / (0.5 * LATENCY_ROWS), 0, 1)


def _noisy_machine(rng: np.random.Generator, shape: tuple[int, int], base_s: float, spike_rate: float = 0.05,
                   spike_s: float = 0.5) -> np.ndarray:
    """Latencies of fixed work on a shared machine: drifting load, log-normal jitter, scheduler spikes.
    The defaults give a coefficient of variation near 1.3; this 2-core machine, shared by several test
    runs, measured 0.4-0.6 for the check's owner (60-95 ms per call)."""
    drift = np.exp(np.cumsum(rng.normal(0, 0.08, shape), axis=1))
    jitter = rng.lognormal(0, 0.35, shape)
    spikes = (rng.random(shape) < spike_rate) * rng.exponential(spike_s, shape)
    return base_s * drift * jitter + spikes


def test_latency_threshold_false_failure_rate_on_a_noisy_machine():
    rng = np.random.default_rng(11)
    trials = 20_000
    hits = rng.binomial(LATENCY_HITS, 0.5, (trials, CALLS)).astype(float)
    values = _released(hits, rng)
    r = _pearson_rows(values, steady_latencies(_noisy_machine(rng, values.shape, 0.06)))
    # The check's own threshold: 2 false failures expected in 20000; 10 or more has probability < 1e-5.
    assert np.sum(np.abs(r) >= correlation_threshold(CALLS, LATENCY_ALPHA)) < 10
    # Where the rate is measurable: alpha = 1% must give 200 +- 3 sd (14) of 20000.
    observed = int(np.sum(np.abs(r) >= correlation_threshold(CALLS, 0.01)))
    assert 150 <= observed <= 250, observed


def test_latency_check_fails_a_server_whose_time_grows_per_sampled_row():
    rng = np.random.default_rng(12)
    trials = 2_000
    hits = rng.binomial(LATENCY_HITS, 0.5, (trials, CALLS)).astype(float)
    sampled = hits + rng.binomial(LATENCY_ROWS - LATENCY_HITS, 0.5, hits.shape)
    # 10 ms per sampled row (the broken server's sleep) beside fixed work as noisy as measured here (cv ~0.6).
    latencies = _noisy_machine(rng, hits.shape, 0.07, spike_rate=0.02, spike_s=0.2) + 0.010 * sampled
    r = _pearson_rows(_released(hits, rng), steady_latencies(latencies))
    assert np.mean(np.abs(r) >= correlation_threshold(CALLS, LATENCY_ALPHA)) > 0.95


def test_correlation_threshold_is_the_t_quantile():
    from scipy import stats

    t = stats.t.ppf(1 - LATENCY_ALPHA / 2, CALLS - 2)
    r = correlation_threshold(CALLS, LATENCY_ALPHA)
    assert r * np.sqrt((CALLS - 2) / (1 - r * r)) == pytest.approx(t)
    assert 0.4 < r < 0.55
    with pytest.raises(ValueError, match="at least 4"):
        correlation_threshold(3, 0.01)


def test_launch_template_names_missing_and_unknown_placeholders():
    with pytest.raises(ValueError, match=r"--launch-cmd: the template must use \{ca_cert\}"):
        LaunchTemplate("owner --data {heldout} --port {port} --dir {workdir} --cert {server_cert} --key {server_key}")
    with pytest.raises(ValueError, match=r"unknown placeholder\(s\) \{data\}"):
        LaunchTemplate("owner {data} {heldout} {port} {workdir} {ca_cert} {server_cert} {server_key}")
    with pytest.raises(ValueError, match=r"--ledger-path: the template must use \{workdir\}"):
        LedgerPathTemplate("/var/ledger.jsonl")
    with pytest.raises(ValueError, match="--launch-cmd"):
        SuiteOptions(target="x:1", ca="a", cert="b", key="c", launch_cmd="owner {heldout}")


def test_launch_template_quotes_values_and_expands_owner_options():
    template = LaunchTemplate("owner {heldout} {port} {workdir} {ca_cert} {server_cert} {server_key} {dp} "
                              "{owner_options}")
    values = {"heldout": "/tmp/a b/h.jsonl", "port": "5", "workdir": "/w", "ca_cert": "/c", "server_cert": "/s",
              "server_key": "/k", **LaunchSettings(dp=False, sample_rate=0.5, epsilon=8.0,
                                                   planned_releases=9).placeholders()}
    assert template.render(values) == ("owner '/tmp/a b/h.jsonl' 5 /w /c /s /k false --sample-rate 0.5 --epsilon 8.0 "
                                       "--planned-releases 9 --no-dp")
    assert str(LedgerPathTemplate("{workdir}/storage/l.jsonl").path("/w x")) == "/w x/storage/l.jsonl"


def _owner(tmp_path, command: str, timeout_s: float = 5.0) -> LaunchedOwner:
    from protocol.conformance.connection import Identity
    from protocol.conformance.launcher import LaunchPki

    pki = LaunchPki.create(tmp_path / "pki")
    return LaunchedOwner(command, free_port(), tmp_path, Identity.from_files(pki.ca_cert, pki.client_cert,
                                                                             pki.client_key),
                         tmp_path / "owner.log", timeout_s)


def test_a_launch_that_exits_is_reported_with_its_code(tmp_path):
    with _owner(tmp_path, "echo refusing to start; exit 3") as owner:
        outcome = owner.start()
    assert not outcome.serving and outcome.exit_code == 3
    assert "exited with code 3" in outcome.describe()
    assert "refusing to start" in owner.log_hint()


def test_a_launch_that_never_serves_times_out_and_its_process_group_is_stopped(tmp_path):
    pidfile = tmp_path / "child.pid"
    # The shell starts a background child: stopping must end the whole process group.
    with _owner(tmp_path, f"sleep 60 & echo $! > {pidfile}; wait", timeout_s=1.5) as owner:
        outcome = owner.start()
        assert not outcome.serving and outcome.exit_code is None
        assert "not SERVING within" in outcome.describe()
    child = int(pidfile.read_text())
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and _alive(child):
        time.sleep(0.05)
    assert not _alive(child)


def _alive(pid: int) -> bool:
    from pathlib import Path

    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False


def test_heldout_files_are_read_by_the_project_example_reader(tmp_path):
    from rlvr_core.tasks.io import read_examples

    rows = arithmetic_rows(5) + [HeldoutRow("extra", "Say 7.", "7")]
    examples = read_examples(write_heldout(tmp_path / "h.jsonl", rows))
    assert [(e.id, e.prompt, e.answer, e.verifier) for e in examples] == [
        (r.id, r.prompt, r.answer, "exact_match") for r in rows]


def test_neighbouring_datasets_keep_row_ids_with_their_rows():
    sets = neighbouring_datasets()
    base = {r.id: r for r in sets["D"]}
    assert len(sets["D+1"]) == len(base) + 1 and len(sets["D-1"]) == len(base) - 1
    assert all(base[r.id] == r for r in sets["D+1"] + sets["D-1"] if r.id in base)
    assert {r.answer for r in sets["D"]} == {"3", "7"}


def test_added_token_is_out_of_range_and_hits_only_the_marker():
    from tokenizers import Tokenizer

    files = tiny_checkpoint_files(0)
    rows = embedding_rows(files)
    patched, token_id = with_added_token(files, "zqjmarker")
    assert token_id == rows == json.loads(file_data(files, "config.json"))["vocab_size"]
    tokenizer = Tokenizer.from_str(file_data(patched, "tokenizer.json").decode())
    assert token_id in tokenizer.encode("What is 3 + 4? zqjmarker").ids
    assert max(tokenizer.encode("What is 3 + 4?").ids) < rows


def test_fixed_shape_judge():
    def info(**privacy) -> pb.GetInfoResponse:
        return pb.GetInfoResponse(heldout_size=100, decoding_limits=pb.DecodingLimits(max_prompt_tokens=64),
                                  privacy=pb.PrivacyParameters(enabled=True, sample_rate=0.5,
                                                               expected_sample_size=50.0, **privacy))

    assert fixed_shape_problems(info(rows_per_query=80, row_cap_tail=1e-9)) == []
    assert "max_prompt_tokens = 0" in fixed_shape_problems(pb.GetInfoResponse())[0]
    assert "rows_per_query = 40 < expected_sample_size" in fixed_shape_problems(info(rows_per_query=40))[0]
    assert "understates" in fixed_shape_problems(info(rows_per_query=55, row_cap_tail=1e-6))[0]
    assert "not in [0, 1)" in fixed_shape_problems(info(rows_per_query=80, row_cap_tail=1.0))[0]


# -- the fixed-output GPT-2 through the project's own loader and engine (torch) ----------------------
@pytest.fixture(scope="module")
def engines(tmp_path_factory):
    from protocol.validation import validate_checkpoint_dir
    from rlvr_core.engines.registry import build_engine
    from rlvr_core.models.loading import load_policy

    built = {}
    for name, files in (("coin", coin_checkpoint("3", "7", 256)), ("constant", constant_checkpoint("7", 256))):
        path = write_checkpoint(files, tmp_path_factory.mktemp(name) / "ckpt")
        validate_checkpoint_dir(path)
        model, tokenizer = load_policy(path)
        built[name] = (build_engine("transformers", model, tokenizer, device="cpu", batch_size=4), model)
    return built


PROMPTS = ["What is 3 + 4?", "x", "a much longer prompt, " * 20]


def test_coin_checkpoint_samples_its_two_tokens_whatever_the_prompt(engines):
    from rlvr_core.engines.base import SamplingParams

    engine, _ = engines["coin"]
    for temperature in (1.0, 2.0, 10.0):
        texts = [s.text for row in engine.generate(PROMPTS, 64, SamplingParams(1, temperature, 1.0, 3)) for s in row]
        assert set(texts) == {"3", "7"}
        assert 0.35 < texts.count("7") / len(texts) < 0.65


def test_constant_checkpoint_emits_its_token_at_every_step(engines):
    from rlvr_core.engines.base import SamplingParams

    engine, _ = engines["constant"]
    rows = engine.generate(PROMPTS, 2, SamplingParams(max_new_tokens=8, temperature=0.0, seed=0))
    assert {s.text for row in rows for s in row} == {"7" * 8}


def test_fixed_output_logits_do_not_depend_on_prompt_or_padding(engines):
    import torch

    _, model = engines["coin"]
    ids = torch.tensor([[0, 0, 0, 5, 9, 17], [3, 4, 5, 6, 7, 8]])
    mask = torch.tensor([[0, 0, 0, 1, 1, 1], [1, 1, 1, 1, 1, 1]])
    with torch.inference_mode():
        logits = model(input_ids=ids, attention_mask=mask).logits
    assert torch.equal(logits[0, -1], logits[1, -1]) and torch.equal(logits[1, 2], logits[1, -1])


def test_fixed_output_config_holds_only_keys_transformers_writes():
    from transformers import GPT2Config

    written = set(GPT2Config().to_dict()) | {"architectures", "dtype"}
    config = json.loads(file_data(constant_checkpoint("7", 128), "config.json"))
    assert set(config) <= written, set(config) - written


def test_harness_launch_command_fills_as_a_launch_template():
    from tests.protocol import conformance_harness as harness

    template = LaunchTemplate(harness.launch_command("none"))
    assert template.template.startswith(sys.executable)
    LedgerPathTemplate(harness.LEDGER_PATH)
