"""Importing this package registers every conformance check (one module per area)."""

from protocol.conformance.checks import (  # noqa: F401
    budget,
    deltas,
    differences,
    evaluate,
    fuzz,
    info,
    leaks,
    liveness,
    mtls,
    noise,
    shape,
    tokenizer_cost,
    uploads,
)
