"""`trainer-node bench`: plan, run, resume and report a benchmark (see lab.bench)."""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from lab.bench.spec import BenchSpec

DEFAULT_OUT_ROOT = Path("bench_runs")


def add_bench_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register the `bench` subcommand (sets run=run_bench, the trainer CLI's convention)."""
    parser = subparsers.add_parser(
        "bench",
        help="compare data policies over matched seeds: paired CIs, RO ratios, the paper's tables",
        description=(
            "Run every (testbed, method, seed) of a bench spec as one `trainer-node simulate`\n"
            "subprocess, then write OUT/report.md (Table 1, Table 2, lambda sweep), PNG figures\n"
            "and OUT/results.json. Finished runs with an unchanged config are skipped (resume)."
        ),
        epilog=(
            "examples:\n"
            "  trainer-node bench --profile quick                 # 3 seeds: uniform, dapo, l2rr\n"
            "  trainer-node bench --spec my.toml --dry-run        # the plan, nothing run\n"
            "  trainer-node bench --profile full --list-runs > runs.txt   # for GNU parallel / Slurm / Ray\n"
            "  trainer-node bench --profile full --report-only    # gather records, write the report\n"
            "  trainer-node bench --profile dataflex --seeds 0-5  # a long profile, six seeds at a time\n"
            "spec reference: lab/bench/profiles/full.toml"
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--spec", type=Path, help="a bench spec TOML")
    source.add_argument("--profile", metavar="quick|full", help="a built-in spec (lab/bench/profiles/)")
    parser.add_argument("--out", type=Path, help="output directory (default: bench_runs/<spec name>)")
    parser.add_argument("--workers", type=int, help="concurrent runs (default: spec.workers or cpu_count // 2)")
    parser.add_argument("--timeout", type=float, help="seconds before one run is killed and recorded as failed")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--dry-run", action="store_true", help="print the planned runs and which would be skipped")
    mode.add_argument("--list-runs", action="store_true",
                      help="write the run configs and print one simulate command per pending run, one per line")
    mode.add_argument("--report-only", action="store_true",
                      help="run nothing: gather records (or run dirs filled elsewhere) and write the report")
    parser.add_argument("--control", metavar="LABEL",
                        help="pair every method against this label instead of the spec's control; the report, "
                             "results.json and PNGs then go to OUT/vs-LABEL/ (e.g. --report-only --control l2rr)")
    parser.add_argument("--restore", type=Path, metavar="RESULTS_JSON",
                        help="first count the finished runs of a published results.json (docs/results/) as "
                             "done, where their config is the plan's: a profile that gained rows runs only those "
                             "(lab/bench/restore.py; restored runs carry no per-step metrics)")
    parser.add_argument("--seeds", type=parse_seed_selection, metavar="LIST",
                        help="only these of the spec's seeds, e.g. 0-5 or 0,3,7: a long profile in slices, seed by "
                             "seed (each run keeps the full profile's config hash, so a later slice adds to the same "
                             "OUT); with --report-only, a report over these seeds only")
    parser.add_argument("--methods", type=parse_labels, metavar="LABELS",
                        help="only these method labels, comma-separated (the control must stay); like --seeds")
    parser.add_argument("--testbeds", type=parse_labels, metavar="NAMES",
                        help="only these of the spec's testbeds, comma-separated; like --seeds")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.set_defaults(run=run_bench)


def parse_seed_selection(text: str) -> list[int]:
    """'0-5' or '0,3,7' or '0-2,9' -> sorted distinct seeds (argparse names the flag on an error)."""
    seeds: set[int] = set()
    for part in text.split(","):
        low, dash, high = part.strip().partition("-")
        try:
            first, last = int(low), int(high if dash else low)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{part.strip()!r} is not a seed or a range like 0-5") from None
        if last < first:
            raise argparse.ArgumentTypeError(f"range {part.strip()!r} is empty; write it low-high")
        seeds.update(range(first, last + 1))
    return sorted(seeds)


def parse_labels(text: str) -> list[str]:
    """'a,b' -> ['a', 'b'] (method labels or testbed names)."""
    labels = [part.strip() for part in text.split(",") if part.strip()]
    if not labels:
        raise argparse.ArgumentTypeError("give at least one name, comma-separated")
    return labels


def select_slice(spec: BenchSpec, seeds: list[int] | None = None, methods: list[str] | None = None,
                 testbeds: list[str] | None = None) -> BenchSpec:
    """The spec restricted to some of its seeds, methods and testbeds; each run's config hash is unchanged.
    A name the spec lacks fails naming the flag and what the spec has; the slice must keep the controls."""
    from lab.bench.spec import BenchSpecError, parse_spec

    update: dict[str, Any] = {}
    for flag, chosen, have in (("--seeds", seeds, spec.seeds), ("--testbeds", testbeds, spec.testbeds),
                               ("--methods", methods, [method.label for method in spec.methods])):
        if chosen is None:
            continue
        unknown = [item for item in chosen if item not in have]
        if unknown:
            raise BenchSpecError(f"{flag}: {', '.join(map(str, unknown))} not among the spec's "
                                 f"{flag.removeprefix('--')} ({', '.join(map(str, have))})")
        update[flag.removeprefix("--")] = [item for item in have if item in chosen]
    if "methods" in update:
        controls = [spec.control, *spec.family_controls.values()]
        missing = [label for label in dict.fromkeys(controls) if label not in update["methods"]]
        if missing:
            raise BenchSpecError(f"--methods: keep the control(s) {', '.join(missing)} (every row is paired "
                                 f"against them), or name another with --control")
        update["methods"] = [method for method in spec.methods if method.label in update["methods"]]
    raw = {**spec.model_dump(exclude_unset=True), **{key: value for key, value in update.items() if key != "methods"}}
    if "methods" in update:
        raw["methods"] = [method.model_dump(exclude_unset=True) for method in update["methods"]]
    return parse_spec(raw, source="(a slice of the spec)")


def run_bench(args: argparse.Namespace) -> int:
    """Exit code: 0 when every planned run has results, 1 when some failed or are missing."""
    from lab.bench import runner
    from lab.bench.spec import BenchSpecError, load_profile, load_spec, plan_runs

    spec = load_spec(args.spec) if args.spec else load_profile(args.profile)
    out = args.out or DEFAULT_OUT_ROOT / spec.name
    report_dir = out
    if args.control is not None and args.control != spec.control:
        labels = [m.label for m in spec.methods]
        if args.control not in labels:
            raise BenchSpecError(f"--control: {args.control!r} is not a method label; labels: {', '.join(labels)}")
        spec = spec.model_copy(update={"control": args.control})
        report_dir = out / f"vs-{args.control}"
    if (args.seeds, args.methods, args.testbeds) != (None, None, None):
        spec = select_slice(spec, args.seeds, args.methods, args.testbeds)
    if args.workers is not None and args.workers < 1:
        raise BenchSpecError(f"--workers must be >= 1, got {args.workers}")
    workers = args.workers or spec.resolved_workers()
    runs = plan_runs(spec)
    if args.restore is not None:
        from lab.bench.restore import restore_runs

        try:
            restored = restore_runs(args.restore, runs, out, write=not args.dry_run)
        except ValueError as error:
            raise BenchSpecError(str(error)) from None
        verb = "would restore" if args.dry_run else "restored"
        print(f"bench: {verb} {len(restored.restored)} runs from {args.restore} "
              f"({len(restored.already_done)} already done here, {len(restored.other_inputs)} published with "
              f"another config or testbed: they run again)", file=sys.stderr)

    if args.dry_run:
        done = sum(runner.is_done(out, run) for run in runs)
        print(f"bench {spec.name!r}: {len(runs)} runs ({len(spec.methods)} methods x {len(spec.seeds)} seeds x "
              f"{len(spec.testbeds)} testbeds), {done} done, {len(runs) - done} to run, {workers} workers, out {out}")
        for run in runs:
            state = "done" if runner.is_done(out, run) else "run "
            print(f"  {state} {run.run_id}  hash {run.config_hash[:12]}")
        return 0
    if args.list_runs:
        for run in runs:
            if not runner.is_done(out, run):
                command = runner.simulate_command(run, run.run_dir(out), runner.write_run_config(out, run))
                print(shlex.join(command))
        return 0

    if args.report_only:
        records = runner.gather_records(runs, out)
    else:
        records, skipped = runner.run_all(runs, out, workers, progress=not args.no_progress, timeout=args.timeout)
        if skipped:
            print(f"bench: {len(skipped)} of {len(runs)} runs already done (same config hash), skipped", file=sys.stderr)
    report = write_outputs(spec, records, out, report_dir)
    bad = [r for r in records if r.get("status") != "ok"]
    print(f"bench: {len(records) - len(bad)} of {len(records)} runs have results; report {report}")
    for record in bad:
        print(f"  {record['status']}: {record['id']}: {(record.get('error') or '').splitlines()[0] if record.get('error') else ''}",
              file=sys.stderr)
    return 1 if bad else 0


def write_outputs(spec: BenchSpec, records: list[dict[str, Any]], out: Path, report_dir: Path | None = None) -> Path:
    """results.json, the figures and report.md (in report_dir, default out), all from the records."""
    from lab.bench.plots import write_plots
    from lab.bench.report import write_report
    from lab.bench.results import compute_results, json_safe

    out = Path(out)
    dest = Path(report_dir) if report_dir is not None else out
    dest.mkdir(parents=True, exist_ok=True)
    results = compute_results(spec, records, out)
    (dest / "results.json").write_text(json.dumps(json_safe(results), indent=2, sort_keys=True, allow_nan=False) + "\n")
    return write_report(results, dest, write_plots(results, dest))
