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
ACCURACY = "accuracy"
DIFFERENCE = "difference"
MAX_TEMPERATURE = 10.0
REQUEST_ID = re.compile(r"^[A-Za-z0-9._:\-]{1,128}$")


@dataclass(frozen=True)
class ReleaseSpec:
    """What a feedback release measures: accuracy (metric "") or clipped differences from the base."""

    kind: str = ACCURACY  # ACCURACY or DIFFERENCE
    metric: str = ""  # DIFFERENCE: a registered difference metric the node serves
    clip: float = 0.0  # DIFFERENCE: the public per-row bound

    @property
    def is_difference(self) -> bool:
        return self.kind == DIFFERENCE

    def released(self, checkpoints: int) -> int:
        """How many values a release of `checkpoints` checkpoints holds (a difference release's base has none)."""
        return checkpoints - 1 if self.is_difference else checkpoints

    def to_json(self) -> dict[str, object]:
        return {"kind": self.kind, "metric": self.metric, "clip": self.clip} if self.is_difference else {"kind": self.kind}

    @classmethod
    def from_json(cls, data: object) -> ReleaseSpec:
        """Parse a ledger entry's `release` (absent in entries from before release kinds: accuracy). Strict."""
        if data is None:
            return cls()
        if not isinstance(data, dict) or data.get("kind") not in (ACCURACY, DIFFERENCE):
            raise ValueError("release must be an object with kind 'accuracy' or 'difference'")
        if data["kind"] == ACCURACY:
            if set(data) != {"kind"}:
                raise ValueError("an accuracy release has no metric or clip")
            return cls()
        metric, clip = data.get("metric"), data.get("clip")
        if set(data) != {"kind", "metric", "clip"} or not isinstance(metric, str) or not metric:
            raise ValueError("a difference release needs exactly kind, metric and clip")
        if isinstance(clip, bool) or not isinstance(clip, int | float) or not (math.isfinite(clip) and clip > 0):
            raise ValueError("release.clip must be a positive number")
        return cls(DIFFERENCE, metric, float(clip))


ACCURACY_RELEASE = ReleaseSpec()


@dataclass(frozen=True)
class EvaluateInputs:
    checkpoint_ids: tuple[str, ...]
    decoding: Decoding
    split: str  # FEEDBACK or TEST
    request_id: str  # "" when the client sent none (no idempotency)
    release: ReleaseSpec = ACCURACY_RELEASE

    def fingerprint(self) -> str:
        """What a reused request_id must match to be treated as a retry."""
        body = {
            "checkpoint_ids": list(self.checkpoint_ids),
            "decoding": self.decoding.to_json(),
            "split": self.split,
        }
        if self.release.is_difference:  # absent for accuracy: fingerprints from before release kinds still match
            body["release"] = self.release.to_json()
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
    release = parse_release(request, limits, split, len(ids), decoding)
    return EvaluateInputs(ids, decoding, split, request.request_id, release)


def parse_release(
    request: pb.EvaluateRequest, limits: EvaluationConfig, split: str, checkpoints: int, decoding: Decoding
) -> ReleaseSpec:
    """The request's release kind, checked against what this node serves (public facts only)."""
    has_difference = request.HasField("difference")
    if request.kind in (pb.RELEASE_KIND_UNSPECIFIED, pb.RELEASE_KIND_ACCURACY):
        if has_difference:
            raise invalid(errors.INVALID_REQUEST, "difference: only a RELEASE_KIND_ACCURACY_DIFFERENCE request "
                          "carries difference settings; set kind or leave difference unset")
        return ACCURACY_RELEASE
    if request.kind != pb.RELEASE_KIND_ACCURACY_DIFFERENCE:
        raise invalid(errors.INVALID_REQUEST, f"kind: unknown release kind {request.kind}")
    served = limits.difference_metrics
    if not served:
        raise invalid(errors.RELEASE_KIND_NOT_SERVED, "kind: this node does not serve difference releases "
                      "(GetInfo.release_kinds); ask for RELEASE_KIND_ACCURACY")
    if split != FEEDBACK:
        raise invalid(errors.INVALID_REQUEST, "kind: difference releases are for the feedback split only; the "
                      "test split releases accuracy")
    if checkpoints < 2:
        raise invalid(errors.INVALID_REQUEST, "checkpoint_ids: a difference release needs the base first and at "
                      "least one candidate after it")
    if not has_difference:
        raise invalid(errors.INVALID_REQUEST, "difference: required with RELEASE_KIND_ACCURACY_DIFFERENCE "
                      "(metric and clip)")
    metric, clip = request.difference.metric, request.difference.clip
    if metric not in served:
        raise invalid(errors.RELEASE_KIND_NOT_SERVED, f"difference.metric: this node serves {', '.join(served)}; "
                      f"got {metric!r}", served=",".join(served))
    if not (math.isfinite(clip) and 0 < clip <= limits.max_difference_clip):
        raise invalid(errors.DECODING_OUT_OF_LIMITS, f"difference.clip: must be in (0, {limits.max_difference_clip:g}]"
                      f"; got {clip}", limit=repr(limits.max_difference_clip))
    from rlvr_core.differences import difference_metric, scoring_temperature

    try:
        scoring_temperature(difference_metric(metric), decoding)
    except ValueError as error:
        raise invalid(errors.DECODING_OUT_OF_LIMITS, f"{error}; set decoding.temperature (e.g. 1.0)") from None
    if not difference_metric(metric).generates and decoding.samples_per_prompt != 1:
        raise invalid(errors.DECODING_OUT_OF_LIMITS, f"decoding.samples_per_prompt: metric {metric!r} scores the "
                      "reference answer, not samples; set it to 1 (or leave it unset)")
    return ReleaseSpec(DIFFERENCE, metric, float(clip))
