"""Answer base rates of the target's test split: is a gain in the skill, or in guessing?

A tiny policy can raise target accuracy by answering the commonest answer more often (on the
default testbed, a count of 1). So a simulation also reports, from its own test split (only a
simulation holds it; nothing here reaches the owner or comes from it):
- `commonest_answer_accuracy`: the accuracy of always giving each target domain's commonest
  reference answer, scored by each row's verifier like a model's answer;
- the policy's accuracy on the test prompts whose answer is NOT their domain's commonest one
  (`uncommon`), before and after training, measured locally with the owner's scorer
  (trainer_node.evaluation.local_accuracy, greedy). A policy that only guesses the base rate
  scores 0 there; a gain there is a gain in the skill.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence
from typing import Any

import torch

from rlvr_core.tasks.example import Example


def commonest_answers(test: Sequence[Example]) -> dict[str, str]:
    """Each target domain's commonest reference answer (ties: the smallest as text), by domain."""
    answers: dict[str, Counter[str]] = defaultdict(Counter)
    for example in test:
        answers[example.domain][example.answer.strip()] += 1
    return {domain: min(counts, key=lambda a: (-counts[a], a)) for domain, counts in sorted(answers.items())}


def uncommon_examples(test: Sequence[Example]) -> tuple[Example, ...]:
    """The test prompts whose answer is not their domain's commonest answer."""
    commonest = commonest_answers(test)
    return tuple(e for e in test if e.answer.strip() != commonest[e.domain])


def base_rates(test: Sequence[Example]) -> dict[str, Any]:
    """{"commonest_answer_accuracy", "per_domain": {domain: {answer, accuracy, n}}, "n", "uncommon_n"}."""
    from rlvr_core.verifiers import score_example

    commonest = commonest_answers(test)
    per_domain: dict[str, dict[str, Any]] = {}
    scores: list[float] = []
    for domain, answer in commonest.items():
        rows = [e for e in test if e.domain == domain]
        domain_scores = [float(score_example(f" {answer}", e)) for e in rows]
        scores += domain_scores
        per_domain[domain] = {"answer": answer, "accuracy": sum(domain_scores) / len(rows), "n": len(rows)}
    return {"commonest_answer_accuracy": sum(scores) / len(scores) if scores else float("nan"),
            "per_domain": per_domain, "n": len(scores), "uncommon_n": len(uncommon_examples(test))}


def uncommon_accuracy(engine: Any, test: Sequence[Example], template: str, max_new_tokens: int) -> float:
    """Greedy accuracy of the engine's current model on the uncommon-answer test prompts. Run
    under a forked torch RNG: measuring must not change the training run it sits in."""
    from trainer_node.evaluation import local_accuracy

    rows = uncommon_examples(test)
    if not rows:
        return float("nan")
    with torch.random.fork_rng(devices=[]):
        return float(local_accuracy(engine, rows, template, max_new_tokens)["accuracy"])
