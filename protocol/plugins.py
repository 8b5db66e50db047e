"""The one shape of every pluggable part: a `Registry` of named entries.

Policies, engines, verifiers, accountants, advantage estimators, losses... each kind has one
Registry. The rules every registry follows (verl's registries, prime-rl's name -> class dicts):

- an entry is registered once, under one name, with `@REGISTRY.register("name")` (a class
  or a function); registering a name twice raises, since a silent override hides a bug;
- a lookup of an unknown name raises `UnknownEntry` listing the known names;
- an entry may carry a typed options model (pydantic), validated when a config loads;
- third-party plug-ins arrive through the Python entry-point group `target_feedback.<kind>`
  (pyproject: `[project.entry-points."target_feedback.verifiers"] mine = "pkg.module:Class"`),
  loaded the first time the registry is asked for names or an entry;
- code outside an entry never compares a registered name: entries expose capabilities as
  attributes instead (`uses_target_feedback`, `simulation_only`, ...).

protocol/ is the bottom of the house (both nodes and rlvr_core import it), so the helper
lives here and imports nothing of the project.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

T = TypeVar("T")
ENTRY_POINT_PREFIX = "target_feedback."


class UnknownEntry(ValueError):
    """A name no entry is registered under; the message lists the known names."""


@dataclass(frozen=True)
class Entry(Generic[T]):
    name: str
    value: T
    options: Any = None  # a pydantic model class for the entry's options, or None
    source: str = "builtin"  # "builtin" or the entry point that provided it


class Registry(Generic[T]):
    """Named entries of one kind. Thread-safe; built-ins register at import, plug-ins lazily."""

    def __init__(
        self,
        kind: str,
        builtins: Callable[[], None] | None = None,
        *,
        noun: str | None = None,
        on_add: Callable[[str, T], None] | None = None,
    ) -> None:
        """`kind` names the entry-point group (`target_feedback.<kind>`, plural: "verifiers");
        `noun` names one entry in messages ("unknown verifier 'x'"; default: `kind`);
        `builtins` imports the modules whose decorators register the in-tree entries (called once,
        on first use, so registries never import their entries at module import: no cycles);
        `on_add(name, value)` runs before an entry is stored, in-tree or plug-in alike: it raises
        TypeError/ValueError to refuse a value of the wrong kind, and may stamp the name on it."""
        self.kind = kind
        self.noun = noun or kind
        self._builtins = builtins
        self._on_add = on_add
        self._entries: dict[str, Entry[T]] = {}
        self._lock = threading.RLock()
        self._loaded = False

    @property
    def entry_point_group(self) -> str:
        return ENTRY_POINT_PREFIX + self.kind

    # -- registering -------------------------------------------------------------------------
    def register(self, name: str, *, options: Any = None, source: str = "builtin") -> Callable[[T], T]:
        """Decorator: `@REGISTRY.register("name", options=OptionsModel)` on a class or function."""

        def add(value: T) -> T:
            self.add(name, value, options=options, source=source)
            return value

        return add

    def add(self, name: str, value: T, *, options: Any = None, source: str = "builtin") -> None:
        if not isinstance(name, str) or not name:
            raise ValueError(f"{self.noun}: an entry needs a non-empty name")
        with self._lock:
            if name in self._entries:
                raise ValueError(
                    f"{self.noun} {name!r} is already registered (by {self._entries[name].source}); "
                    "choose another name"
                )
            if self._on_add is not None:
                self._on_add(name, value)
            self._entries[name] = Entry(name, value, options, source)

    def copy(self) -> Registry[T]:
        """A registry with the same entries, for tests: throwaway entries go into the copy, and
        the copy looks its entry-point group up again on first use (so a test can fake
        `importlib.metadata.entry_points` and see a plug-in arrive as in a fresh process)."""
        self._load()
        twin: Registry[T] = Registry(self.kind, noun=self.noun, on_add=self._on_add)
        twin._entries = dict(self._entries)
        return twin

    # -- looking up --------------------------------------------------------------------------
    def names(self) -> list[str]:
        self._load()
        return sorted(self._entries)

    def entry(self, name: str) -> Entry[T]:
        self._load()
        found = self._entries.get(name) if isinstance(name, str) else None
        if found is None:
            known = ", ".join(sorted(self._entries)) or "(none)"
            raise UnknownEntry(f"unknown {self.noun} {name!r}; known: {known}")
        return found

    def get(self, name: str) -> T:
        return self.entry(name).value

    def options_model(self, name: str) -> Any:
        return self.entry(name).options

    def __contains__(self, name: object) -> bool:
        self._load()
        return name in self._entries

    def __iter__(self) -> Iterator[Entry[T]]:
        self._load()
        return iter([self._entries[name] for name in sorted(self._entries)])

    # -- loading -----------------------------------------------------------------------------
    def _load(self) -> None:
        if self._loaded:
            return
        with self._lock:
            if self._loaded:
                return
            self._loaded = True  # set first: a builtin module may look names up while it registers
            if self._builtins is not None:
                self._builtins()
            self._load_entry_points()

    def _load_entry_points(self) -> None:
        from importlib.metadata import entry_points

        for point in entry_points(group=self.entry_point_group):
            try:
                value = point.load()
            except Exception as error:  # a broken plug-in must name itself
                raise ImportError(
                    f"{self.noun} plug-in {point.name!r} ({point.value}, group {self.entry_point_group}) "
                    f"failed to import: {type(error).__name__}: {error}"
                ) from error
            existing = self._entries.get(point.name)
            if existing is None:
                options = getattr(value, "Options", None)
                self.add(point.name, value, options=options, source=f"entry point {point.value}")
            elif existing.value is not value:  # the same object: its module registered it on import
                raise ValueError(
                    f"{self.noun} plug-in {point.name!r} ({point.value}) takes a name already registered "
                    f"by {existing.source}; rename the entry point"
                )


def subclass_entries(base: type, noun: str, *, factories: bool = False) -> Callable[[str, Any], None]:
    """An `on_add` for registries of classes: the value must subclass `base` (with `factories`,
    any callable returning one is accepted too), and a class gets its registered name stamped
    on `name`, so instances can say what they are (an accountant's state names it). A class that
    already declares a different `name` is refused: the registered name is the one name."""

    def check(name: str, value: Any) -> None:
        if isinstance(value, type):
            if not issubclass(value, base):
                raise TypeError(f"{noun} {name!r}: {value.__name__} is not a subclass of {base.__name__}")
            declared = value.__dict__.get("name", "")
            if declared and declared != name:
                raise ValueError(
                    f"{noun} class {value.__name__} declares name {declared!r} but is registered as {name!r}"
                )
            value.name = name
        elif not (factories and callable(value)):
            raise TypeError(f"{noun} {name!r} must be a {base.__name__} subclass, got {value!r}")

    return check


def callable_entries(noun: str) -> Callable[[str, Any], None]:
    """An `on_add` for registries of functions (advantage estimators, losses): refuses non-callables."""

    def check(name: str, value: Any) -> None:
        if not callable(value):
            raise TypeError(f"{noun} {name!r} must be a function, got {value!r}")

    return check
