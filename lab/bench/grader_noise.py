"""How noisy is a rubric testbed's source grader? (prints a table; not a test)

    python -m lab.bench.grader_noise rubric_low rubric rubric_high [--draws 4000]

For one rubric row with five items (give the answer "3", start with "#", end with "!", at most 4
characters, no "7") and six answers meeting m = 0..5 of them, each testbed's `source_grader` is
drawn `--draws` times per answer (two draws each, keyed as the trainer keys them): the mean absolute
error of one draw against the exact fraction m / 5 for each m, its mean over m, and how often the
two draws of one response differ (SetGRPO's set is built from that disagreement; docs/SETGRPO.md).

With `--quantile Q` it also asks whether SetGRPO's coefficient set can exclude the origin under that
grader: for groups of 8 responses with given items met (all equal; one better by an item; half
better; a spread), each response graded by two draws, the share of groups whose box set
{c : ||c - m||_inf <= Q s} (m the two draws' mean coefficients, s their sup-norm disagreement plus
`disagreement_floor`, as trainer_node/grpo/update_rules/setgrpo.py builds it) leaves the origin out,
i.e. whose safe anchor is nonzero. A set that holds the origin has a zero anchor: no update to gate.
Q is what the runs calibrated (`setgrpo/quantile` in metrics.jsonl).

With `--gate` it runs SetGRPO's own coefficient module (trainer_node/grpo/update_rules/setgrpo.py,
unchanged: its calibration, recovery and risk gate) on synthetic steps instead, and prints how often
the gate accepts a training group:

    python -m lab.bench.grader_noise rubric_low rubric rubric_high --gate [--patterns ...] \
        [--floor 0.5 0.1] [--shape box sphere] [--k 8 16] [--zero-tol 0 1e-6] [--steps 30] [--streams 4]

Each step has `--groups` (16, the bench's batch) groups of K responses, every group with the same
pattern of items met (GATE_GROUPS: the --quantile patterns plus "two apart" (4 x 3, 4 x 5) and
"extremes" (4 x 0, 4 x 5); at K = 16 each response of the pattern twice), each response graded by
the testbed's source grader with the module's 2 + reference_draws draws (keyed as the trainer keys
them), and per-response policy-gradient features drawn as seeded Gaussians of dimension `--dim`
(the geometry; `--geometry identity` is the module's G = I ablation). SetGRPO's options are the
`setgrpo` method's of `--profile` (rubric_screen: the screen's and the evidence run's), with
`disagreement_floor`, `set_shape`, `zero_update_tol` and K swept. Per row, over the calibrated steps of `--streams`
seeded streams of `--steps` steps: the calibrated quantile q (last step, mean), the share of training
groups whose safe anchor is nonzero, whose gate statistic is finite (gateable), the steps with a
certified threshold, the accepted-group ratio (`setgrpo/accepted_ratio`, mean), the share of training
groups accepted with a vanishing update (||a(eta*)|| <= 1e-6 ||m||: a zero anchor whose bisection
ended at a vanishing eta*, within its tolerance of 0; such a group trains on ~nothing, see `--zero-tol`), and at the last
step the risk window's gateable records and the reversals among them (a threshold needs
certificate_size(beta, delta) gateable records with no reversal, more with some).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

import numpy as np

from rlvr_core.tasks.example import Example
from rlvr_core.tasks.testbed import TestbedError, load_testbed
from rlvr_core.verifiers.base import make_verifier
from rlvr_core.verifiers.draws import DrawKey

ITEMS = [{"name": "correct", "answer": "3"}, {"name": "starts_with", "char": "#"}, {"name": "ends_with", "char": "!"},
         {"name": "max_length", "chars": 4}, {"name": "forbidden", "char": "7"}]
ROW = Example(id="grader-noise", prompt="p", answer="#3!", verifier="rubric", metadata={"rubric": ITEMS})
ANSWERS = {0: "@77777", 1: "@7777!", 2: "#7777!", 3: "#77!", 4: "#3", 5: "#3!"}  # items met -> an answer
GROUPS = {"all equal": [4] * 8, "one better": [4] * 7 + [5], "half better": [4] * 4 + [5] * 4,
          "spread": [1, 2, 3, 3, 4, 4, 5, 5]}  # items met by each of a group's 8 responses
GATE_GROUPS = {**GROUPS, "two apart": [3] * 4 + [5] * 4, "extremes": [0] * 4 + [5] * 4}


def noise(spec: dict, draws: int) -> tuple[list[float], float]:
    """(MAE of one draw for m = 0..5, mean P(two draws differ))."""
    grader = make_verifier(spec)
    mae, differ = [], []
    for met, answer in ANSWERS.items():
        d = np.array([grader.score_draws(answer, ROW, DrawKey.of(0, ROW.id, k), 2) for k in range(draws)])
        mae.append(float(np.abs(d[:, 0] - met / len(ITEMS)).mean()))
        differ.append(float((d[:, 0] != d[:, 1]).mean()))
    return mae, float(np.mean(differ))


def anchor_share(spec: dict, met: list[int], quantile: float, groups: int, floor: float) -> float:
    """The share of `groups` seeded groups whose box set at `quantile` leaves the origin out."""
    import torch

    from trainer_node.grpo.setgrpo import safe_anchor, set_norm, standardise

    grader = make_verifier(spec)
    out = 0
    for g in range(groups):
        draws = torch.tensor([grader.score_draws(ANSWERS[m], ROW, DrawKey.of(g, ROW.id, k), 2)
                              for k, m in enumerate(met)], dtype=torch.float64)
        a1, a2 = standardise(draws[:, 0]), standardise(draws[:, 1])
        centre, scale = 0.5 * (a1 + a2), set_norm(a1 - a2, "box") + floor
        out += bool(safe_anchor(centre, quantile * scale, "box").abs().max() > 0)
    return out / groups


def profile_options(profile: str, label: str = "setgrpo") -> dict:
    """The SetGRPO coefficient options of a bench profile's method (lab/bench/profiles/<profile>.toml)."""
    import tomllib
    from pathlib import Path

    path = Path(__file__).parent / "profiles" / f"{profile}.toml"
    if not path.is_file():
        raise ValueError(f"--profile: no {path}")
    for method in tomllib.loads(path.read_text()).get("methods", []):
        if method.get("label") == label and (method.get("coefficients") or {}).get("name") == "setgrpo":
            return dict(method["coefficients"])
    raise ValueError(f"--profile: {profile} has no method {label!r} with setgrpo coefficients")


def gate_run(spec: dict, met: list[int], options: dict, k: int = 8, steps: int = 30, groups: int = 16,
             stream: int = 0, dim: int = 64) -> dict[str, float]:
    """One seeded stream of `steps` synthetic steps through SetGRPO's own module: `groups` groups of
    `k` responses meeting `met` items (repeated to k), graded by `spec`; the gate's figures over the
    calibrated steps (NaN where no step was calibrated)."""
    import math

    import torch

    from trainer_node.grpo import setgrpo as sg
    from trainer_node.grpo.update_rules.setgrpo import SetGrpo, SetGrpoOptions
    from trainer_node.grpo.update_seam import UpdateInput

    if k % len(met):
        raise ValueError(f"k = {k}: not a multiple of the pattern's {len(met)} responses")
    met = [m for m in met for _ in range(k // len(met))]
    rule = SetGrpo(SetGrpoOptions(**{**options, "seed": stream}))
    grader, draws = make_verifier(spec), rule.grader_draws
    rng = np.random.default_rng([stream, k, dim])
    n = groups * k
    group_ids = torch.arange(groups).repeat_interleave(k)
    rows = [torch.arange(g * k, (g + 1) * k) for g in range(groups)]
    q, anchors, gateable, accepted, certified, vanishing = math.nan, [], [], [], [], []
    for step in range(steps):
        scores = torch.tensor([grader.score_draws(ANSWERS[met[i % k]], ROW, DrawKey(stream * 100_003 + step, g, i),
                                                  draws) for g in range(groups) for i in range(k)], dtype=torch.float64)
        features = torch.tensor(rng.standard_normal((n, dim)), dtype=torch.float64)
        out = rule.coefficients(UpdateInput(
            rewards=scores[:, 0].clone(), advantages=torch.zeros(n, dtype=torch.float64), group_ids=group_ids,
            lengths=torch.ones(n), completion_mask=torch.ones(n, 1), keep=torch.ones(n, dtype=torch.bool),
            grader_scores=scores, group_geometry={"features": features}))
        metrics = rule.metrics()
        if metrics["setgrpo/calibrated"] != 1:
            continue
        q = metrics["setgrpo/quantile"]
        trained = [r for r in rows if bool(out.keep[r].all())]
        tiny = 0
        for r in trained:
            centre, scale = rule.group_set(scores, r)
            anchors.append(float(sg.safe_anchor(centre, q * scale, rule.options.set_shape).abs().max()) > 0)
            tiny += int(float(out.advantages[r].norm()) <= 1e-6 * float(centre.norm()))  # accepted, ~0 update
        vanishing.append(tiny / len(trained) if trained else math.nan)
        gateable.append(metrics["setgrpo/gateable_ratio"])
        accepted.append(metrics["setgrpo/accepted_ratio"])
        certified.append(math.isfinite(metrics["setgrpo/tau_sel"]))
    records = rule.risk_records(q) if math.isfinite(q) else []
    finite = [reversed_ for rho, reversed_ in records if math.isfinite(rho)]

    def mean(values: list) -> float:
        values = [v for v in values if v is not None and math.isfinite(v)]
        return float(np.mean(values)) if values else math.nan

    return {"q": q, "anchor": mean([float(a) for a in anchors]), "gateable": mean(gateable),
            "certified": mean([float(c) for c in certified]), "accepted": mean(accepted),
            "vanishing": mean(vanishing),
            "risk_records": float(len(records)), "risk_gateable": float(len(finite)),
            "risk_reversals": float(sum(finite)), "calibrated_steps": float(len(accepted))}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lab.bench.grader_noise", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("testbeds", nargs="+", metavar="TESTBED")
    parser.add_argument("--draws", type=int, default=4000, help="draws per answer (default 4000)")
    parser.add_argument("--quantile", type=float, metavar="Q", help="also the share of groups whose SetGRPO "
                        "box set at radius Q x disagreement leaves the origin out")
    parser.add_argument("--groups", type=int, default=1000, help="groups per pattern with --quantile (default 1000)")
    gate = parser.add_argument_group("--gate: SetGRPO's own module on synthetic steps")
    gate.add_argument("--gate", action="store_true", help="run SetGRPO's calibration, recovery and gate on "
                      "synthetic steps (replaces the noise table)")
    gate.add_argument("--patterns", nargs="+", default=list(GATE_GROUPS), metavar="PATTERN",
                      help=f"patterns of items met (default all: {', '.join(GATE_GROUPS)})")
    gate.add_argument("--floor", type=float, nargs="+", metavar="F", help="disagreement_floor values "
                      "(default: the profile's, else the module's 0.5; must be > 0)")
    gate.add_argument("--zero-tol", dest="zero_tol", type=float, nargs="+", metavar="T",
                      help="zero_update_tol values (default: the profile's, else the module's 0)")
    gate.add_argument("--shape", nargs="+", choices=["box", "sphere"], help="set_shape values (default: the profile's)")
    gate.add_argument("--k", type=int, nargs="+", default=[8], help="group sizes, multiples of 8 (default 8)")
    gate.add_argument("--geometry", choices=["policy", "identity"], default="policy",
                      help="'policy': Gaussian features; 'identity': G = I (the module's ablation)")
    gate.add_argument("--profile", default="rubric_screen", help="bench profile whose 'setgrpo' method gives the "
                      "options (default rubric_screen)")
    gate.add_argument("--steps", type=int, default=30, help="steps per stream (default 30, the evidence run's)")
    gate.add_argument("--streams", type=int, default=4, help="seeded streams per row (default 4)")
    gate.add_argument("--groups-per-step", dest="groups_per_step", type=int, default=16,
                      help="groups per step (default 16, the bench's policy.batch_size)")
    gate.add_argument("--dim", type=int, default=64, help="feature dimension of the synthetic geometry (default 64)")
    args = parser.parse_args(argv)
    if args.gate:
        return gate_table(parser, args)
    if args.draws < 1:
        parser.error("--draws: at least 1")
    if args.quantile is not None and not args.quantile > 0:
        parser.error("--quantile: must be > 0")
    if args.groups < 1:
        parser.error("--groups: at least 1")
    print("| testbed | source grader | MAE at m = 0 1 2 3 4 5 | mean MAE | P(two draws differ) |")
    print("|---|---|---|---|---|")
    for name in args.testbeds:
        spec = source_grader_or_exit(parser, name)
        mae, differ = noise(spec, args.draws)
        options = ", ".join(f"{k} {v}" for k, v in spec.items() if k != "name")
        print(f"| {name} | {spec['name']} ({options}) | {' '.join(f'{x:.3f}' for x in mae)} | {np.mean(mae):.3f} "
              f"| {differ:.2f} |")
    if args.quantile is not None:
        from trainer_node.grpo.update_rules.setgrpo import SetGrpoOptions

        floor = SetGrpoOptions.model_fields["disagreement_floor"].default
        print(f"\nshare of groups of 8 whose box set at q = {args.quantile} (floor {floor}) leaves the origin out")
        print("| testbed | " + " | ".join(f"{name} {met}" for name, met in GROUPS.items()) + " |")
        print("|---|" + "---|" * len(GROUPS))
        for name in args.testbeds:
            spec = load_testbed(name).source_grader
            shares = [anchor_share(spec, met, args.quantile, args.groups, floor) for met in GROUPS.values()]
            print(f"| {name} | " + " | ".join(f"{x:.3f}" for x in shares) + " |")
    return 0


def source_grader_or_exit(parser: argparse.ArgumentParser, name: str) -> dict:
    """The testbed's source grader spec; a bad testbed, or one without a noisy grader, ends the command."""
    try:
        spec = load_testbed(name).source_grader
    except TestbedError as error:
        parser.error(str(error))
    if spec is None:
        parser.error(f"{name}: the testbed declares no source_grader (its rows' exact verifiers reward rollouts)")
    return spec


def gate_table(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    import itertools

    from trainer_node.grpo.setgrpo import certificate_size
    from trainer_node.grpo.update_rules.setgrpo import SetGrpoOptions

    unknown = [p for p in args.patterns if p not in GATE_GROUPS]
    if unknown:
        parser.error(f"--patterns: unknown {unknown} (choose from {list(GATE_GROUPS)})")
    if any(k < 8 or k % 8 for k in args.k):
        parser.error("--k: multiples of 8")
    if args.floor and any(not f > 0 for f in args.floor):
        parser.error("--floor: must be > 0 (the module's option; use e.g. 1e-6 for none)")
    if min(args.steps, args.streams, args.groups_per_step, args.dim) < 1 or args.groups_per_step < 2:
        parser.error("--steps, --streams, --dim: at least 1; --groups-per-step: at least 2")
    try:
        base = {**profile_options(args.profile), "geometry": args.geometry}
    except ValueError as error:
        parser.error(str(error))
    defaults = SetGrpoOptions(**base)
    floors = args.floor or [defaults.disagreement_floor]
    shapes = args.shape or [defaults.set_shape]
    zero_tols = args.zero_tol or [defaults.zero_update_tol]
    need = certificate_size(defaults.beta, defaults.delta)
    print(f"SetGRPO's module on synthetic steps: profile {args.profile} ({', '.join(f'{k} {v}' for k, v in base.items() if k != 'name')}); "
          f"{args.groups_per_step} groups a step, {args.steps} steps x {args.streams} streams; features N(0, 1)^{args.dim}; "
          f"a threshold needs >= {need} gateable risk records with no reversal")
    columns = ["testbed", "pattern", "K", "set", "floor", "zero tol", "q (last)", "anchor != 0", "gateable", "certified steps",
               "accepted", "of which ~0 updates", "risk records: gateable / all, reversals"]
    print("| " + " | ".join(columns) + " |")
    print("|" + "---|" * len(columns))
    for name in args.testbeds:
        spec = source_grader_or_exit(parser, name)
        for pattern, k, shape, floor, zero_tol in itertools.product(args.patterns, args.k, shapes, floors, zero_tols):
            options = {**base, "set_shape": shape, "disagreement_floor": floor, "zero_update_tol": zero_tol}
            runs = [gate_run(spec, GATE_GROUPS[pattern], options, k, args.steps, args.groups_per_step, stream, args.dim)
                    for stream in range(args.streams)]

            def avg(key: str, runs: list = runs) -> float:
                values = [r[key] for r in runs if np.isfinite(r[key])]
                return float(np.mean(values)) if values else float("nan")

            cells = [name, pattern, str(k), shape, f"{floor:g}", f"{zero_tol:g}", f"{avg('q'):.2f}", f"{avg('anchor'):.3f}",
                     f"{avg('gateable'):.3f}", f"{avg('certified'):.2f}", f"{avg('accepted'):.3f}", f"{avg('vanishing'):.3f}",
                     f"{avg('risk_gateable'):.0f} / {avg('risk_records'):.0f}, {avg('risk_reversals'):.1f}"]
            print("| " + " | ".join(cells) + " |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
