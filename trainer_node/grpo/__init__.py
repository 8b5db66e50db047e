"""GRPO core: advantage estimators and policy losses (both registered by name), the typed
training batch, the trainer loop and checkpoint/resume."""
