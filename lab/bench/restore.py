"""Seed a bench folder with the finished runs of a published results.json (docs/results/*.json).

A profile that gains rows need not re-run the rows it already published: every run record a
bench writes is in its results.json (`runs`), summary included. `restore_runs` writes each one
back as OUT/records/<id>.json and its run directory's summary.json, so the bench counts it as
done and runs only the rest. A published run is restored only when it is of the planned run
(the same config hash and, where the record has one, the same testbed digest: runner.same_inputs)
and OUT holds no finished run of that id already. The record keeps its own git commit and
start digest, so the report pairs it only with runs from the same starting checkpoint, and it
is marked `restored_from`.

What a results.json does not hold is each run's metrics.jsonl: a restored run has no
evaluation curve and no per-step q, so the area metric and the q-per-cluster figure count
only the seeds that were run in OUT.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from lab.bench import runner
from lab.bench.spec import PlannedRun


@dataclass
class Restored:
    restored: list[str] = field(default_factory=list)
    already_done: list[str] = field(default_factory=list)
    other_inputs: list[str] = field(default_factory=list)  # the plan changed since: these re-run
    not_published: int = 0


def published_runs(results_json: Path) -> dict[str, dict]:
    """The finished runs of a results.json, by run id; ValueError naming the file when it has none."""
    path = Path(results_json)
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise ValueError(f"--restore: cannot read {path} as a bench results.json ({error})") from None
    runs = data.get("runs") if isinstance(data, dict) else None
    if not isinstance(runs, list):  # a file error to the user, not a type error in the code
        raise ValueError(  # noqa: TRY004
            f"--restore: {path} has no 'runs' list; expected a bench results.json")
    return {r["id"]: r for r in runs if isinstance(r, dict) and r.get("status") == "ok"
            and isinstance(r.get("summary"), dict) and "id" in r}


def restore_runs(results_json: Path, runs: Sequence[PlannedRun], out: Path, write: bool = True) -> Restored:
    """Write the published runs of `runs` into `out` (module docstring); OUT's own finished runs win.
    With write=False (a dry run) only say what would be restored."""
    published = published_runs(results_json)
    outcome = Restored()
    for run in runs:
        record = published.get(run.run_id)
        if record is None:
            outcome.not_published += 1
        elif runner.is_done(out, run):
            outcome.already_done.append(run.run_id)
        elif not runner.same_inputs(record, run):
            outcome.other_inputs.append(run.run_id)
        elif not write:
            outcome.restored.append(run.run_id)
        else:
            run_dir = run.run_dir(out)
            run_dir.mkdir(parents=True, exist_ok=True)
            (run_dir / runner.SUMMARY_FILE).write_text(json.dumps(record["summary"], indent=2, sort_keys=True) + "\n")
            # same_inputs held, so the testbed is the planned one: its data digest is this one's
            runner.write_record(out, run, {**record, "run_dir": str(run_dir),
                                           "testbed_data_digest": runner.testbed_data_digest(run),
                                           "restored_from": str(results_json)})
            outcome.restored.append(run.run_id)
    return outcome
