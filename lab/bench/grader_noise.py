"""How noisy is a rubric testbed's source grader? (prints a table; not a test)

    python -m lab.bench.grader_noise rubric_low rubric rubric_high [--draws 4000]

For one rubric row with five items (give the answer "3", start with "#", end with "!", at most 4
characters, no "7") and six answers meeting m = 0..5 of them, each testbed's `source_grader` is
drawn `--draws` times per answer (two draws each, keyed as the trainer keys them): the mean absolute
error of one draw against the exact fraction m / 5 for each m, its mean over m, and how often the
two draws of one response differ (SetGRPO's set is built from that disagreement; docs/SETGRPO.md).
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


def noise(spec: dict, draws: int) -> tuple[list[float], float]:
    """(MAE of one draw for m = 0..5, mean P(two draws differ))."""
    grader = make_verifier(spec)
    mae, differ = [], []
    for met, answer in ANSWERS.items():
        d = np.array([grader.score_draws(answer, ROW, DrawKey.of(0, ROW.id, k), 2) for k in range(draws)])
        mae.append(float(np.abs(d[:, 0] - met / len(ITEMS)).mean()))
        differ.append(float((d[:, 0] != d[:, 1]).mean()))
    return mae, float(np.mean(differ))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lab.bench.grader_noise", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("testbeds", nargs="+", metavar="TESTBED")
    parser.add_argument("--draws", type=int, default=4000, help="draws per answer (default 4000)")
    args = parser.parse_args(argv)
    if args.draws < 1:
        parser.error("--draws: at least 1")
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
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
