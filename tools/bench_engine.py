"""Build the default tiny policy on a testbed and report build time, size, accuracy and throughput.

    python tools/bench_engine.py                       # default testbed, default spec
    python tools/bench_engine.py --sft-steps 300 --threads 1 --cache-root /tmp/tiny

Accuracy is greedy exact match (first line of the completion, stripped) on the testbed's
target test split (held out from training) and on each source cluster (seen in SFT). The
throughput line times TransformersEngine on 256 prompts x 8 samples x 10 new tokens.
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

from rlvr_core.engines.base import SamplingParams
from rlvr_core.engines.throughput import measure_throughput
from rlvr_core.engines.transformers_engine import TransformersEngine
from rlvr_core.models import TinyPolicySpec, build_tiny_policy, load_policy
from rlvr_core.models.tiny_policy import cache_key
from rlvr_core.tasks.prompting import render_prompt
from rlvr_core.tasks.testbed import build_testbed_data, cluster_of, load_testbed


def greedy_accuracy(engine: TransformersEngine, examples, template: str) -> float:
    prompts = [render_prompt(e.prompt, template) for e in examples]
    generations = engine.generate(prompts, 1, SamplingParams(max_new_tokens=12, temperature=0.0))
    hits = [group[0].text.split("\n")[0].strip() == e.answer.strip() for group, e in zip(generations, examples)]
    return sum(hits) / max(1, len(hits))


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
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

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
