"""`trainer-node bench`: honest comparisons of data policies at testbed scale.

A bench spec (TOML; built-ins: `--profile quick`, `--profile full`) names methods, seeds,
testbeds and a step count. The bench runs every (testbed, method, seed) as one
`trainer-node simulate` subprocess and reports, per testbed, the paper's Table 1 (methods) and
Table 2 (ablations, each beside its full method): per-domain target test accuracy (mean ± sd), the domain-balanced
average, # rollouts, RO ratio, and the paired difference to the control with a paired-t and
a bootstrap 95% interval; plus the λ sweep (Figure 2), the sampler's share and waste per
cluster (Figure 1) and accuracy vs cumulative rollouts. Definitions: stats.py.

Seeds are matched: seed s gives every method the same initial policy and the same source
order, so differences are paired over seeds.

Modules: spec (what to run), runner (subprocesses, records, resume), stats (pure statistics),
results (records -> results.json), report (report.md), plots (PNGs), cli (the subcommand),
metric_noise (from a results.json: which metric's paired differences see through seed noise).

Output (OUT defaults to bench_runs/<spec name>):
    OUT/configs/<id>.toml, OUT/runs/<testbed>/<label>/seed<s>/, OUT/records/<id>.json,
    OUT/results.json, OUT/report.md, OUT/*.png

Multi-machine sweeps: the bench does not schedule across machines; hand its commands to an
engine that does, then gather. With OUT on a filesystem every machine sees (same path):

    trainer-node bench --profile full --out /shared/bench --list-runs > runs.txt
    parallel -j 4 < runs.txt                                 # GNU parallel, one machine
    sbatch --array=1-$(wc -l < runs.txt) job.sh              # Slurm: job.sh runs line
                                                             #   $SLURM_ARRAY_TASK_ID of runs.txt
    # Ray: ray.get([ray.remote(subprocess.run).remote(shlex.split(line)) for line in lines])
    trainer-node bench --profile full --out /shared/bench --report-only

`--list-runs` writes each run's config under OUT/configs/ and prints one shell-quoted
simulate command per run not yet done. `--report-only` runs nothing: it uses each run's
record, or builds one from a run directory filled elsewhere after checking its summary.json
(method, seed, steps, testbed) and resolved_config.json (policy options) against the plan
(a mismatch is reported as "stale", never used). Commands use the Python that printed them
(sys.executable); edit the first word if the workers' environment differs. Run them from the
repository root (the tiny-policy cache path in the configs is relative), and let one run per
testbed finish first so the others reuse its cached tiny policy instead of each building one.
"""

from lab.bench.cli import add_bench_parser

__all__ = ["add_bench_parser"]
