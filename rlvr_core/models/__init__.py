"""Policy models shared by both parties: safe loading/saving and the project's tiny policy."""

from rlvr_core.models.loading import (
    UnsafeCheckpointError,
    check_model_dir,
    load_policy,
    load_tokenizer,
    save_policy,
)
from rlvr_core.models.tiny_policy import (
    TinyPolicySpec,
    build_tiny_policy,
    random_tiny_policy,
    train_tokenizer,
)

__all__ = [
    "TinyPolicySpec",
    "UnsafeCheckpointError",
    "build_tiny_policy",
    "check_model_dir",
    "load_policy",
    "load_tokenizer",
    "random_tiny_policy",
    "save_policy",
    "train_tokenizer",
]
