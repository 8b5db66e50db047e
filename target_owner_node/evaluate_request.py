"""Validation of an EvaluateRequest against the owner's limits (before anything is spent)."""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Callable
from dataclasses import dataclass

from protocol import errors
from protocol.errors import invalid
from protocol.generated.target_feedback.v1 import target_feedback_pb2 as pb
from rlvr_core.engines.row_seeds import MAX_SEED
from rlvr_core.scoring import Decoding
from target_owner_node.config import EvaluationConfig

FEEDBACK = "feedback"
TEST = "test"
MAX_TEMPERATURE = 10.0
REQUEST_ID = re.compile(r"^[A-Za-z0-9._:\-]{1,128}$")


@dataclass(frozen=True)
class EvaluateInputs:
    checkpoint_ids: tuple[str, ...]
    decoding: Decoding
    split: str  # FEEDBACK or TEST
    request_id: str  # "" when the client sent none (no idempotency)

    def fingerprint(self) -> str:
        """What a reused request_id must match to be treated as a retry."""
        body = {
            "checkpoint_ids": list(self.checkpoint_ids),
            "decoding": self.decoding.to_json(),
            "split": self.split,
        }
        return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def parse_evaluate_request(
    request: pb.EvaluateRequest,
    limits: EvaluationConfig,
    test_split_enabled: bool,
    checkpoint_exists: Callable[[str], bool],
    checkpoint_positions: Callable[[str], int] | None = None,
) -> EvaluateInputs:
    """Check ids, decoding and split; raises ProtocolError (INVALID_ARGUMENT) naming the field.

    Everything that could make the evaluation fail for a reason knowable now is refused here,
    before anything is charged: a refusal depends only on the request and public facts of the
    checkpoints, never on which held-out rows a subsample would draw. `checkpoint_positions`
    gives a stored checkpoint's context length (from its public config.json).

    Unset decoding fields take defaults: max_new_tokens = the owner's cap, samples_per_prompt = 1.
    """
    ids = tuple(request.checkpoint_ids)
    if not ids:
        raise invalid(errors.INVALID_REQUEST, "checkpoint_ids: give at least one checkpoint id")
    if len(ids) > limits.max_candidates_per_query:
        raise invalid(
            errors.DECODING_OUT_OF_LIMITS,
            f"checkpoint_ids: at most {limits.max_candidates_per_query} checkpoints per query; got {len(ids)}",
            limit=str(limits.max_candidates_per_query),
        )
    if len(set(ids)) != len(ids):
        raise invalid(errors.INVALID_REQUEST, "checkpoint_ids: each checkpoint may appear only once")
    for position, checkpoint_id in enumerate(ids):
        if not checkpoint_exists(checkpoint_id):
            raise invalid(
                errors.UNKNOWN_CHECKPOINT,
                f"checkpoint_ids[{position}]: unknown checkpoint; upload it first (UploadCheckpoint)",
                index=str(position),
            )

    d = request.decoding
    max_new_tokens = d.max_new_tokens or limits.max_new_tokens
    samples = d.samples_per_prompt or 1
    if not 1 <= max_new_tokens <= limits.max_new_tokens:
        raise invalid(
            errors.DECODING_OUT_OF_LIMITS,
            f"decoding.max_new_tokens: must be in [1, {limits.max_new_tokens}]; got {d.max_new_tokens}",
            limit=str(limits.max_new_tokens),
        )
    if not 1 <= samples <= limits.max_samples_per_prompt:
        raise invalid(
            errors.DECODING_OUT_OF_LIMITS,
            f"decoding.samples_per_prompt: must be in [1, {limits.max_samples_per_prompt}]; got {d.samples_per_prompt}",
            limit=str(limits.max_samples_per_prompt),
        )
    if not (math.isfinite(d.temperature) and 0 <= d.temperature <= MAX_TEMPERATURE):
        raise invalid(
            errors.DECODING_OUT_OF_LIMITS,
            f"decoding.temperature: must be in [0, {MAX_TEMPERATURE:g}] (0 = greedy); got {d.temperature}",
        )

    if request.split in (pb.SPLIT_UNSPECIFIED, pb.SPLIT_FEEDBACK):
        split = FEEDBACK
    elif request.split == pb.SPLIT_TEST:
        if not test_split_enabled:
            raise invalid(errors.TEST_SPLIT_DISABLED, "split: this node does not serve a test split")
        split = TEST
    else:
        raise invalid(errors.INVALID_REQUEST, f"split: unknown value {request.split}")

    if not 0 <= d.seed < MAX_SEED:
        raise invalid(
            errors.DECODING_OUT_OF_LIMITS,
            f"decoding.seed: must be in [0, 2**63); got {d.seed}",
            limit=str(MAX_SEED - 1),
        )
    if checkpoint_positions is not None:
        for position, checkpoint_id in enumerate(ids):
            context = checkpoint_positions(checkpoint_id)
            if context <= max_new_tokens:
                raise invalid(
                    errors.DECODING_OUT_OF_LIMITS,
                    f"decoding.max_new_tokens: checkpoint_ids[{position}] has a context of {context} positions, "
                    f"which leaves no room for a prompt after {max_new_tokens} new tokens; ask for fewer",
                    index=str(position),
                )

    if request.request_id and not REQUEST_ID.match(request.request_id):
        raise invalid(
            errors.INVALID_REQUEST, "request_id: 1-128 characters from A-Z a-z 0-9 . _ : - (a UUID works)"
        )
    decoding = Decoding(max_new_tokens, samples, float(d.temperature), int(d.seed))
    return EvaluateInputs(ids, decoding, split, request.request_id)
