"""Judging what was received: canaries in bytes, and the error contract of AIP-193."""

from __future__ import annotations

import grpc

from protocol import errors
from protocol.conformance.recorder import Failure, Received

_I = grpc.StatusCode.INVALID_ARGUMENT
# The status code each reason of protocol/errors.py belongs with (see the comments there).
REASON_CODES: dict[str, tuple[grpc.StatusCode, ...]] = {
    errors.INVALID_REQUEST: (_I,),
    errors.INVALID_CHECKPOINT: (_I,),
    errors.DISALLOWED_FILE: (_I,),
    errors.CHECKSUM_MISMATCH: (_I,),
    errors.UPLOAD_TOO_LARGE: (_I,),
    errors.UNKNOWN_CHECKPOINT: (_I,),
    errors.MISSING_FILE_DATA: (_I,),
    errors.DECODING_OUT_OF_LIMITS: (_I,),
    errors.TEST_SPLIT_DISABLED: (_I,),
    errors.RELEASE_KIND_NOT_SERVED: (_I,),
    errors.CLIENT_NOT_AUTHENTICATED: (grpc.StatusCode.UNAUTHENTICATED,),
    errors.CLIENT_NOT_ALLOWED: (grpc.StatusCode.PERMISSION_DENIED,),
    errors.PRIVACY_BUDGET_EXHAUSTED: (grpc.StatusCode.RESOURCE_EXHAUSTED,),
    errors.CLIENT_BUDGET_EXHAUSTED: (grpc.StatusCode.RESOURCE_EXHAUSTED,),
    errors.STORAGE_QUOTA_EXCEEDED: (grpc.StatusCode.RESOURCE_EXHAUSTED,),
    errors.SHUTTING_DOWN: (grpc.StatusCode.UNAVAILABLE,),
    errors.EVALUATION_FAILED: (grpc.StatusCode.INTERNAL, grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED),
}
# Codes a client library produces by itself (no server reply): no ErrorInfo can be expected.
CLIENT_SIDE_CODES = frozenset({grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED, grpc.StatusCode.UNAVAILABLE})


def protocol_reasons() -> set[str]:
    """Every reason constant declared in protocol/errors.py."""
    return {
        value for name, value in vars(errors).items()
        if name.isupper() and isinstance(value, str) and value == name and name != "ERROR_DOMAIN"
    }


def canary_hits(canaries: list[str], received: list[Received]) -> list[str]:
    """'<canary> in <where>' for every canary found (exact or case-insensitive) in any bytes."""
    needles = [(c, c.encode("utf-8"), c.lower().encode("utf-8")) for c in canaries]
    hits = []
    for item in received:
        lowered = item.data.lower()
        for canary, exact, lower in needles:
            if exact in item.data or lower in lowered:
                hits.append(f"{canary!r} in {item.where}")
    return hits


def error_contract_problems(failures: list[Failure]) -> list[str]:
    """Failures that break the error contract: no ErrorInfo, an unknown reason or domain,
    a reason under the wrong status code, or rich status that disagrees with the call."""
    known = protocol_reasons()
    problems = []
    for f in failures:
        name = f.method.rsplit("/", 1)[-1]
        label = f"{name} {f.code.name}"
        if f.reason is None:
            if f.code not in CLIENT_SIDE_CODES:
                problems.append(f"{label} carries no google.rpc.ErrorInfo (message: {f.message[:80]!r})")
            continue
        if f.reason not in known:
            problems.append(f"{label} has reason {f.reason!r}, not one of protocol/errors.py")
        elif f.code not in REASON_CODES.get(f.reason, (f.code,)):
            problems.append(f"{label} with reason {f.reason}: that reason belongs with "
                            f"{'/'.join(c.name for c in REASON_CODES[f.reason])}")
        if f.domain != errors.ERROR_DOMAIN:
            problems.append(f"{label} {f.reason}: ErrorInfo.domain is {f.domain!r}, expected {errors.ERROR_DOMAIN!r}")
        if f.error_info_count != 1:
            problems.append(f"{label}: {f.error_info_count} ErrorInfo details, expected exactly one")
        if not f.status_matches_call:
            problems.append(f"{label}: the google.rpc.Status trailer disagrees with the call's code or message")
    return problems
