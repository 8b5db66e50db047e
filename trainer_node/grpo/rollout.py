"""Rollout and reward: turn RolloutRequests into scored Groups.

Requests are grouped by their rollout count n (adaptive policies give prompts different n),
and each (step, round, n) gets its own generation seed derived from the run seed, so a run
is reproducible and a resumed run generates exactly what the uninterrupted one would.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence

import numpy as np

from rlvr_core.engines.base import GenerationEngine, SamplingParams
from rlvr_core.tasks.example import Example
from rlvr_core.verifiers.draws import DrawKey
from trainer_node.policies.base import Group, Rollout, RolloutRequest, SourcePool

RenderFn = Callable[[Example], str]
RewardFn = Callable[[str, Example], float]
GraderFn = Callable[[str, Example, DrawKey, int], tuple[float, ...]]
"""(completion, example, key, draws) -> `draws` grader scores (rlvr_core/verifiers/graders.py)."""


def generation_seed(run_seed: int, step: int, round_index: int, n: int) -> int:
    """A 31-bit seed unique to (run seed, step, generation round, n)."""
    sequence = np.random.SeedSequence([run_seed & 0xFFFFFFFF, step, round_index, n])
    return int(sequence.generate_state(1, dtype=np.uint32)[0] & 0x7FFFFFFF)


def overlong_penalty(length: int, max_new_tokens: int, buffer: int, factor: float) -> float:
    """DAPO soft overlong punishment: 0 up to max_len - buffer, then linear down to -factor."""
    if buffer <= 0:
        return 0.0
    expected = max_new_tokens - buffer
    return min(-(length - expected) / buffer * factor, 0.0)


def rollout_groups(
    requests: Sequence[RolloutRequest],
    *,
    pool: SourcePool,
    engine: GenerationEngine,
    render: RenderFn,
    reward_fn: RewardFn,
    params: SamplingParams,
    run_seed: int,
    step: int,
    round_index: int,
    overlong_buffer: int = 0,
    overlong_penalty_factor: float = 1.0,
    grader: GraderFn | None = None,
    draws: int = 1,
) -> list[Group]:
    """Generate request.num_rollouts completions per request and score each one.

    With a `grader`, each rollout gets `draws` grader scores keyed by (generation seed, row key
    of the example id, sample index) and its reward is draw 0 (plus shaping); `reward_fn` is
    then unused. Returns one Group per request, in request order.
    """
    by_n: dict[int, list[int]] = defaultdict(list)  # n -> positions in `requests`
    for position, request in enumerate(requests):
        if not 0 <= request.index < len(pool):
            raise ValueError(f"rollout request index {request.index} is outside the source pool")
        if request.num_rollouts < 1:
            raise ValueError(f"rollout request for prompt {request.index} asks for {request.num_rollouts} rollouts")
        by_n[request.num_rollouts].append(position)

    groups: list[Group | None] = [None] * len(requests)
    for n in sorted(by_n):
        positions = by_n[n]
        examples = [pool.examples[requests[p].index] for p in positions]
        seeded = SamplingParams(
            max_new_tokens=params.max_new_tokens,
            temperature=params.temperature,
            top_p=params.top_p,
            seed=generation_seed(run_seed, step, round_index, n),
        )
        outputs = engine.generate([render(e) for e in examples], n, seeded)
        for position, example, generations in zip(positions, examples, outputs):
            rollouts = []
            for sample, gen in enumerate(generations):
                shaping = overlong_penalty(
                    len(gen.completion_ids), params.max_new_tokens, overlong_buffer, overlong_penalty_factor
                )
                scores: tuple[float, ...] = ()
                if grader is not None:
                    scores = tuple(grader(gen.text, example, DrawKey.of(seeded.seed, example.id, sample), draws))
                base = scores[0] if scores else float(reward_fn(gen.text, example))
                rollouts.append(
                    Rollout(
                        text=gen.text,
                        reward=float(base) + shaping,
                        prompt_ids=tuple(gen.prompt_ids),
                        completion_ids=tuple(gen.completion_ids),
                        scores=scores,
                    )
                )
            index = requests[position].index
            groups[position] = Group(index=index, cluster=pool.clusters[index], rollouts=rollouts)
    return [g for g in groups if g is not None]
