"""Smoke tests of every script in tools/: each explains itself (--help), and the quick ones run
a tiny case. (tools/gen_protos.py --check runs in tests/protocol/test_stubs_fresh.py,
tools/bench_engine.py --shape-cost in test_bench_engine.py.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TOOLS = sorted(p.name for p in (ROOT / "tools").glob("*.py"))


def run_tool(name: str, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "tools" / name), *args], capture_output=True, text=True,
                          timeout=timeout, check=False, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})


def test_the_tools_are_the_ones_documented():
    assert TOOLS == ["bench_cpu_share.py", "bench_engine.py", "bench_feedback.py", "bench_flower_bytes.py",
                     "bench_grpo_cpu.py", "bench_owner.py",
                     "bench_owner_beside.py", "bench_owner_scoring.py", "bench_tapped_update.py", "gen_protos.py",
                     "holm_published.py", "summarize_runs.py"]


def test_no_tool_depends_on_the_test_suite():
    """Issue 42 item 3: a benchmark stands on the packages it measures (the toy workload is lab/toy_grpo.py)."""
    import ast

    for name in TOOLS:
        tree = ast.parse((ROOT / "tools" / name).read_text())
        imported = [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module]
        imported += [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
        assert not [m for m in imported if m == "tests" or m.startswith("tests.")], name


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) < 2, reason="needs 2 CPUs")
def test_bench_cpu_share_runs_a_tiny_case():
    result = run_tool("bench_cpu_share.py", "--sizes", "32", "--rounds", "1", "--seconds", "0.05", "--json", timeout=120)
    assert result.returncode == 0, result.stderr
    row = json.loads(result.stdout)
    assert row["size"] == 32 and len(row["alone_s"]) == len(row["beside_s"]) == 1 and row["ratio"] > 0


@pytest.mark.parametrize("name", TOOLS)
def test_every_tool_explains_itself(name):
    result = run_tool(name, "--help", timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("usage:") and f"tools/{name}" in result.stdout  # the docstring's examples


def test_bench_grpo_cpu_runs_a_tiny_case(tmp_path):
    from tests.trainer_node.grpo_helpers import make_model_dir

    out = tmp_path / "out"
    result = run_tool("bench_grpo_cpu.py", "--steps", "2", "--eval-every", "1", "--out", str(out), "--threads", "1",
                      "--set", f"model.path={make_model_dir(tmp_path)}", "--set", "model.tiny=false",
                      "--set", "data.testbed=small", "--set", "policy.batch_size=2",
                      "--set", "policy.rollouts_per_prompt=2", "--set", "rollout.max_new_tokens=4")
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads((out / "bench.json").read_text())
    assert report["steps"] == 2 and report["rollouts"] == 8 and report["testbed"] == "small"
    assert 0.0 <= report["test_accuracy_before"] <= 1.0 and set(report["per_domain_after"])
    evals = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if '"eval"' in x]
    assert [e["step"] for e in evals] == [0, 1, 2]  # before, every step, after: the run loop's schedule


def test_holm_published_adjusts_a_published_file_as_the_report_does():
    from scipy import stats as scipy_stats

    full = json.loads((ROOT / "docs/results/full.json").read_text())["testbeds"]["default"]["methods"]
    raw = {label: scipy_stats.ttest_1samp(m["delta_vs_control"]["diffs"], 0.0).pvalue
           for label, m in full.items() if m.get("delta_vs_control")}
    first, second = sorted(raw, key=raw.get)[:2]  # Holm by hand: 7 p and 6 p, kept monotone
    expected = max(7 * raw[first], 6 * raw[second])
    result = run_tool("holm_published.py", "docs/results/full.json", "docs/results/mislabelled.json", timeout=120)
    assert result.returncode == 0, result.stderr
    rows = {(line.split(" | ")[0][2:], line.split(" | ")[2]): line for line in result.stdout.splitlines()
            if line.startswith(("| full.json", "| mislabelled.json"))}
    assert f" | {expected:.3f} | 7 | 12 |" in rows["full.json", f"{second} vs uniform"]
    assert " | **0.043** | 11 | 12 |" in rows["mislabelled.json", "l2rr vs uniform"]  # L2RR on mislabelled survives the adjustment


def test_holm_published_names_a_file_that_is_not_a_bench_result(tmp_path):
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"rows": []}))
    result = run_tool("holm_published.py", str(other), "docs/results/full.json", timeout=120)
    assert result.returncode == 0 and "other.json: not a bench results.json" in result.stderr
    assert "`testbeds`" in result.stderr and "| full.json |" in result.stdout  # the others still print
    assert run_tool("holm_published.py", str(other), timeout=120).returncode == 2  # nothing it could read
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    result = run_tool("holm_published.py", str(broken), str(tmp_path / "absent.json"), timeout=120)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "broken.json: cannot be read as JSON" in result.stderr and "absent.json: cannot be read" in result.stderr


def test_summarize_runs_pairs_methods_over_seeds(tmp_path):
    for method, bonus in (("uniform", 0.0), ("l2rr", 0.05)):
        for seed in range(3):
            run = tmp_path / f"{method}-seed{seed}"
            run.mkdir()
            (run / "summary.json").write_text(json.dumps({
                "target_accuracy_before": 0.4, "target_accuracy_after": 0.5 + bonus + 0.01 * seed,
                "rollouts": 1000 - 100 * (method == "l2rr"), "epsilon_spent": 1.0,
            }))
    result = run_tool("summarize_runs.py", str(tmp_path), "--control", "uniform", timeout=120)
    assert result.returncode == 0, result.stderr
    rows = {line.split("|")[1].strip(): line for line in result.stdout.splitlines() if line.startswith("| ")}
    assert "(control)" in rows["uniform"] and "+5.00" in rows["l2rr"] and "1.11×" in rows["l2rr"]


def test_bench_flower_bytes_refuses_a_bad_flag_naming_it():
    result = run_tool("bench_flower_bytes.py", "--candidates", "0")
    assert result.returncode == 2 and "--candidates: at least 1" in result.stderr


@pytest.mark.slow
def test_bench_flower_bytes_measures_both_paths(tmp_path):
    """~25 s: an owner process, a random tiny model's candidates over direct gRPC and through the shim."""
    result = run_tool("bench_flower_bytes.py", "--candidates", "1", "--json", str(tmp_path / "bytes.json"))
    assert result.returncode == 0, result.stderr[-3000:]
    figures = json.loads((tmp_path / "bytes.json").read_text())
    for label, (sent, _, stored) in figures["direct"].items():
        assert figures["flower"][label][2] == stored  # the owner stores the same files on both paths
        assert stored <= sent <= figures["flower"][label][0]  # Flower's message carries a little more
    base, one = figures["direct"]["base (nothing held)"][0], figures["direct"]["the smallest tensor changed"][0]
    assert one < base / 10  # an unchanged tensor is not resent
    assert "query: 2 checkpoints + 1 release" in result.stdout


@pytest.mark.slow
def test_bench_owner_runs_a_tiny_case():
    """~30 s: an owner server process, a 1 MiB upload and a tiny evaluation."""
    result = run_tool("bench_owner.py", "--size-mb", "1", "--prompts", "4", "--samples", "1", "--max-new-tokens", "2")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "upload over mTLS loopback" in result.stdout and "prompts/s" in result.stdout


def test_bench_owner_scoring_names_a_folder_that_is_not_a_run(tmp_path):
    result = run_tool("bench_owner_scoring.py", str(tmp_path))
    assert result.returncode == 2 and "owner/config.toml not found" in result.stderr


def test_bench_owner_beside_names_a_folder_that_is_not_a_run(tmp_path):
    result = run_tool("bench_owner_beside.py", str(tmp_path))
    assert result.returncode == 2 and "owner/config.toml not found" in result.stderr


@pytest.mark.parametrize("flag, value, message", [
    ("--cycles", "1", "--cycles must be >= 2"), ("--block", "0", "--block must be >= 1"),
    ("--batch", "0", "--batch must be a positive number"), ("--max-new-tokens", "0", "--max-new-tokens must be >= 1"),
    ("--nice", "20", "--nice must be between 0 and 19")])
def test_bench_owner_beside_refuses_a_bad_flag_naming_it(tmp_path, flag, value, message):
    result = run_tool("bench_owner_beside.py", str(tmp_path), flag, value)
    assert result.returncode == 2 and message in result.stderr


def test_bench_owner_beside_pairs_each_cycle_and_predicts_the_loop_excess(tmp_path):
    """Each cycle's ratio is its blocks' means; the figure is their geometric mean; the excess is
    the in-flight share of the run's steps times the step's slowdown."""
    sys.path.insert(0, str(ROOT / "tools"))
    import bench_owner_beside as tool

    def cycle(beside: float, alone: float) -> dict:
        return {side: {f"cpu/{phase}": [value, value] for phase in tool.PHASES}
                for side, value in (("beside", beside), ("alone", alone))}

    figures = tool.summarize([cycle(1.1, 1.0), cycle(2.4, 2.0), cycle(0.5, 0.5)], "cpu")
    mean, low, high = figures["step"]
    assert mean == pytest.approx((1.1 * 1.2 * 1.0) ** (1 / 3)) and low < mean < high
    (tmp_path / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in [
        {"step": 0, "step_seconds": 1.0, "feedback_in_flight": 1.0}, {"step": 1, "step_seconds": 1.0},
        {"step": 2, "step_seconds": 1.0, "feedback_in_flight": 1.0}, {"step": 3, "step_seconds": 1.0},
        {"eval": {"accuracy": 0.5}}]))
    busy, steps = tool.in_flight_share(tmp_path)
    assert (busy, steps) == (2, 4)
    assert tool.predicted_excess(1.1, busy, steps) == pytest.approx(0.05)


@pytest.mark.slow
def test_bench_owner_scoring_times_a_runs_checkpoints(tmp_path):
    """An owner folder as simulate leaves it (init_owner, two stored checkpoints): each is scored
    through the worker's own code, and the dry run is timed."""
    import shutil

    from lab.owner_process import init_owner
    from rlvr_core.models.tiny_policy import random_tiny_policy

    init_owner(tmp_path / "run" / "owner", "small", dp=True)
    stored = tmp_path / "run" / "owner" / "storage" / "materialized"
    model = random_tiny_policy(tmp_path / "tiny", ["0123456789+= Answer: abc"], seed=0)
    for name in ("a", "b"):
        shutil.copytree(model, stored / name)
    result = run_tool("bench_owner_scoring.py", str(tmp_path / "run"), "--models", "2", "--rows", "4",
                      "--dtypes", "float32", "--max-new-tokens", "2", timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "float32   scoring one checkpoint: median" in result.stdout and "dry run of a new structure" in result.stdout
