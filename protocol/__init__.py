"""What both parties must agree on: the wire protocol (generated stubs), error reasons,
input validation, the DP mechanism and its accounting, TLS helpers and the conformance suite."""

PROTOCOL_VERSION = "target_feedback.v1"
