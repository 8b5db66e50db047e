import argparse
import json
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from lab.bench import add_bench_parser, runner
from lab.bench.spec import load_spec, parse_spec, plan_runs

FAKE = Path(__file__).with_name("test_bench_fake_simulate.py")


class FakeSimulate:
    """A CommandBuilder: the real simulate argv, but running the fake script; counts launches."""

    def __init__(self):
        self.launched: list[str] = []

    def __call__(self, run, run_dir, config_path):
        self.launched.append(run.run_id)
        argv = runner.simulate_command(run, run_dir, config_path)
        assert argv[1:4] == ["-m", "trainer_node.cli", "simulate"]
        return [sys.executable, str(FAKE), *argv[4:]]


def run_fake_bench(spec, out):
    """Every run of `spec` through the fake simulate, 2 workers: (records, skipped)."""
    return runner.run_all(plan_runs(spec), out, workers=2, command_builder=FakeSimulate(), progress=False)


def make_spec(l2rr_options=None, extra_methods=()):
    return parse_spec({
        "name": "t", "seeds": [0, 1], "steps": 6, "config": {"run": {"eval_every": 2}},
        "methods": [{"label": "uniform", "policy": "uniform"},
                    {"label": "l2rr", "policy": "l2rr", "options": l2rr_options or {}}, *extra_methods],
    })


def test_runs_write_records_and_resume_skips_matching_ones(tmp_path):
    fake = FakeSimulate()
    records, skipped = runner.run_all(plan_runs(make_spec()), tmp_path, workers=2, command_builder=fake, progress=False)
    assert skipped == [] and len(fake.launched) == 4
    assert all(r["status"] == "ok" for r in records)
    record = json.loads((tmp_path / "records" / "default__l2rr__seed1.json").read_text())
    assert record["summary"]["seed"] == 1 and record["summary"]["method"] == "l2rr"
    assert len(record["config_hash"]) == 64 and record["git_commit"]
    assert record["wall_seconds"] >= 0 and "--seed 1" in record["command"]
    assert (tmp_path / "runs" / "default" / "l2rr" / "seed1" / "summary.json").is_file()
    assert (tmp_path / "configs" / "default__l2rr__seed1.toml").is_file()

    again = FakeSimulate()
    records, skipped = runner.run_all(plan_runs(make_spec()), tmp_path, workers=2, command_builder=again, progress=False)
    assert again.launched == [] and len(skipped) == 4 and all(r["status"] == "ok" for r in records)

    changed = FakeSimulate()  # a changed option re-runs that method only
    runner.run_all(plan_runs(make_spec({"lambda_waste": 1.0})), tmp_path, workers=1, command_builder=changed,
                   progress=False)
    assert sorted(changed.launched) == ["default__l2rr__seed0", "default__l2rr__seed1"]


def test_a_run_without_summary_is_rerun_even_with_a_record(tmp_path):
    runs = plan_runs(make_spec())
    runner.run_all(runs, tmp_path, workers=1, command_builder=FakeSimulate(), progress=False)
    (runs[0].run_dir(tmp_path) / "summary.json").unlink()
    fake = FakeSimulate()
    runner.run_all(runs, tmp_path, workers=1, command_builder=fake, progress=False)
    assert fake.launched == [runs[0].run_id]


def test_a_failing_run_is_recorded_and_the_others_finish(tmp_path):
    spec = make_spec(extra_methods=[{"label": "broken", "policy": "uniform"}])
    records, _ = runner.run_all(plan_runs(spec), tmp_path, workers=2, command_builder=FakeSimulate(), progress=False)
    by_status = {}
    for r in records:
        by_status.setdefault(r["status"], []).append(r["label"])
    assert sorted(by_status["failed"]) == ["broken", "broken"] and len(by_status["ok"]) == 4
    failed = next(r for r in records if r["status"] == "failed")
    assert failed["error"] == "exit code 3" and "failing on purpose" in failed["log_tail"]
    # A launcher that raises is a failed run too, not a crashed bench.
    def explode(run, run_dir, config_path):
        raise OSError("no such interpreter")
    record = runner.execute_run(plan_runs(spec)[0], tmp_path, explode)
    assert record["status"] == "failed" and "no such interpreter" in record["error"]


def test_a_summary_for_another_run_is_rejected(tmp_path):
    run = plan_runs(make_spec())[0]
    def wrong_seed(run_, run_dir, config_path):
        argv = FakeSimulate()(run_, run_dir, config_path)
        argv[argv.index("--seed") + 1] = "99"
        return argv
    record = runner.execute_run(run, tmp_path, wrong_seed)
    assert record["status"] == "failed" and "seed=99" in record["error"]


def bench(argv):
    parser = argparse.ArgumentParser()
    add_bench_parser(parser.add_subparsers())
    args = parser.parse_args(["bench", *argv])
    return args.run(args)


def write_two_method_spec(tmp_path):
    spec_file = tmp_path / "spec.toml"
    spec_file.write_text('name = "t"\nseeds = [0, 1]\nsteps = 4\n[config.run]\neval_every = 2\n'
                         '[[methods]]\nlabel = "uniform"\npolicy = "uniform"\n'
                         '[[methods]]\nlabel = "l2rr"\npolicy = "l2rr"\n')
    return spec_file


def test_list_runs_then_external_execution_then_report_only(tmp_path, capsys):
    spec_file = write_two_method_spec(tmp_path)
    out = tmp_path / "out"
    assert bench(["--spec", str(spec_file), "--out", str(out), "--list-runs"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 4 and all(" simulate --method " in line for line in lines)
    for line in lines[:3]:  # "another machine" runs three of them
        argv = shlex.split(line)
        subprocess.run([sys.executable, str(FAKE), *argv[4:]], check=True)
    assert bench(["--spec", str(spec_file), "--out", str(out), "--report-only"]) == 1  # one run missing
    captured = capsys.readouterr()
    assert "3 of 4 runs have results" in captured.out and "missing" in captured.err
    results = json.loads((out / "results.json").read_text())
    assert results["run_counts"] == {"missing": 1, "ok": 3}
    assert (out / "report.md").is_file() and (out / "records").is_dir()

    assert bench(["--spec", str(spec_file), "--out", str(out), "--dry-run"]) == 0
    plan = capsys.readouterr().out
    assert "3 done, 1 to run" in plan


def test_seeds_run_a_profile_in_slices_that_add_to_one_out(tmp_path, capsys):
    spec_file = write_two_method_spec(tmp_path)  # seeds 0 and 1
    out = tmp_path / "out"
    full_plan = {run.run_id: run.config_hash for run in plan_runs(load_spec(spec_file))}
    assert bench(["--spec", str(spec_file), "--out", str(out), "--seeds", "1", "--list-runs"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2 and all("--seed 1 " in line for line in lines)  # every method, seed 1 only
    for line in lines:
        subprocess.run([sys.executable, str(FAKE), *shlex.split(line)[4:]], check=True)
    assert bench(["--spec", str(spec_file), "--out", str(out), "--seeds", "1", "--report-only"]) == 0
    assert "2 of 2 runs have results" in capsys.readouterr().out
    assert bench(["--spec", str(spec_file), "--out", str(out), "--dry-run"]) == 0  # the slice counts for the whole
    plan = capsys.readouterr().out
    assert "2 done, 2 to run" in plan
    for run_id, config_hash in full_plan.items():
        assert f"{run_id}  hash {config_hash[:12]}" in plan

    assert bench(["--spec", str(spec_file), "--out", str(out), "--methods", "l2rr", "--control", "l2rr",
                  "--seeds", "0", "--dry-run"]) == 0  # a method slice, paired against another control
    plan = capsys.readouterr().out
    assert "1 runs (1 methods x 1 seeds x 1 testbeds)" in plan
    assert f"default__l2rr__seed0  hash {full_plan['default__l2rr__seed0'][:12]}" in plan


@pytest.mark.parametrize("flag, value, message", [
    ("--seeds", "7", "--seeds: 7 not among the spec's seeds (0, 1)"),
    ("--seeds", "a-b", "'a-b' is not a seed or a range like 0-5"),
    ("--seeds", "3-1", "range '3-1' is empty"),
    ("--methods", "l2r", "--methods: l2r not among the spec's methods (uniform, l2rr)"),
    ("--methods", "l2rr", "--methods: keep the control(s) uniform"),
    ("--testbeds", "small", "--testbeds: small not among the spec's testbeds (default)"),
])
def test_a_slice_outside_the_spec_or_malformed_is_refused_naming_the_flag(flag, value, message, tmp_path, capsys):
    from lab.bench.spec import BenchSpecError

    spec_file = write_two_method_spec(tmp_path)
    try:
        code = bench(["--spec", str(spec_file), "--out", str(tmp_path / "out"), flag, value, "--dry-run"])
    except (BenchSpecError, SystemExit) as error:
        text = str(error) + capsys.readouterr().err
    else:
        text = f"exit {code}"
    assert message in text
    assert not (tmp_path / "out").exists()


def test_report_only_refuses_a_run_dir_with_other_options(tmp_path):
    runs = plan_runs(make_spec())
    run = next(r for r in runs if r.label == "l2rr")
    other = next(r for r in plan_runs(make_spec({"lambda_waste": 1.0})) if r.run_id == run.run_id)
    argv = FakeSimulate()(other, other.run_dir(tmp_path), runner.write_run_config(tmp_path, other))
    subprocess.run(argv, check=True)  # filled "elsewhere" with lambda 1.0
    record = next(r for r in runner.gather_records(runs, tmp_path) if r["id"] == run.run_id)
    assert record["status"] == "stale" and "policy.lambda_waste" in record["error"]


@pytest.mark.parametrize("flag", ["--workers", "--timeout"])
def test_cli_flags_parse(flag, tmp_path, capsys):
    assert bench(["--profile", "quick", "--out", str(tmp_path), "--dry-run", flag, "2"]) == 0
    assert "9 runs" in capsys.readouterr().out


def test_report_only_refuses_a_run_dir_with_other_config_overrides(tmp_path):
    runs = plan_runs(make_spec())
    other_spec = parse_spec({**make_spec().model_dump(), "config": {"run": {"eval_every": 3}}})
    other = plan_runs(other_spec)[0]
    subprocess.run(FakeSimulate()(other, other.run_dir(tmp_path), runner.write_run_config(tmp_path, other)), check=True)
    record = runner.gather_records(runs, tmp_path)[0]
    assert record["status"] == "stale" and "run.eval_every" in record["error"]


def test_a_run_past_its_timeout_is_interrupted_and_recorded(tmp_path):
    spec = parse_spec({"seeds": [0], "steps": 2, "control": "slow",
                       "methods": [{"label": "slow", "policy": "uniform"}]})
    record = runner.execute_run(plan_runs(spec)[0], tmp_path, FakeSimulate(), timeout=1.0)
    assert record["status"] == "failed" and record["error"] == "timed out after 1.0 s"
    assert record["wall_seconds"] < 30  # SIGINT stopped it; no SIGKILL grace needed


def test_with_several_workers_one_run_per_testbed_goes_first():
    spec = parse_spec({**make_spec().model_dump(), "testbeds": ["default", "small"]})
    runs = plan_runs(spec)
    first, rest = runner._phases(runs, workers=4)
    assert sorted(r.testbed for r in first) == ["default", "small"] and len(first) + len(rest) == len(runs)
    assert runner._phases(runs, workers=1) == [runs]


def test_epsilon_reaches_the_command_and_the_hash(tmp_path):
    plain = plan_runs(make_spec())[0]
    spec = parse_spec({**make_spec().model_dump(), "epsilon": 2.5})
    run = plan_runs(spec)[0]
    argv = runner.simulate_command(run, run.run_dir(tmp_path), tmp_path / "c.toml")
    assert argv[argv.index("--epsilon") + 1] == "2.5" and "--epsilon" not in runner.simulate_command(
        plain, plain.run_dir(tmp_path), tmp_path / "c.toml")
    assert run.config_hash != plain.config_hash
    record = runner.execute_run(run, tmp_path, FakeSimulate())
    assert record["status"] == "ok" and record["summary"]["epsilon_budget"] == 2.5


def test_report_against_another_control_goes_to_its_own_folder(tmp_path, capsys):
    spec_file = write_two_method_spec(tmp_path)
    out = tmp_path / "out"
    assert bench(["--spec", str(spec_file), "--out", str(out), "--list-runs"]) == 0
    for line in capsys.readouterr().out.splitlines():
        subprocess.run([sys.executable, str(FAKE), *shlex.split(line)[4:]], check=True)
    assert bench(["--spec", str(spec_file), "--out", str(out), "--report-only"]) == 0
    assert bench(["--spec", str(spec_file), "--out", str(out), "--report-only", "--control", "l2rr"]) == 0
    main = json.loads((out / "results.json").read_text())
    other = json.loads((out / "vs-l2rr" / "results.json").read_text())
    assert main["control"] == "uniform" and other["control"] == "l2rr"  # the spec's report is kept
    assert "Δ vs l2rr" in (out / "vs-l2rr" / "report.md").read_text()
    delta_main = main["testbeds"]["default"]["methods"]["l2rr"]["delta_vs_control"]["mean"]
    delta_other = other["testbeds"]["default"]["methods"]["uniform"]["delta_vs_control"]["mean"]
    assert delta_other == pytest.approx(-delta_main)  # the same pairs, the other way round
    with pytest.raises(Exception, match="--control"):
        bench(["--spec", str(spec_file), "--out", str(out), "--report-only", "--control", "nope"])


def test_runs_are_stoppable_even_when_the_bench_was_started_ignoring_sigint(tmp_path):
    """A bench launched from a background job ignores SIGINT; its runs must still stop on it."""
    import signal

    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        spec = parse_spec({"seeds": [0], "steps": 2, "control": "slow",
                           "methods": [{"label": "slow", "policy": "uniform"}]})
        record = runner.execute_run(plan_runs(spec)[0], tmp_path, FakeSimulate(), timeout=1.0)
        assert record["status"] == "failed" and record["wall_seconds"] < 30
    finally:
        signal.signal(signal.SIGINT, previous)


def _copy_of_small(tmp_path):
    """A testbed file of one's own (the small testbed's content), for tests that edit it."""
    from rlvr_core.tasks.testbed import TESTBED_DIR

    testbed = tmp_path / "mine.toml"
    testbed.write_text((TESTBED_DIR / "small.toml").read_text())
    return testbed


def _one_run_spec(testbed):
    return parse_spec({"name": "t", "seeds": [0], "steps": 6, "testbeds": [str(testbed)],
                       "methods": [{"label": "uniform", "policy": "uniform"}]})


def test_an_edited_testbed_file_reruns_its_runs_and_its_old_records_are_stale(tmp_path):
    """The config hash names the testbed; its digest in the record catches an edit of the file."""
    testbed = _copy_of_small(tmp_path)
    out = tmp_path / "out"
    run_fake_bench(_one_run_spec(testbed), out)
    runner._testbed_digest.cache_clear()
    assert run_fake_bench(_one_run_spec(testbed), out)[1] != []  # unchanged: skipped
    testbed.write_text(testbed.read_text().replace("seed = ", "seed = 1", 1))
    runner._testbed_digest.cache_clear()
    [stale] = runner.gather_records(plan_runs(_one_run_spec(testbed)), out)
    assert stale["status"] == "stale" and "testbed changed" in stale["error"]
    fake = FakeSimulate()
    runner.run_all(plan_runs(_one_run_spec(testbed)), out, workers=1, command_builder=fake, progress=False)
    assert len(fake.launched) == 1


def test_a_reworded_testbed_description_keeps_its_runs_done(tmp_path):
    """The record's data digest leaves the description out: rewording it re-runs nothing, where a
    record with the full digest only (kept before the data digest) counts the edit as a change."""
    testbed = _copy_of_small(tmp_path)
    out = tmp_path / "out"
    run_fake_bench(_one_run_spec(testbed), out)
    [run] = plan_runs(_one_run_spec(testbed))
    record = json.loads(runner.record_path(out, run).read_text())
    assert record["testbed_data_digest"] == runner.testbed_data_digest(run) != record["testbed_digest"]
    text = testbed.read_text()
    assert "description = " in text
    testbed.write_text(text.replace('description = """', 'description = """Reworded. ', 1))
    runner._testbed_digest.cache_clear()
    assert runner.testbed_digest(run) != record["testbed_digest"]
    assert runner.same_inputs(record, run) and runner.is_done(out, run)
    fake = FakeSimulate()
    runner.run_all(plan_runs(_one_run_spec(testbed)), out, workers=1, command_builder=fake, progress=False)
    assert fake.launched == []
    older = {k: v for k, v in record.items() if k != "testbed_data_digest"}
    assert not runner.same_inputs(older, run)
    runner._testbed_digest.cache_clear()


def test_records_from_before_the_testbed_digest_still_count(tmp_path):
    runs = plan_runs(make_spec())
    runner.run_all(runs, tmp_path, workers=1, command_builder=FakeSimulate(), progress=False)
    for run in runs:
        path = runner.record_path(tmp_path, run)
        record = json.loads(path.read_text())
        assert record["testbed_digest"] == runner.testbed_digest(run)
        del record["testbed_digest"]
        path.write_text(json.dumps(record))
    fake = FakeSimulate()
    runner.run_all(runs, tmp_path, workers=1, command_builder=fake, progress=False)
    assert fake.launched == []


def test_restore_counts_published_runs_as_done_and_runs_only_the_new_rows(tmp_path, capsys):
    """lab/bench/restore.py: a profile that gained a row re-runs only that row; a published run
    whose config changed since runs again; the restored record says where it came from."""
    records, _ = run_fake_bench(make_spec(), tmp_path / "first")
    published = tmp_path / "published.json"
    records[0] = {**records[0], "config_hash": "0" * 64}  # uniform seed 0: published with another config
    published.write_text(json.dumps({"runs": records}))

    runs = plan_runs(make_spec(extra_methods=[{"label": "dapo", "policy": "dapo"}]))
    out = tmp_path / "out"
    from lab.bench.restore import restore_runs

    assert len(restore_runs(published, runs, out, write=False).restored) == 3
    assert not (out / "records").exists(), "a dry run writes nothing"
    outcome = restore_runs(published, runs, out)
    assert sorted(outcome.restored) == ["default__l2rr__seed0", "default__l2rr__seed1", "default__uniform__seed1"]
    assert outcome.other_inputs == ["default__uniform__seed0"] and outcome.not_published == 2
    record = json.loads(runner.record_path(out, runs[1]).read_text())
    assert record["restored_from"] == str(published) and record["run_dir"] == str(runs[1].run_dir(out))
    del records[1]["testbed_data_digest"]  # published before the data digest: restoring verifies and adds it
    published.write_text(json.dumps({"runs": records}))
    shutil.rmtree(out)
    restore_runs(published, runs, out)
    assert json.loads(runner.record_path(out, runs[1]).read_text())["testbed_data_digest"] == \
        runner.testbed_data_digest(runs[1])
    fake = FakeSimulate()
    runner.run_all(runs, out, workers=1, command_builder=fake, progress=False)
    assert sorted(fake.launched) == ["default__dapo__seed0", "default__dapo__seed1", "default__uniform__seed0"]
    assert restore_runs(published, runs, out).already_done  # OUT's own finished runs win
    with pytest.raises(ValueError, match="no 'runs' list"):
        (tmp_path / "bad.json").write_text("{}")
        restore_runs(tmp_path / "bad.json", runs, out)


def test_a_testbed_keeps_the_digest_its_published_runs_carry():
    """A field added to testbed entries later (rubric) leaves the digest of a testbed that does not
    use it unchanged: the records in docs/results stay restorable (`bench --restore`)."""
    from lab.bench.runner import _testbed_digest

    records = json.loads((Path(__file__).resolve().parents[2] / "docs" / "results" / "target_difference.json")
                         .read_text())["runs"]
    published = {r["testbed_digest"] for r in records if r["testbed"] == "mislabelled_add"}
    assert published == {_testbed_digest("mislabelled_add")}


def test_a_testbed_with_a_reworded_description_keeps_its_published_runs():
    """dataflex_levels' description was reworded after docs/results/dataflex_levels_check.json ran:
    the records' data digest (no description) is still the testbed's, so `--restore` takes them."""
    from lab.bench.runner import _testbed_digest

    records = json.loads((Path(__file__).resolve().parents[2] / "docs" / "results" / "dataflex_levels_check.json")
                         .read_text())["runs"]
    assert {r["testbed_data_digest"] for r in records} == {_testbed_digest("dataflex_levels", data_only=True)}
    assert {r["testbed_digest"] for r in records} != {_testbed_digest("dataflex_levels")}
