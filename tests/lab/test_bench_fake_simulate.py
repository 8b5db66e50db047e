"""A fake `trainer-node simulate` for the bench tests (run as a script), and a check that it
writes what the real one writes.

It takes the real command line (--method --testbed --seed --steps --out --config [--no-dp]),
reads the run config the bench wrote, and leaves summary.json, metrics.jsonl and
resolved_config.json shaped like lab/simulate.py's, with deterministic numbers:
accuracy = a per-seed offset shared by all methods (what matched seeds buy) + a per-method
bonus + small per-(method, seed) noise. On the `dataflex` testbed it reports the nine
benchmarks, each method with its own deterministic trade-off between the three families (so
summaries can rank methods differently). A method labelled "broken" exits 3; one labelled
"slow" sleeps 60 s first (policy options are typed now, so the label carries the test's wish;
the run directory is runs/<testbed>/<label>/seed<N>).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import tomllib
from pathlib import Path

BONUS = {"uniform": 0.0, "dapo": 0.01, "greso": 0.012, "ar3po": 0.015, "l2rr": 0.05, "oracle": 0.06}
ROLLOUTS_PER_STEP = {"uniform": 64, "dapo": 80, "greso": 48, "ar3po": 40, "l2rr": 40, "oracle": 64}
CLUSTERS = ("add:easy", "add:medium", "sub:medium", "spell")
DATAFLEX_BENCHMARKS = {"math_add": "math", "math_sub": "math", "math_mul": "math", "math_gcd": "math",
                       "logic_syllogism": "logic", "logic_aiw": "logic", "logic_family": "logic",
                       "text_count": "text", "text_spell": "text"}


def _unit(*parts: object) -> float:
    """A deterministic number in [0, 1) from the parts."""
    digest = hashlib.sha256(repr(parts).encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def fake_accuracy(method: str, options: dict, seed: int, progress: float, testbed: str = "default",
                  label: str = "") -> dict[str, float]:
    lam = options.get("lambda_waste", 0.25) if options.get("waste_penalty", True) else 0.0
    bonus = BONUS.get(method, 0.0) - (0.04 * abs(lam - 0.25) if method == "l2rr" else 0.0)
    base = 0.30 + 0.05 * _unit("seed", seed) + progress * (bonus + 0.004 * _unit(method, lam, seed))
    if testbed == "dataflex":  # a per-label trade-off between families, plus per-benchmark levels
        return {b: round(base + 0.1 * _unit(b) + progress * 0.06 * (_unit(label, family) - 0.5)
                         + 0.002 * _unit(label, b, seed), 6)
                for b, family in DATAFLEX_BENCHMARKS.items()}
    return {"add": round(base + 0.02, 6), "sub": round(base - 0.02, 6)}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    for flag in ("--method", "--testbed", "--out", "--config"):
        parser.add_argument(flag, required=True)
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--no-dp", action="store_true")
    parser.add_argument("--no-progress", action="store_true")
    parser.add_argument("--epsilon", type=float, default=8.0)
    args = parser.parse_args(argv)
    config = tomllib.loads(Path(args.config).read_text())
    options = config["policy"]  # the policy's options sit directly in [policy]
    label = Path(args.out).parent.name
    if label == "slow":
        import time

        time.sleep(60)  # SIGINT (the bench's timeout) interrupts this
    if label == "broken":
        print("fake simulate: failing on purpose", file=sys.stderr)
        return 3
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    eval_every = config["run"].get("eval_every", 0)
    per_step = ROLLOUTS_PER_STEP.get(args.method, 64)
    lines, rollouts = [], 0

    def evaluation(step: int) -> dict:
        domains = fake_accuracy(args.method, options, args.seed, step / args.steps, args.testbed, label)
        return {"kind": "eval", "name": "target_test", "step": step, "rollouts_cumulative": step * per_step,
                "accuracy": sum(domains.values()) / len(domains), **{f"accuracy/{d}": a for d, a in domains.items()}}

    before = evaluation(0)
    lines.append(before)
    for step in range(args.steps):
        rollouts += per_step
        record = {"kind": "train", "step": step, "rollouts_cumulative": rollouts, "reward_mean": 0.1,
                  "reward/math:add": step / args.steps, "reward/math:mul": 0.0, "reward/logic:aiw": 0.5}
        if args.method == "l2rr":
            for i, cluster in enumerate(CLUSTERS):
                record[f"q/{cluster}"] = (1 + i * step / args.steps) / (len(CLUSTERS) + 1.5 * step / args.steps)
                record[f"waste/{cluster}"] = float(min(step, 18) * (i % 2))
        lines.append(record)
        if eval_every and step + 1 < args.steps and (step + 1) % eval_every == 0:
            lines.append(evaluation(step + 1))
    after = evaluation(args.steps)
    lines.append(after)
    (out / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    resolved = json.loads(json.dumps(config))
    resolved["run"]["out_dir"] = str(out)
    (out / "resolved_config.json").write_text(json.dumps(resolved))
    summary = {
        "method": args.method, "testbed": args.testbed, "seed": args.seed, "steps": args.steps,
        "target_accuracy_before": before["accuracy"], "target_accuracy_after": after["accuracy"],
        "target_domain_accuracy_before": {k.split("/", 1)[1]: v for k, v in before.items() if k.startswith("accuracy/")},
        "target_domain_accuracy_after": {k.split("/", 1)[1]: v for k, v in after.items() if k.startswith("accuracy/")},
        "rollouts": rollouts, "epsilon_spent": 0.0 if args.no_dp else 0.5, "epsilon_budget": 0.0 if args.no_dp else args.epsilon,
        "dp_enabled": not args.no_dp, "wall_seconds": 0.01,
    }
    (out / "summary.json").write_text(json.dumps(summary))
    return 0


def _real_summary_keys() -> set[str]:
    """SUMMARY_KEYS of lab/simulate.py, read without importing torch and grpc."""
    import ast
    import importlib.util

    lab_dir = Path(importlib.util.find_spec("lab").submodule_search_locations[0])
    source = (lab_dir / "simulate.py").read_text()
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "SUMMARY_KEYS" for t in node.targets):
            return set(ast.literal_eval(node.value))
    raise AssertionError("lab/simulate.py has no SUMMARY_KEYS")


def test_fake_writes_every_key_the_real_simulate_promises(tmp_path):
    config = tmp_path / "c.toml"
    config.write_text('[policy]\nname = "l2rr"\n[run]\neval_every = 2\n')
    assert main(["--method", "l2rr", "--testbed", "default", "--seed", "1", "--steps", "4",
                 "--out", str(tmp_path / "run"), "--config", str(config)]) == 0
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert _real_summary_keys() | {"target_domain_accuracy_after"} <= set(summary)
    kinds = [json.loads(line)["kind"] for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert kinds.count("train") == 4 and kinds.count("eval") == 3  # before, step 2, final


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
