"""The one config edge of both nodes: typed sections, TOML loading, error messages, paths.

The trainer (trainer_node/config.py) and the target owner (target_owner_node/config.py) each
describe their TOML file as a tree of `Section`s and load it with `load_toml` + `validate`.
What that buys both of them, the same way:

- every section is frozen and forbids unknown keys: a typo fails at load, never later;
- every field is documented with `Field(description=...)`, so a `--help`/docs generator can
  read them (`Model.model_fields[name].description`);
- one error formatter: each line names the field (`policy.lambda_waste: ...`) and says the
  fix, for unknown keys, missing keys, bad types and out-of-range values alike;
- `ConfigPath` fields resolve a relative path against the folder of the config file, so a
  config folder (certificates, data) can be moved as a whole;
- `validate_options` types the options of a pluggable part (a data policy, an engine) with
  the pydantic model its registry entry carries, naming an unknown option with the valid ones.

This module imports pydantic only (both nodes import it at start-up; keep it light).
"""

from __future__ import annotations

import difflib
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, TypeVar, get_args

from pydantic import AfterValidator, BaseModel, ConfigDict, ValidationError, ValidationInfo
from pydantic_core import InitErrorDetails, PydanticCustomError

ModelT = TypeVar("ModelT", bound=BaseModel)

# Error types whose message already says what is wrong with the value (ours), or that have no
# value to show; every other pydantic error gets "; got <value>" appended.
_NO_INPUT_SHOWN = {"missing", "extra_forbidden", "unexpected_keyword_argument", "value_error",
                   "assertion_error", "unknown_option", "unknown_entry", "moved_table"}


class ConfigError(ValueError):
    """A config file that cannot be used. The message lists each bad field and its fix."""


class Section(BaseModel):
    """A config section: frozen (validated once, never changed) and closed (unknown keys are errors)."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class OptionsSection(Section):
    """The options of a pluggable part. Strict types: a TOML `true` is never a number and "3" is
    never an int (ints are still widened to float)."""

    model_config = ConfigDict(strict=True)


# --- paths ------------------------------------------------------------------------------------

def config_dir(info: ValidationInfo) -> Path | None:
    """The folder of the config file being validated (None for a config built from a dict)."""
    base = (info.context or {}).get("base_dir")
    return Path(base) if base is not None else None


def resolve_config_path(value: Path | None, info: ValidationInfo) -> Path | None:
    """`~` expanded; a relative path joined to the config file's folder (unchanged without one)."""
    if value is None:
        return None
    value = Path(value).expanduser()
    base = config_dir(info)
    if not value.is_absolute() and base is not None:
        value = base / value
    return value


ConfigPath = Annotated[Path, AfterValidator(resolve_config_path)]
"""A path in a config file: relative paths are relative to the file's folder."""


# --- errors -----------------------------------------------------------------------------------

def field_path(loc: tuple[Any, ...]) -> str:
    """('methods', 1, 'policy') -> 'methods[1].policy'."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def format_errors(error: ValidationError, source: str, *, reference: str) -> str:
    """One line per problem, each naming the field and the fix.

    `reference` says where the valid keys are listed (a default config file, a command that
    writes one), for unknown keys.
    """
    lines = [f"invalid config {source}:"]
    for item in error.errors():
        kind = item["type"]
        message = item["msg"].removeprefix("Value error, ").removeprefix("Assertion failed, ")
        if kind in ("extra_forbidden", "unexpected_keyword_argument"):  # a model's / a dataclass's
            message = f"unknown setting; remove it or check its spelling and section (see {reference})"
        elif kind == "missing":
            message = "required; add it to the config"
        elif kind not in _NO_INPUT_SHOWN and not isinstance(item.get("input"), (dict, list)):
            message = f"{message}; got {item.get('input')!r}"
        where = field_path(item["loc"])
        # Whole-config checks have no location; their message starts with the fields it concerns.
        lines.append(f"  {where}: {message}" if where else f"  {message}")
    return "\n".join(lines)


def field_error(
    title: str, loc: tuple[str | int, ...], kind: str, message: str, value: Any
) -> ValidationError:
    """A ValidationError for one field, raised from a validator that picks a model by name;
    pydantic nests its location under the field being validated."""
    detail = InitErrorDetails(type=PydanticCustomError(kind, message), loc=loc, input=value)
    return ValidationError.from_exception_data(title, [detail])


def validate_options(model: type[ModelT], raw: Any, *, part: str) -> ModelT:
    """Validate the options of one pluggable part (`part`, e.g. "data policy 'l2rr'") with its
    registered model. An unknown option is named with the closest valid one and the full list;
    every other error passes through with its own location."""
    if isinstance(raw, model):
        return raw
    try:
        return model.model_validate(raw)
    except ValidationError as error:
        valid = sorted(key for key in model.model_fields if key != "name")  # `name` picked the model
        details: list[InitErrorDetails] = []
        for item in error.errors():
            if item["type"] == "extra_forbidden":
                key = str(item["loc"][-1])
                close = difflib.get_close_matches(key, valid, n=1)
                hint = f"did you mean {close[0]!r}? " if close else ""
                message = f"not an option of {part}; {hint}valid options: {', '.join(valid)}"
                details.append(InitErrorDetails(type=PydanticCustomError("unknown_option", message),
                                                loc=item["loc"], input=item["input"]))
            else:
                detail = InitErrorDetails(type=item["type"], loc=item["loc"], input=item["input"])
                if "ctx" in item:
                    detail["ctx"] = item["ctx"]
                details.append(detail)
        raise ValidationError.from_exception_data(model.__name__, details) from None


# --- loading ----------------------------------------------------------------------------------

def load_toml(path: Path | str, *, missing_hint: str = "") -> dict[str, Any]:
    """Read a TOML file; a missing file or bad TOML is a ConfigError naming the file."""
    path = Path(path)
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {path}{missing_hint}") from None
    except IsADirectoryError:
        raise ConfigError(f"config file {path} is a directory; pass the .toml file inside it") from None
    except tomllib.TOMLDecodeError as error:
        raise ConfigError(f"config file {path} is not valid TOML: {error}") from None
    except UnicodeDecodeError as error:
        raise ConfigError(f"config file {path} is not UTF-8 text: {error}") from None


def validate(
    model: type[ModelT], raw: Mapping[str, Any], *, source: str, reference: str, base_dir: Path | None = None
) -> ModelT:
    """Validate a decoded config; relative `ConfigPath`s resolve against `base_dir` (the config
    file's folder). Raises ConfigError listing every bad field."""
    try:
        return model.model_validate(raw, context={"base_dir": base_dir})
    except ValidationError as error:
        raise ConfigError(format_errors(error, source, reference=reference)) from None


def default_of(model: type[BaseModel], name: str) -> Any:
    """The default of one field, e.g. default_of(PrivacyConfig, "epsilon_budget"): commands and
    scaffolds read defaults from the config model, so each default has one definition."""
    return model.model_fields[name].get_default(call_default_factory=True)


def undocumented_fields(model: type, prefix: str = "") -> list[str]:
    """Fields of `model` (a pydantic model or dataclass) and of its nested sections that have no
    description: every field is documented one way, `Field(description=...)`, for docs generators."""
    missing: list[str] = []
    for name, info in _fields(model).items():
        if not (info.description or "").strip():
            missing.append(f"{prefix}{name}")
        for nested in _section_types(info.annotation):
            missing += undocumented_fields(nested, f"{prefix}{name}.")
    return missing


def _fields(model: type) -> dict[str, Any]:
    return getattr(model, "__pydantic_fields__", None) or {}


def _section_types(annotation: Any) -> list[type]:
    if isinstance(annotation, type) and _fields(annotation):
        return [annotation]
    return [t for arg in get_args(annotation) for t in _section_types(arg)]
