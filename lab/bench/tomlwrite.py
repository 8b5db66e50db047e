"""A minimal TOML writer for run configs (tomllib only reads; tomli_w is not a dependency).

Handles what a simulate config holds: top-level tables (one level of sections) whose values
are strings, booleans, ints, floats, lists and inline tables. Round-trips through tomllib.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

_BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")


def _key(key: str) -> str:
    return key if _BARE_KEY.match(key) else json.dumps(key)


def _value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)  # JSON string escapes are valid TOML basic-string escapes
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{_key(str(k))} = {_value(v)}" for k, v in value.items()) + " }" if value else "{}"
    raise TypeError(f"cannot write {type(value).__name__} as TOML: {value!r}")


def toml_value(value: Any) -> str:
    """One TOML value: a string, boolean, number, list or inline table."""
    return _value(value)


def dumps(data: dict[str, Any]) -> str:
    """Top-level scalars first, then one [section] per top-level table.

    TOML has no null: a None value is left out, which for a config means "the default".
    """
    lines = [f"{_key(k)} = {_value(v)}" for k, v in data.items() if not isinstance(v, dict) and v is not None]
    for section, table in data.items():
        if isinstance(table, dict):
            lines += ["", f"[{_key(section)}]"]
            lines += [f"{_key(k)} = {_value(v)}" for k, v in table.items() if v is not None]
    return "\n".join(lines).lstrip("\n") + "\n"
