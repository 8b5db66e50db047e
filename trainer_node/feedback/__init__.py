"""The trainer's side of the target-feedback protocol: a resilient gRPC client (client.py), the
start checks that fail fast and say why (preflight.py), budget pacing, and the FeedbackContext
that data policies (L2RR) use to query the owner."""
