"""The trainer's side of the target-feedback protocol: a resilient gRPC client, budget
pacing, and the FeedbackContext that data policies (L2RR) use to query the owner."""
