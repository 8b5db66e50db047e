"""Policy models shared by both parties: safe loading/saving and the project's tiny policy.

The names below load lazily (PEP 562), so importing a light submodule such as
`rlvr_core.models.tiny_spec` (a config type) does not import torch and transformers.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "UnsafeCheckpointError": "rlvr_core.models.loading",
    "check_model_dir": "rlvr_core.models.loading",
    "load_policy": "rlvr_core.models.loading",
    "load_tokenizer": "rlvr_core.models.loading",
    "save_policy": "rlvr_core.models.loading",
    "ModelFolder": "rlvr_core.models.model_folder",
    "check_uploadable": "rlvr_core.models.model_folder",
    "inspect_model_folder": "rlvr_core.models.model_folder",
    "load_model_folder": "rlvr_core.models.model_folder",
    "TinyPolicySpec": "rlvr_core.models.tiny_spec",
    "build_tiny_policy": "rlvr_core.models.tiny_policy",
    "random_tiny_policy": "rlvr_core.models.tiny_policy",
    "train_tokenizer": "rlvr_core.models.tokenizer",
}

__all__ = list(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'rlvr_core.models' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
