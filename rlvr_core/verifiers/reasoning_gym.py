"""reasoning-gym's own scorer for the task an example came from.

reasoning-gym scores an answer against a dataset *entry* ({"question", "answer", "metadata"}).
The testbed builder stores the entry's metadata (made JSON-serialisable) under
example.metadata["rg"], so the entry is rebuilt here from the example alone:
    {"question": example.prompt, "answer": example.answer, "metadata": example.metadata["rg"]}
and scored with the scorer of the dataset named by example.task. Some scorers give partial
credit (e.g. spell_backward by matching prefix, chain_sum when the gold answer is a substring),
so scores are not only 0 or 1.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Any

from rlvr_core.tasks.example import Example
from rlvr_core.verifiers.base import VERIFIERS, Verifier, extract_answer

# Longer answers get 0: the tasks we use have short answers, and scorers do substring searches.
MAX_ANSWER_CHARS = 4096

_LOCK = threading.Lock()


@functools.cache
def _scorer(task: str) -> Callable[[str | None, dict[str, Any]], float]:
    """The score_answer of `task`'s dataset class, built once per task.

    reasoning_gym.get_score_answer_fn(task) instantiates the dataset with its default config
    (some read word lists), so it is cached. Scorers only read the entry, so the default
    config does not change the score.
    """
    import reasoning_gym

    with _LOCK:  # dataset construction is not guaranteed to be thread-safe
        return reasoning_gym.get_score_answer_fn(task)


def known_tasks() -> list[str]:
    """All dataset names in the installed reasoning-gym registry."""
    from reasoning_gym.factory import DATASETS

    return sorted(DATASETS)


@VERIFIERS.register("reasoning_gym")
class ReasoningGymVerifier(Verifier):
    """Scores with reasoning-gym's scorer for example.task (entry rebuilt from the example)."""

    info_kind = "VERIFIER_KIND_REASONING_GYM"

    def score(self, completion: str, example: Example) -> float:
        answer = extract_answer(completion)
        if not answer or len(answer) > MAX_ANSWER_CHARS:
            return 0.0
        entry = {
            "question": example.prompt,
            "answer": example.answer,
            "metadata": example.metadata.get("rg", {}),
        }
        return float(_scorer(example.task)(answer, entry))

    def check_example(self, example: Example) -> None:
        if example.task not in known_tasks():
            raise ValueError(
                "reasoning_gym: field 'task' is not a reasoning-gym dataset name "
                "(see reasoning_gym.factory.DATASETS)"
            )
        if not isinstance(example.metadata.get("rg", {}), dict):
            raise ValueError("reasoning_gym: metadata['rg'] must be an object (the entry's metadata)")
