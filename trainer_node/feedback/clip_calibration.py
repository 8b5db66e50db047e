"""The clip of a difference release, chosen from the trainer's own prompts (never from the owner's).

A difference release clips each held-out row's value to [-c, c] and adds noise of std z * c (per
value, divided by q N), so c trades bias (rows clipped) against noise. The trainer picks it per
query, from the very candidates it is about to send: it computes their per-row differences from
the live model on a fixed sample of its own source prompts, with the same metric, decoding and
rendering the owner will use (rlvr_core/differences.py, the code the owner runs), and takes a
quantile of their absolute values. Nothing of the owner's data is read, so c is public, and the
owner only checks it against its max_clip.

Where it runs: on the thread that builds the query's candidates (the background query thread
for asynchronous queries), on the trainer's private model copy, so the live model is untouched.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from rlvr_core.differences import difference_metric, release_differences
from rlvr_core.engines.sampling import row_key
from rlvr_core.scoring import Decoding
from trainer_node.feedback.release import ReleaseOptions


class ClipCalibration:
    """c for each query of one run: the options' quantile of |difference| on the trainer's own prompts."""

    def __init__(self, trainer: Any, options: ReleaseOptions, seed: int = 0):
        """`trainer` is the GRPOTrainer (its pool, rendering, tokenizer and private model copy)."""
        self.trainer = trainer
        self.options = options
        examples = list(trainer.pool.examples)
        order = np.random.default_rng(seed).permutation(len(examples))[: options.calibration_prompts]
        self.examples = [examples[i] for i in sorted(order.tolist())]
        self.row_keys = [row_key(e.id) for e in self.examples]
        self._engine = None
        self.last_clip = 0.0  # what the last query used (logged)

    def clip_for(self, base: dict, candidates: Sequence[dict], decoding: Decoding, max_clip: float) -> float | None:
        """The clip for a query of `candidates` against `base` (state dicts), at most `max_clip`;
        None when every candidate equals the base on every calibration prompt (nothing to release)."""
        values = np.abs(self.differences(base, candidates, decoding))
        if values.size == 0 or not np.any(values > 0):
            return None
        clip = float(np.quantile(values, self.options.clip_quantile))
        if clip <= 0:  # most rows do not move: bound the ones that do
            clip = float(values.max())
        self.last_clip = min(clip, max_clip) if max_clip > 0 else clip
        return self.last_clip

    def differences(self, base: dict, candidates: Sequence[dict], decoding: Decoding) -> np.ndarray:
        """(candidates, calibration prompts) unclipped differences on the trainer's private model copy."""
        scratch = self.trainer.scratch_model()
        engine = self._engine_for(scratch)

        def load(state: dict) -> Any:
            scratch.load_state_dict(state)
            return engine

        return release_differences(load, base, list(candidates), difference_metric(self.options.metric),
                                   self.examples, self.trainer.render, decoding, self.row_keys, clip=math.inf)

    def _engine_for(self, scratch: Any) -> Any:
        if self._engine is None or self._engine.model is not scratch:
            from rlvr_core.engines.registry import build_engine

            self._engine = build_engine("transformers", scratch, self.trainer.tokenizer, device=str(self.trainer.device))
        return self._engine
