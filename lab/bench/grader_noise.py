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


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lab.bench.grader_noise", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("testbeds", nargs="+", metavar="TESTBED")
    parser.add_argument("--draws", type=int, default=4000, help="draws per answer (default 4000)")
    parser.add_argument("--quantile", type=float, metavar="Q", help="also the share of groups whose SetGRPO "
                        "box set at radius Q x disagreement leaves the origin out")
    parser.add_argument("--groups", type=int, default=1000, help="groups per pattern with --quantile (default 1000)")
    args = parser.parse_args(argv)
    if args.draws < 1:
        parser.error("--draws: at least 1")
    if args.quantile is not None and not args.quantile > 0:
        parser.error("--quantile: must be > 0")
    if args.groups < 1:
        parser.error("--groups: at least 1")
    print("| testbed | source grader | MAE at m = 0 1 2 3 4 5 | mean MAE | P(two draws differ) |")
    print("|---|---|---|---|---|")
    for name in args.testbeds:
        try:
            spec = load_testbed(name).source_grader
        except TestbedError as error:
            parser.error(str(error))
        if spec is None:
            parser.error(f"{name}: the testbed declares no source_grader (its rows' exact verifiers reward rollouts)")
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


if __name__ == "__main__":
    raise SystemExit(main())
