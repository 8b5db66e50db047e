"""What a refused checkpoint raises, and the small helpers every checkpoint check shares.

Kept apart from protocol/validation.py so that the rule modules (config_rules, tokenizer_rules)
and the file checks can all raise the same error without importing each other.
"""

from __future__ import annotations

from typing import Any

from protocol import errors


class CheckpointValidationError(ValueError):
    """A checkpoint file was refused. `reason` is a protocol.errors reason constant."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message

    def to_protocol_error(self) -> errors.ProtocolError:
        """The INVALID_ARGUMENT status the owner sends back for this refusal."""
        return errors.invalid(self.reason, self.message)


def refuse(message: str, reason: str = errors.INVALID_CHECKPOINT) -> CheckpointValidationError:
    """The error for a refused checkpoint; raise it. `message` names the file and field."""
    return CheckpointValidationError(reason, message)


def shown(name: Any) -> str:
    """A file name, key or token, safe to put in a message (repr, truncated).

    Messages name what was refused, never echo file contents beyond such a short name.
    """
    if not isinstance(name, str):
        return f"a {type(name).__name__}"
    return repr(name[:80] + "..." if len(name) > 80 else name)


def is_int(value: Any) -> bool:
    """A JSON integer (bool is an int subclass in Python, but not a JSON number)."""
    return isinstance(value, int) and not isinstance(value, bool)


def key_path(value: Any, key: str) -> str | None:
    """Where `key` occurs as a mapping key anywhere inside a parsed JSON value ('a.b[2].key'),
    or None. Iterative, so a deeply nested upload cannot exhaust the Python stack."""
    pending: list[tuple[str, Any]] = [("", value)]
    while pending:
        where, item = pending.pop()
        if isinstance(item, dict):
            if key in item:
                return f"{where}.{key}" if where else key
            pending.extend((f"{where}.{name}" if where else str(name), child) for name, child in item.items())
        elif isinstance(item, list):
            pending.extend((f"{where}[{index}]", child) for index, child in enumerate(item))
    return None
