"""The generation-engine interface shared by trainer rollouts and owner evaluation."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass


@dataclass(frozen=True)
class SamplingParams:
    max_new_tokens: int = 16
    temperature: float = 1.0  # 0 means greedy
    top_p: float = 1.0
    seed: int = 0


@dataclass(frozen=True)
class Generation:
    text: str                    # decoded completion, special tokens stripped
    prompt_ids: tuple[int, ...]  # token ids of the rendered prompt
    completion_ids: tuple[int, ...]  # generated ids, including EOS when it was produced
    finished: bool               # True when EOS was produced before max_new_tokens


class GenerationEngine(ABC):
    """Generates completions. Implementations are registered by name in engines/registry.py."""

    name: str = ""

    @abstractmethod
    def generate(self, prompts: list[str], num_samples: int, params: SamplingParams) -> list[list[Generation]]:
        """Return, for each prompt, `num_samples` generations (shape: [len(prompts)][num_samples]).

        Results depend only on (weights, prompts, num_samples, params): the same seed gives the
        same generations, so candidates evaluated with one seed are paired.
        """

    def sync_weights(self) -> None:
        """Called by the trainer after each optimizer step (vLLM pushes weights here)."""
