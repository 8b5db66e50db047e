"""Build the default tiny policy on a testbed and report build time, size, accuracy and throughput.

    python tools/bench_engine.py                       # default testbed, default spec
    python tools/bench_engine.py --sft-steps 300 --threads 1 --cache-root /tmp/tiny
    python tools/bench_engine.py --shape-cost          # dynamic vs fixed shapes (random policy)

Accuracy is greedy exact match (first line of the completion, stripped) on the testbed's
target test split (held out from training) and on each source cluster (seen in SFT). The
throughput line times TransformersEngine on 256 prompts x 8 samples x 10 new tokens.

--shape-cost skips the build: it times, side by side on a random-init tiny policy
(random_tiny_policy; --shape-size picks its size) and the testbed's feedback prompts,
(a) today's dynamic batching and (b) the owner's fixed shapes (FixedShape with
prompt_tokens 64 and 128, batch_prompts = batch_size // samples), and prints prompts/s and
the ratio to dynamic. Modes are interleaved and the best of --repeats runs is kept, which
damps the noise of a shared machine. A random policy seldom emits EOS, so early stopping
saves little here: the ratio measures padding, dummy rows and full-length decoding.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict
from dataclasses import replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rlvr_core.engines.base import FixedShape, SamplingParams
from rlvr_core.engines.throughput import measure_throughput
from rlvr_core.engines.transformers_engine import TransformersEngine
from rlvr_core.models import TinyPolicySpec, build_tiny_policy, load_policy
from rlvr_core.models.tiny_policy import cache_key, random_tiny_policy
from rlvr_core.tasks.prompting import render_prompt
from rlvr_core.tasks.testbed import build_testbed_data, cluster_of, load_testbed


def greedy_accuracy(engine: TransformersEngine, examples, template: str) -> float:
    prompts = [render_prompt(e.prompt, template) for e in examples]
    generations = engine.generate(prompts, 1, SamplingParams(max_new_tokens=12, temperature=0.0))
    hits = [group[0].text.split("\n")[0].strip() == e.answer.strip() for group, e in zip(generations, examples)]
    return sum(hits) / max(1, len(hits))


# Random-init policy sizes for --shape-cost: "small" is random_tiny_policy's own default,
# "default" is TinyPolicySpec's shape (what simulate and the bench train), without warm-up.
SHAPE_COST_SIZES = {
    "small": {},
    "default": {"vocab_size": 1024, "hidden_size": 128, "num_layers": 4, "num_heads": 4, "num_kv_heads": 2,
                "intermediate_size": 512},
}
SHAPE_COST_PROMPT_TOKENS = (64, 128)


def shape_cost(args: argparse.Namespace) -> dict:
    """prompts/s of dynamic batching and of fixed shapes, side by side, best of args.repeats."""
    import tempfile

    testbed = load_testbed(args.testbed)
    data = build_testbed_data(testbed)
    prompts = [render_prompt(e.prompt, testbed.prompt_template) for e in (data.feedback * 4)[: args.bench_prompts]]
    texts = [e.prompt for e in data.source] + [e.answer for e in data.source]
    max_new = args.bench_tokens
    with tempfile.TemporaryDirectory() as tmp:
        path = random_tiny_policy(Path(tmp) / "model", texts, seed=0,
                                  max_position=max(SHAPE_COST_PROMPT_TOKENS) + max_new,
                                  **SHAPE_COST_SIZES[args.shape_size])
        model, tokenizer = load_policy(path)
    engine = TransformersEngine(model, tokenizer, batch_size=args.batch_size, num_threads=args.threads or 1)
    batch_prompts = max(1, args.batch_size // args.bench_samples)
    modes = {"dynamic": None}
    modes.update({f"fixed_{n}": FixedShape(prompt_tokens=n, batch_prompts=batch_prompts)
                  for n in SHAPE_COST_PROMPT_TOKENS})
    params = SamplingParams(max_new_tokens=max_new, temperature=1.0, seed=0)
    best: dict[str, float] = {}
    for _ in range(args.repeats):
        for mode, shape in modes.items():
            report = measure_throughput(engine, prompts, args.bench_samples, params, shape=shape)
            best[mode] = max(best.get(mode, 0.0), report.prompts_per_s)
    lengths = [len(tokenizer(p, add_special_tokens=False)["input_ids"]) for p in prompts]
    return {
        "policy": f"random_tiny_policy ({args.shape_size}), {sum(p.numel() for p in model.parameters())} parameters",
        "prompts": len(prompts),
        "samples_per_prompt": args.bench_samples,
        "max_new_tokens": max_new,
        "prompt_tokens_mean_max": (round(sum(lengths) / len(lengths), 1), max(lengths)),
        "dynamic_batch_size_sequences": args.batch_size,
        "fixed_batch_prompts": batch_prompts,
        "torch_threads": args.threads or 1,
        "repeats_best_of": args.repeats,
        "prompts_per_s": {mode: round(value, 2) for mode, value in best.items()},
        "ratio_to_dynamic": {mode: round(value / best["dynamic"], 3) for mode, value in best.items()},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--testbed", default="default")
    parser.add_argument("--cache-root", type=Path, default=Path(".cache/tiny_policies"))
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch default)")
    parser.add_argument("--sft-steps", type=int)
    parser.add_argument("--sft-lr", type=float)
    parser.add_argument("--sft-batch-size", type=int)
    parser.add_argument("--seed", type=int)
    parser.add_argument("--bench-prompts", type=int, default=256)
    parser.add_argument("--bench-samples", type=int, default=8)
    parser.add_argument("--bench-tokens", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--shape-cost", action="store_true", help="compare dynamic and fixed shapes; no build")
    parser.add_argument("--shape-size", choices=sorted(SHAPE_COST_SIZES), default="small")
    parser.add_argument("--repeats", type=int, default=3, help="--shape-cost: best of this many runs")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.shape_cost:
        print(json.dumps(shape_cost(args), indent=2))
        return

    spec_overrides = {
        name: value
        for name, value in (("sft_steps", args.sft_steps), ("sft_lr", args.sft_lr), ("sft_batch_size", args.sft_batch_size),
                            ("seed", args.seed))
        if value is not None
    }
    spec = replace(TinyPolicySpec(), **spec_overrides)
    testbed = load_testbed(args.testbed)
    data = build_testbed_data(testbed)
    template = testbed.prompt_template
    texts = [e.prompt for e in data.source] + [e.answer for e in data.source]
    pairs = [(render_prompt(e.prompt, template), " " + e.answer) for e in data.source]

    started = time.perf_counter()
    path = build_tiny_policy(spec, texts, pairs, args.cache_root)
    build_seconds = time.perf_counter() - started
    record_path = args.cache_root / f"{path.name}.build.json"
    record = json.loads(record_path.read_text()) if record_path.exists() else {}

    model, tokenizer = load_policy(path)
    engine = TransformersEngine(model, tokenizer, batch_size=args.batch_size)
    by_cluster = defaultdict(list)
    for example in data.source:
        by_cluster[cluster_of(example)].append(example)
    report = {
        "model_dir": str(path),
        "cache_key": cache_key(spec, texts, pairs)[:32],
        "build_seconds_this_call": round(build_seconds, 1),
        "build_seconds_recorded": record.get("build_seconds"),
        "build_cpu_seconds_recorded": record.get("build_cpu_seconds"),
        "num_parameters": sum(p.numel() for p in model.parameters()),
        "vocab_size": len(tokenizer),
        "sft_loss_first_last": (record.get("sft_loss_first"), record.get("sft_loss_last")),
        "torch_threads": torch.get_num_threads(),
        "target_test_greedy_accuracy": round(greedy_accuracy(engine, data.test, template), 3),
        "source_greedy_accuracy": {
            cluster: round(greedy_accuracy(engine, examples[:100], template), 3)
            for cluster, examples in sorted(by_cluster.items())
        },
    }
    prompts = [render_prompt(e.prompt, template) for e in (data.source * 2)[: args.bench_prompts]]
    throughput = measure_throughput(
        engine, prompts, args.bench_samples, SamplingParams(max_new_tokens=args.bench_tokens, temperature=1.0, seed=0)
    )
    report["throughput"] = throughput.to_json()
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
