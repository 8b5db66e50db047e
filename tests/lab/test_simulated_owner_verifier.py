"""The simulated owner's feedback-split verifier (issue 19): `simulated_owner.feedback_verifier` in a
simulate or bench config sets the owner's data.feedback_verifier; the owner's worker then scores
the feedback split with that (noisy) verifier and the test split exactly."""

from __future__ import annotations

import json
import multiprocessing

import numpy as np
import pytest

from lab.bench.spec import BenchSpecError, load_profile, parse_spec, plan_runs, run_config
from lab.owner_process import init_owner
from lab.simulate import SimulateOptions, resolve_config
from rlvr_core.configuration import load_toml
from rlvr_core.scoring import Decoding
from target_owner_node.config import ConfigError as OwnerConfigError
from target_owner_node.config import load_config
from target_owner_node.node import worker_spec
from target_owner_node.worker import worker_main
from trainer_node.config import ConfigError, parse_config, with_overrides

NOISY = {"name": "noisy_flip", "flip_rate": 0.2}


def _simulate_config(value):
    from lab.configs import simulate_defaults_path

    return parse_config(with_overrides(load_toml(simulate_defaults_path()),
                                       {"simulated_owner.feedback_verifier": value}))


def test_default_is_the_exact_verifier_and_the_resolved_config_records_the_choice(tmp_path):
    assert resolve_config(SimulateOptions()).simulated_owner.feedback_verifier is None
    config = _simulate_config(NOISY)
    assert config.simulated_owner.feedback_verifier == NOISY
    resolved = config.save_resolved(tmp_path).read_text()
    assert '"simulated_owner"' in resolved and '"flip_rate": 0.2' in resolved
    assert _simulate_config("stochastic_grader").simulated_owner.feedback_verifier == "stochastic_grader"


@pytest.mark.parametrize("value,field", [
    ("nosy", r"simulated_owner\.feedback_verifier\.name: unknown verifier 'nosy'"),
    ({"name": "noisy_flip", "flip_rate": 0.7}, r"simulated_owner\.feedback_verifier\.flip_rate"),
    ({"name": "noisy_flip", "flip": 0.1}, r"simulated_owner\.feedback_verifier\.flip: .*'flip_rate'"),
    ({"flip_rate": 0.1}, r"simulated_owner\.feedback_verifier\.name"),
])
def test_a_bad_value_names_the_field(value, field):
    with pytest.raises(ConfigError, match=field):
        _simulate_config(value)


def test_a_bench_method_sets_it_and_a_bad_one_fails_when_the_spec_loads():
    spec = load_profile("noisy_grader_short")
    methods = {m.label: m for m in spec.methods}
    noisy = run_config(spec, methods["l2rr_owner_noisy"], "noisy", 0)
    exact = run_config(spec, methods["l2rr_owner_exact"], "noisy", 0)
    assert noisy["simulated_owner"]["feedback_verifier"] == NOISY and "simulated_owner" not in exact
    assert noisy["policy"]["name"] == exact["policy"]["name"] == "l2rr"
    # matched: the two rows differ only in the owner's feedback verifier
    assert {k: v for k, v in noisy.items() if k != "simulated_owner"} == exact
    only_l2rr = load_profile("noisy_grader_l2rr_short")  # the same runs, alone (docs/RESULTS.md §5)
    assert [r.config_hash for r in plan_runs(only_l2rr)] == [
        r.config_hash for r in plan_runs(spec) if r.label.startswith("l2rr_owner")]
    with pytest.raises(BenchSpecError, match=r"simulated_owner\.feedback_verifier\.flip_rate"):
        plan_runs(parse_spec({"name": "x", "seeds": [0], "testbeds": ["noisy"], "steps": 1, "control": "a",
                    "methods": [{"label": "a", "config": {"simulated_owner": {
                        "feedback_verifier": {"name": "noisy_flip", "flip_rate": 2}}}}]}))


def test_the_owner_config_takes_a_table_and_names_a_bad_option(tmp_path):
    init_owner(tmp_path / "owner", "small", dp=True, feedback_verifier=NOISY)
    config_path = tmp_path / "owner" / "config.toml"
    config = load_config(config_path)
    assert config.data.feedback_verifier == NOISY and worker_spec(config).feedback_verifier == NOISY
    text = config_path.read_text().replace("flip_rate = 0.2", "flip_rate = 0.9")
    config_path.write_text(text)
    with pytest.raises(OwnerConfigError, match=r"data\.feedback_verifier\.flip_rate"):
        load_config(config_path)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    from rlvr_core.models.tiny_policy import random_tiny_policy

    return random_tiny_policy(tmp_path_factory.mktemp("ckpt") / "tiny", ["0123456789+= Answer: abc"], seed=0)


class _Worker:
    """The owner's real worker process (target_owner_node.worker.worker_main, spawned as the server
    spawns it) for one owner config; `scores(split, rows)` asks it to score the first `rows` rows."""

    def __init__(self, spec):
        context = multiprocessing.get_context("spawn")
        self.conn, theirs = context.Pipe()
        self.process = context.Process(target=worker_main, args=(theirs, spec), daemon=True)

    def __enter__(self):
        self.process.start()
        assert self.conn.poll(120) and self.conn.recv()[0] == "ready"
        return self

    def __exit__(self, *exc):
        self.conn.send(("stop",))
        self.process.join(timeout=30)
        if self.process.is_alive():
            self.process.kill()

    def scores(self, checkpoint, split: str, rows: int) -> np.ndarray:
        decoding = Decoding(max_new_tokens=4, samples_per_prompt=4, temperature=1.0, seed=7).to_json()
        self.conn.send(("score", split, [("c1", str(checkpoint))], list(range(rows)), decoding))
        assert self.conn.poll(300)
        status, scores = self.conn.recv()
        assert status == "ok", scores
        return scores[0]


def test_the_owner_scores_the_feedback_split_noisily_and_the_test_split_exactly(tmp_path, checkpoint):
    specs = {}
    for label, verifier in (("exact", None), ("noisy", NOISY)):
        init_owner(tmp_path / label, "small", dp=True, test_split=True, feedback_verifier=verifier)
        specs[label] = worker_spec(load_config(tmp_path / label / "config.toml"))
    rows, feedback, test = 40, {}, {}
    for label, spec in specs.items():
        with _Worker(spec) as worker:
            feedback[label] = worker.scores(checkpoint, "feedback", rows)
            test[label] = worker.scores(checkpoint, "test", rows)
            if label == "noisy":  # a replay scores the same
                assert np.array_equal(feedback[label], worker.scores(checkpoint, "feedback", rows))
    # A random policy answers (almost) nothing right: exact scores ~0, flipped ones ~flip_rate.
    assert feedback["exact"].mean() < 0.05
    assert feedback["noisy"].mean() == pytest.approx(feedback["exact"].mean() + 0.2, abs=0.08)
    assert np.array_equal(test["noisy"], test["exact"])             # the test split stays exact


def test_simulate_sets_the_owner_verifier_and_records_it(tmp_path, capsys):
    from tests.lab.test_simulate import _tiny_sim_config
    from trainer_node.cli import main

    run_dir = tmp_path / "run"
    table = '[simulated_owner]\nfeedback_verifier = { name = "noisy_flip", flip_rate = 0.1 }\n'
    config = _tiny_sim_config(tmp_path, run_dir, "l2rr", table, steps=1)
    assert main(["simulate", "--config", str(config), "--no-progress"]) == 0
    chosen = {"name": "noisy_flip", "flip_rate": 0.1}
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["owner_feedback_verifier"] == chosen
    resolved = json.loads((run_dir / "resolved_config.json").read_text())
    assert resolved["simulated_owner"]["feedback_verifier"] == chosen
    owner = load_config(run_dir / "owner" / "config.toml")
    assert owner.data.feedback_verifier == chosen and owner.data.verifier == "per_example"  # the test split: exact
    assert "owner feedback grader" in capsys.readouterr().out


def test_train_refuses_it(tmp_path):
    from tests.lab.test_simulate import _tiny_sim_config
    from trainer_node.config import load_config as load_train_config
    from trainer_node.training import run_training

    config = _tiny_sim_config(tmp_path, tmp_path / "run", "uniform")
    with pytest.raises(ConfigError, match=r"simulated_owner\.feedback_verifier.*Remove it for `train`"):
        run_training(load_train_config(config, {"simulated_owner.feedback_verifier": "noisy_flip"}), progress=False)


def test_simulated_owner_dtype_sets_the_owners_evaluation_dtype(tmp_path):
    """`simulated_owner.dtype` reaches the owner's evaluation.dtype (its worker scores in it);
    left at 'auto' the owner's config is what it was, and a bad value names the field."""
    init_owner(tmp_path / "bf16", "small", dp=True, dtype="bfloat16")
    assert worker_spec(load_config(tmp_path / "bf16" / "config.toml")).dtype == "bfloat16"
    init_owner(tmp_path / "auto", "small", dp=True)
    assert load_config(tmp_path / "auto" / "config.toml").evaluation.dtype == "auto"
    from lab.configs import simulate_defaults_path

    def simulate_config(dtype):
        return parse_config(with_overrides(load_toml(simulate_defaults_path()), {"simulated_owner.dtype": dtype}))

    assert simulate_config("bfloat16").simulated_owner.dtype == "bfloat16"
    with pytest.raises(ConfigError, match=r"simulated_owner\.dtype"):
        simulate_config("int3")


def test_simulated_owner_nice_lowers_the_owner_process_priority(tmp_path):
    """`simulated_owner.nice` (default 19) is applied in the owner's child before exec, so its
    server and the worker it spawns inherit it; a bad value names the field and starts nothing."""
    import functools
    import os
    import subprocess
    import sys

    from lab.configs import simulate_defaults_path
    from lab.owner_process import OwnerProcess, _child_setup

    def simulate_config(nice):
        return parse_config(with_overrides(load_toml(simulate_defaults_path()), {"simulated_owner.nice": nice}))

    assert resolve_config(SimulateOptions()).simulated_owner.nice == 19
    assert simulate_config(0).simulated_owner.nice == 0
    for bad in (-1, 20, "low"):
        with pytest.raises(ConfigError, match=r"simulated_owner\.nice"):
            simulate_config(bad)
    with pytest.raises(ValueError, match="nice must be in 0..19"):
        OwnerProcess(tmp_path, nice=20)
    ours = os.nice(0)
    child = subprocess.run([sys.executable, "-c", "import os; print(os.nice(0))"], capture_output=True, text=True,
                           check=True, preexec_fn=functools.partial(_child_setup, 5))
    assert int(child.stdout) == min(ours + 5, 19)


def test_simulated_owner_scheduler_idle_runs_the_owner_under_sched_idle(tmp_path):
    """`simulated_owner.scheduler = "idle"` puts the owner's child under SCHED_IDLE before exec,
    overriding `nice`; the default, "normal", keeps the usual policy at `nice`; a bad value names
    the field."""
    import functools
    import os
    import subprocess
    import sys

    from lab.configs import simulate_defaults_path
    from lab.owner_process import OwnerProcess, _child_setup

    def simulate_config(scheduler):
        overrides = {"simulated_owner.scheduler": scheduler}
        return parse_config(with_overrides(load_toml(simulate_defaults_path()), overrides))

    default = resolve_config(SimulateOptions()).simulated_owner
    assert default.scheduler == "normal" and default.process_options(7) == {"nice": 19, "idle": False,
                                                                                 "noise_seed": 7}
    idle = simulate_config("idle").simulated_owner
    assert idle.process_options(7) == {"nice": 19, "idle": True, "noise_seed": 7}
    with pytest.raises(ConfigError, match=r"simulated_owner\.scheduler"):
        simulate_config("realtime")
    assert OwnerProcess(tmp_path, **idle.process_options(0)).idle
    assert not OwnerProcess(tmp_path, **default.process_options(0)).idle
    if not hasattr(os, "SCHED_IDLE"):
        pytest.skip("no SCHED_IDLE on this platform (the owner runs at nice 19)")
    probe = "import os; print(os.sched_getscheduler(0) == os.SCHED_IDLE)"
    idle = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True,
                          preexec_fn=functools.partial(_child_setup, 10, True))
    normal = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True,
                            preexec_fn=functools.partial(_child_setup, 10, False))
    assert idle.stdout.strip() == "True" and normal.stdout.strip() == "False"
