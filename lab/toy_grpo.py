"""A toy GRPO workload for benchmarks and tests: twelve "add i and i+1" prompts in two clusters, a
smooth reward (the share of digits in a completion, so groups rarely tie), their rendering and the
sampling and GRPO settings the CPU benchmarks time (tools/bench_tapped_update.py,
tools/bench_owner_beside.py). It stands apart from tests/ so that a benchmark never depends on
test helpers; the GRPO core tests use it too (tests/trainer_node/grpo_helpers.py)."""

from __future__ import annotations

from typing import Any

from rlvr_core.engines.base import SamplingParams
from rlvr_core.tasks.example import Example
from trainer_node.grpo.settings import GRPOSettings
from trainer_node.policies.base import SourcePool

TOY_EXAMPLES = tuple(
    Example(id=f"toy-{i}", prompt=f"add {i} and {i + 1}", answer=str(2 * i + 1), domain="even" if i % 2 else "odd")
    for i in range(12)
)
VOCAB_TEXTS = [e.prompt for e in TOY_EXAMPLES] + [e.answer for e in TOY_EXAMPLES] + ["0123456789 Answer:"]
SAMPLING = SamplingParams(max_new_tokens=6, temperature=1.0, top_p=1.0, seed=7)  # rollouts; seed = run seed


def toy_pool() -> SourcePool:
    return SourcePool(examples=TOY_EXAMPLES, clusters=tuple(e.domain for e in TOY_EXAMPLES))


def toy_reward(text: str, example: Example) -> float:
    """Share of completion characters that are digits: smooth, so groups rarely tie."""
    return sum(ch.isdigit() for ch in text) / max(len(text), 1)


def render(example: Example) -> str:
    return f"{example.prompt}\nAnswer:"


def make_settings(**overrides: Any) -> GRPOSettings:
    """GRPO settings with the toy workload's learning rate (1e-2), any field overridden."""
    return GRPOSettings(**{"lr": 1e-2, **overrides})
