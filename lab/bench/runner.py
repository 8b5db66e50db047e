"""Execute planned runs: one `trainer-node simulate` subprocess per run, a record per run.

Layout under OUT:
    configs/<id>.toml             the run's resolved simulate config (what --config gets)
    runs/<testbed>/<label>/seed<s>/  the simulate run directory (summary.json, metrics.jsonl)
    records/<id>.json             what the bench knows about the run (see `base_record`)

Why subprocesses: every run is isolated (its own torch threads, its own owner process, its
own crash), and the same command line is what `--list-runs` hands to an external scheduler.
The pool is a thread pool of `workers` threads, each waiting on one subprocess: the parallel
work happens in the child processes, so threads are enough and test fakes need no pickling.

Resume: a run is skipped when its record says "ok", its config hash equals the planned one
and its summary.json exists. A changed option changes the hash, so that run re-runs.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

from tqdm import tqdm

from lab.bench import tomlwrite
from lab.bench.spec import PlannedRun

CommandBuilder = Callable[[PlannedRun, Path, Path], list[str]]
"""(run, run_dir, config_path) -> argv of a process that writes run_dir/summary.json."""

SUMMARY_FILE = "summary.json"
LOG_FILE = "bench.log"
LOG_TAIL_LINES = 30


def simulate_command(run: PlannedRun, run_dir: Path, config_path: Path) -> list[str]:
    """The `trainer-node simulate` command of one run (the default CommandBuilder)."""
    argv = [sys.executable, "-m", "trainer_node.cli", "simulate", "--method", run.policy, "--testbed", run.testbed,
            "--seed", str(run.seed), "--steps", str(run.steps), "--out", str(run_dir), "--config", str(config_path),
            "--no-progress"]
    if run.epsilon is not None:
        argv += ["--epsilon", repr(run.epsilon)]
    if run.owners > 1:
        argv += ["--owners", str(run.owners)]
    return argv + (["--no-dp"] if run.no_dp else [])


def config_path(out: Path, run: PlannedRun) -> Path:
    return Path(out) / "configs" / f"{run.run_id}.toml"


def record_path(out: Path, run: PlannedRun) -> Path:
    return Path(out) / "records" / f"{run.run_id}.json"


def write_run_config(out: Path, run: PlannedRun) -> Path:
    path = config_path(out, run)
    path.parent.mkdir(parents=True, exist_ok=True)
    header = f"# trainer-node bench: run {run.run_id} (config hash {run.config_hash[:12]})\n"
    path.write_text(header + tomlwrite.dumps(run.config))
    return path


def git_commit() -> str:
    """HEAD of the repository this package lives in, or "unknown" (no git, not a checkout)."""
    try:
        result = subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(__file__).parent, capture_output=True,
                                text=True, timeout=10, check=False)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return result.stdout.strip() if result.returncode == 0 and result.stdout.strip() else "unknown"


def load_record(out: Path, run: PlannedRun) -> dict[str, Any] | None:
    path = record_path(out, run)
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def testbed_digest(run: PlannedRun) -> str:
    """sha256 of the run's testbed spec as loaded (a name or a path), so an edited testbed file
    never passes for the one a finished run used: the config hash names the testbed, not its content."""
    return _testbed_digest(run.testbed)


def testbed_data_digest(run: PlannedRun) -> str:
    """sha256 of the testbed spec without its description (TestbedSpec.data_json)."""
    return _testbed_digest(run.testbed, data_only=True)


@functools.lru_cache(maxsize=64)  # one bench process plans and checks each run several times
def _testbed_digest(testbed: str, data_only: bool = False) -> str:
    from rlvr_core.tasks.testbed import load_testbed

    spec = load_testbed(testbed)
    return hashlib.sha256((spec.data_json() if data_only else spec.content_json()).encode()).hexdigest()


def same_inputs(record: dict[str, Any] | None, run: PlannedRun) -> bool:
    """The record is of this planned run: same config hash and the same testbed. The testbed is
    compared by its data digest where the record has one (a reworded description is the same
    testbed), else by its full digest (records kept before the data digest), else not at all
    (records kept before any digest)."""
    if record is None or record.get("config_hash") != run.config_hash:
        return False
    if "testbed_data_digest" in record:
        return record["testbed_data_digest"] == testbed_data_digest(run)
    return record.get("testbed_digest", testbed_digest(run)) == testbed_digest(run)


def is_done(out: Path, run: PlannedRun) -> bool:
    """True when a finished record of the same inputs (same_inputs) and its summary.json exist."""
    record = load_record(out, run)
    return (same_inputs(record, run) and record.get("status") == "ok"
            and (run.run_dir(out) / SUMMARY_FILE).is_file())


def write_record(out: Path, run: PlannedRun, record: dict[str, Any]) -> Path:
    """Atomically (temp file + rename), so a killed bench never leaves half a record."""
    path = record_path(out, run)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path)
    return path


def base_record(run: PlannedRun, out: Path, commit: str) -> dict[str, Any]:
    """The identity of a run: who, what, with which inputs and code."""
    return {
        "id": run.run_id, "testbed": run.testbed, "testbed_key": run.testbed_key, "label": run.label,
        "policy": run.policy, "options": run.config["policy"].get("options", {}), "seed": run.seed,
        "steps": run.steps, "no_dp": run.no_dp, "config_hash": run.config_hash, "git_commit": commit,
        "testbed_digest": testbed_digest(run), "testbed_data_digest": testbed_data_digest(run),
        "run_dir": str(run.run_dir(out)),
    }


def check_summary(run: PlannedRun, summary: dict[str, Any]) -> str | None:
    """Why a summary does not belong to `run` (another method, seed or length), or None."""
    expected = {"method": run.policy, "seed": run.seed, "steps": run.steps, "testbed": run.testbed}
    wrong = [f"{k}={summary.get(k)!r} (expected {v!r})" for k, v in expected.items() if summary.get(k) != v]
    missing = [k for k in ("target_accuracy_after", "rollouts") if summary.get(k) is None]
    if wrong or missing:
        return "summary.json does not match the planned run: " + ", ".join(wrong + [f"{k} missing" for k in missing])
    return None


def _log_tail(path: Path) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-LOG_TAIL_LINES:])
    except OSError:
        return ""


def child_env(workers: int) -> dict[str, str]:
    """No progress bars in logs; torch threads split between concurrent runs unless set already."""
    env = dict(os.environ)
    env.setdefault("TQDM_DISABLE", "1")
    threads = str(max(1, (os.cpu_count() or 1) // max(1, workers)))
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        env.setdefault(name, threads)
    return env


def execute_run(run: PlannedRun, out: Path, command_builder: CommandBuilder = simulate_command,
                env: dict[str, str] | None = None, commit: str = "unknown",
                timeout: float | None = None) -> dict[str, Any]:
    """Run one planned run from scratch and write its record; never raises for a failed run."""
    let_children_take_sigint()
    run_dir = run.run_dir(out)
    if run_dir.exists():
        shutil.rmtree(run_dir)  # no stale files from an older config
    run_dir.mkdir(parents=True)
    record = base_record(run, out, commit)
    started = time.perf_counter()
    record["started_at"] = datetime.now(UTC).isoformat(timespec="seconds")
    try:
        argv = command_builder(run, run_dir, write_run_config(out, run))
        record["command"] = shlex.join(argv)
        with open(run_dir / LOG_FILE, "w") as log:
            returncode = run_process(argv, log, env, timeout)
        record["returncode"] = returncode
        record.update(_outcome(run, run_dir, returncode))
    except subprocess.TimeoutExpired:
        record.update(status="failed", error=f"timed out after {timeout} s", log_tail=_log_tail(run_dir / LOG_FILE))
    except Exception as error:  # noqa: BLE001 -- a launcher problem (bad argv, disk full): this run fails, the others go on
        record.update(status="failed", error=f"{type(error).__name__}: {error}")
    record["wall_seconds"] = round(time.perf_counter() - started, 2)
    write_record(out, run, record)
    return record


_LIVE: set[subprocess.Popen] = set()
_LIVE_LOCK = threading.Lock()
STOP_GRACE_S = 60.0


def run_process(argv: list[str], log: IO[str], env: dict[str, str] | None, timeout: float | None) -> int:
    """Run one child to completion; on timeout stop it like Ctrl-C would (see stop_process)."""
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env)
    with _LIVE_LOCK:
        _LIVE.add(proc)
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        stop_process(proc)
        raise
    finally:
        with _LIVE_LOCK:
            _LIVE.discard(proc)


def let_children_take_sigint() -> None:
    """The bench stops a run with SIGINT, so its children must not ignore it. A process started
    from a background job (`cmd &` in a script, nohup) ignores SIGINT and its children inherit
    the ignore; a Python-level handler, by contrast, is reset to the default at exec. So
    installing one here (main thread only, as `signal` requires) gives every child a working
    SIGINT. It changes nothing when SIGINT is already handled."""
    if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def stop_process(proc: subprocess.Popen, grace_s: float = STOP_GRACE_S) -> None:
    """SIGINT first: simulate then leaves its `with OwnerProcess` block, which stops the owner
    process (started in its own session, so only simulate can stop it). SIGKILL after grace_s."""
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def stop_all_processes() -> None:
    """Stop every child this process started that is still running (Ctrl-C on the bench)."""
    with _LIVE_LOCK:
        live = list(_LIVE)
    for proc in live:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
    for proc in live:
        stop_process(proc)


def _outcome(run: PlannedRun, run_dir: Path, returncode: int) -> dict[str, Any]:
    summary_path = run_dir / SUMMARY_FILE
    if returncode != 0:
        return {"status": "failed", "error": f"exit code {returncode}", "log_tail": _log_tail(run_dir / LOG_FILE)}
    try:
        summary = json.loads(summary_path.read_text())
    except (FileNotFoundError, json.JSONDecodeError) as error:
        return {"status": "failed", "error": f"no readable summary.json ({type(error).__name__})",
                "log_tail": _log_tail(run_dir / LOG_FILE)}
    problem = check_summary(run, summary)
    if problem:
        return {"status": "failed", "error": problem}
    return {"status": "ok", "summary": summary}


def run_all(runs: Sequence[PlannedRun], out: Path, workers: int, command_builder: CommandBuilder = simulate_command,
            progress: bool = True, timeout: float | None = None) -> tuple[list[dict[str, Any]], list[PlannedRun]]:
    """Run every planned run that is not done yet; return (records of all runs, the runs skipped)."""
    let_children_take_sigint()
    out = Path(out)
    skipped = [run for run in runs if is_done(out, run)]
    pending = [run for run in runs if run not in skipped]
    commit = git_commit()
    env = child_env(workers)
    by_id: dict[str, dict[str, Any]] = {run.run_id: load_record(out, run) or {} for run in skipped}
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool, \
            tqdm(total=len(pending), desc="bench", unit="run", disable=None if progress else True) as bar:
        failed = 0
        for phase in _phases(pending, workers):
            futures = [pool.submit(execute_run, run, out, command_builder, env, commit, timeout) for run in phase]
            try:
                for future in as_completed(futures):
                    record = future.result()
                    by_id[record["id"]] = record
                    failed += record["status"] != "ok"
                    bar.set_postfix(failed=failed, refresh=False)
                    bar.update(1)
            except KeyboardInterrupt:
                for future in futures:
                    future.cancel()
                stop_all_processes()
                raise
    return [by_id[run.run_id] for run in runs], skipped


def _phases(pending: Sequence[PlannedRun], workers: int) -> list[list[PlannedRun]]:
    """With several workers, one run per testbed goes first: it builds the cached tiny policy
    (minutes of SFT) once, instead of every concurrent run building its own copy."""
    if workers <= 1:
        return [list(pending)]
    first: dict[str, PlannedRun] = {}
    for run in pending:
        first.setdefault(run.testbed, run)
    rest = [run for run in pending if all(run is not f for f in first.values())]
    return [phase for phase in (list(first.values()), rest) if phase]


def gather_records(runs: Sequence[PlannedRun], out: Path) -> list[dict[str, Any]]:
    """Records for report-only: the bench's own, or built from run directories an external
    scheduler filled (`--list-runs`). A run directory whose resolved config disagrees with the
    plan is marked "stale", never reported as the planned run."""
    out = Path(out)
    records = []
    for run in runs:
        record = load_record(out, run)
        if record is not None and record.get("config_hash") == run.config_hash and not same_inputs(record, run):
            records.append({**base_record(run, out, git_commit()), "status": "stale",
                            "error": "the testbed changed since this run (its testbed digest differs)"})
            continue
        own = record if same_inputs(record, run) else None
        if own is not None and own.get("status") == "ok":
            records.append(own)
            continue
        gathered = _gather_from_dir(run, out)  # e.g. re-run elsewhere after failing here
        records.append(own if own is not None and gathered["status"] == "missing" else gathered)
    return records


def _gather_from_dir(run: PlannedRun, out: Path) -> dict[str, Any]:
    run_dir = run.run_dir(out)
    record = base_record(run, out, git_commit())
    record["gathered"] = True
    try:
        summary = json.loads((run_dir / SUMMARY_FILE).read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        record.update(status="missing", error="no record and no readable summary.json")
        return record
    problem = check_summary(run, summary) or _check_resolved(run, run_dir, summary)
    if problem:
        record.update(status="stale", error=problem)
    else:
        record.update(status="ok", summary=summary, wall_seconds=summary.get("wall_seconds"))
        write_record(out, run, record)
    return record


def _check_resolved(run: PlannedRun, run_dir: Path, summary: dict[str, Any]) -> str | None:
    """Compare the run's resolved_config.json (written by simulate) and DP mode with the plan.

    Both configs go through the same validation (defaults filled in) before comparing, so only
    a real difference (an option, an override, a default that changed since) makes it stale.
    """
    from trainer_node.config import ConfigError, parse_config

    try:
        resolved = json.loads((run_dir / "resolved_config.json").read_text())
        resolved.get("run", {}).pop("out_dir", None)
        found, expected = parse_config(resolved).to_json(), parse_config(run.config).to_json()
    except (FileNotFoundError, json.JSONDecodeError, ConfigError, AttributeError) as error:
        return f"cannot check the run's resolved_config.json ({type(error).__name__})"
    found, expected = _flatten(found), _flatten(expected)
    found.pop("run.out_dir", None)
    expected.pop("run.out_dir", None)
    differing = sorted(key for key in set(found) | set(expected) if found.get(key) != expected.get(key))
    if differing:
        return "resolved_config.json differs from the planned config at " + ", ".join(differing)
    if "dp_enabled" in summary and bool(summary["dp_enabled"]) == run.no_dp:
        return f"the run had DP {'on' if summary['dp_enabled'] else 'off'}, the spec says no_dp = {run.no_dp}"
    if run.epsilon is not None and not run.no_dp and summary.get("epsilon_budget") != run.epsilon:
        return f"the run's epsilon budget was {summary.get('epsilon_budget')}, the spec says {run.epsilon}"
    return None


def _flatten(config: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """{"grpo": {"lr": 1}} -> {"grpo.lr": 1}; policy options stay one value (compared whole)."""
    flat: dict[str, Any] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and name != "policy.options":
            flat.update(_flatten(value, f"{name}."))
        else:
            flat[name] = value
    return flat
