"""The trainer party: GRPO with a pluggable data policy (L2RR and baselines)."""
