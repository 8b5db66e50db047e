"""CPU benchmark (not a test): uniform GRPO on a testbed with the tiny policy, scored by
greedy accuracy on the testbed's TARGET TEST split before and after training.

    python tools/bench_grpo_cpu.py                      # packaged defaults, `default` testbed
    python tools/bench_grpo_cpu.py --steps 40 --set grpo.lr=1e-4 --set policy.batch_size=16
    python tools/bench_grpo_cpu.py --set model.tiny_spec.sft_steps=2400   # a stronger warm-up

The tiny policy is built (and cached under model.cache_dir) from the source split: tokenizer
texts = source prompts + answers, SFT pairs = rendered source prompt -> " answer". Training
never sees target data; the test split is only read here, by the lab's LocalTestEvaluation,
to report the effect. Writes <out>/bench.json next to the usual run outputs (metrics.jsonl,
plots). Thin glue: the run loop is the trainer's (trainer_node/loop.py), the evaluation
the lab's (lab/evaluation.py); with an owner process, `trainer-node simulate --method uniform`
measures the same thing through the owner.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lab.evaluation import LocalTestEvaluation, domain_accuracy
from trainer_node.config import load_config
from trainer_node.loop import Schedule, run_loop
from trainer_node.run_output import RunOutput
from trainer_node.training import build_training

DEFAULT_CONFIG = Path(__file__).resolve().parents[1] / "trainer_node" / "configs" / "train_default.toml"


class TimedEvaluation:
    """An EvaluationHook that records how long each evaluation took."""

    def __init__(self, inner: LocalTestEvaluation):
        self.inner = inner
        self.seconds: list[float] = []

    def evaluate(self, label: str) -> dict:
        started = time.perf_counter()
        record = self.inner.evaluate(label)
        self.seconds.append(time.perf_counter() - started)
        return record


def parse_value(text: str):
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return {"true": True, "false": False}.get(text.lower(), text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", type=Path, default=DEFAULT_CONFIG)
    parser.add_argument("--steps", type=int, help="override run.steps")
    parser.add_argument("--out", type=Path, default=Path("runs/bench_grpo_cpu"))
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="dotted config override, e.g. grpo.lr=1e-4 (repeatable)")
    parser.add_argument("--eval-every", type=int, default=0, help="also score the test split every k steps")
    parser.add_argument("--threads", type=int, help="torch intra-op threads (1 is far faster on a busy machine)")
    args = parser.parse_args(argv)
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)

    overrides = {"run.steps": args.steps, "run.out_dir": str(args.out), "data.eval_size": 0}
    for item in args.set:
        key, _, value = item.partition("=")
        overrides[key] = parse_value(value)
    config = load_config(args.config, overrides)
    config.save_resolved(args.out)

    started = time.perf_counter()
    setup = build_training(config)
    build_seconds = time.perf_counter() - started
    trainer, test = setup.trainer, setup.data.test
    output = RunOutput(args.out, config.run.steps, progress=True)
    evaluation = TimedEvaluation(LocalTestEvaluation(setup, seed=0))
    loop_started = time.perf_counter()
    result = run_loop(trainer, output, Schedule(steps=config.run.steps, eval_every=args.eval_every), evaluation)
    # GRPO time as before: the loop without the initial and final scoring (periodic ones count).
    train_seconds = time.perf_counter() - loop_started - evaluation.seconds[0] - evaluation.seconds[-1]
    before, after = result.initial, result.final
    report = {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "testbed": config.data.testbed,
        "test_examples": len(test),
        "source_examples": len(setup.pool),
        "steps": config.run.steps,
        "rollouts": trainer.rollouts_cumulative,
        "test_accuracy_before": before["accuracy"],
        "test_accuracy_after": after["accuracy"],
        "delta_points": 100 * (after["accuracy"] - before["accuracy"]),
        "per_domain_before": domain_accuracy(before),
        "per_domain_after": domain_accuracy(after),
        "setup_seconds": round(build_seconds, 1),
        "train_seconds": round(train_seconds, 1),
        "total_seconds": round(time.perf_counter() - started, 1),
        "config": config.to_json(),
    }
    output.close(extra={k: v for k, v in report.items() if not isinstance(v, dict)})
    (args.out / "bench.json").write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps({k: v for k, v in report.items() if k != "config"}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
