"""The one registry shape: duplicates refused, unknown names listed, built-ins and plug-ins loaded lazily."""

from __future__ import annotations

import importlib.metadata

import pytest

from protocol.plugins import Registry, UnknownEntry, subclass_entries


def test_register_lookup_and_duplicates():
    registry: Registry = Registry("widgets")

    @registry.register("round", options=dict)
    class Round:
        pass

    assert registry.get("round") is Round and registry.options_model("round") is dict
    assert registry.names() == ["round"] and "round" in registry
    with pytest.raises(ValueError, match="already registered"):
        registry.add("round", object())
    with pytest.raises(UnknownEntry, match="unknown widgets 'square'; known: round"):
        registry.get("square")


def test_builtins_are_imported_once_on_first_use():
    calls = []
    registry: Registry = Registry("gadgets", builtins=lambda: calls.append(1) or registry.add("a", 1))
    assert calls == []
    assert registry.names() == ["a"] and registry.get("a") == 1
    assert calls == [1]


class _FakePoint:
    def __init__(self, name, value, loaded):
        self.name, self.value, self._loaded = name, value, loaded

    def load(self):
        if isinstance(self._loaded, Exception):
            raise self._loaded
        return self._loaded


def test_entry_point_plugins_register_under_their_entry_point_name(monkeypatch):
    class Plugin:
        Options = dict

    points = {"target_feedback.things": [_FakePoint("mine", "pkg.mod:Plugin", Plugin)]}
    monkeypatch.setattr(importlib.metadata, "entry_points", lambda group: points.get(group, []))
    registry: Registry = Registry("things")
    entry = registry.entry("mine")
    assert entry.value is Plugin and entry.options is dict and "pkg.mod:Plugin" in entry.source


def test_a_broken_plugin_names_itself(monkeypatch):
    points = {"target_feedback.broken": [_FakePoint("bad", "pkg.bad:X", RuntimeError("boom"))]}
    monkeypatch.setattr(importlib.metadata, "entry_points", lambda group: points.get(group, []))
    with pytest.raises(ImportError, match="plug-in 'bad' .*pkg.bad:X.*RuntimeError: boom"):
        Registry("broken").names()


def test_noun_names_one_entry_in_messages_and_non_names_are_unknown():
    registry: Registry = Registry("sprockets", noun="sprocket")
    registry.add("a", 1)
    assert registry.entry_point_group == "target_feedback.sprockets"
    with pytest.raises(UnknownEntry, match="unknown sprocket 'b'; known: a"):
        registry.get("b")
    with pytest.raises(UnknownEntry, match="known: a"):
        registry.get(["a"])  # unhashable: still an unknown name, not a TypeError
    with pytest.raises(ValueError, match="sprocket 'a' is already registered"):
        registry.add("a", 2)


def test_on_add_refuses_foreign_values_and_stamps_names():
    class Base:
        name = ""

    registry: Registry = Registry("parts", noun="part", on_add=subclass_entries(Base, "part"))

    @registry.register("cog")
    class Cog(Base):
        pass

    assert Cog.name == "cog"
    with pytest.raises(TypeError, match="part 'dict': dict is not a subclass of Base"):
        registry.add("dict", dict)
    with pytest.raises(ValueError, match="declares name 'other' but is registered as 'gear'"):
        registry.add("gear", type("Gear", (Base,), {"name": "other"}))
    with pytest.raises(TypeError, match="must be a Base subclass"):
        registry.add("fn", lambda: Base())
    assert registry.names() == ["cog"]  # nothing refused was stored
    factories: Registry = Registry("makers", on_add=subclass_entries(Base, "maker", factories=True))
    factories.add("fn", lambda: Base())


def test_copy_isolates_throwaway_entries():
    registry: Registry = Registry("bolts", builtins=lambda: registry.add("m4", 4))
    twin = registry.copy()
    twin.add("m5", 5)
    assert twin.names() == ["m4", "m5"] and registry.names() == ["m4"]


def test_a_plugin_cannot_take_a_builtin_name(monkeypatch):
    class Builtin:
        pass

    class Impostor:
        pass

    points = {"target_feedback.nuts": [_FakePoint("hex", "evil.mod:Impostor", Impostor)]}
    monkeypatch.setattr(importlib.metadata, "entry_points", lambda group: points.get(group, []))
    registry: Registry = Registry("nuts", builtins=lambda: registry.add("hex", Builtin))
    with pytest.raises(ValueError, match="plug-in 'hex' .*evil.mod:Impostor.* already registered by builtin"):
        registry.names()


def test_a_plugin_module_that_registers_itself_is_not_a_duplicate(monkeypatch):
    registry: Registry = Registry("washers")

    class SelfRegistered:  # what `@registry.register("flat")` in the plug-in's module does on import
        pass

    def load():
        registry.add("flat", SelfRegistered, source="entry point pkg:SelfRegistered")
        return SelfRegistered

    point = _FakePoint("flat", "pkg:SelfRegistered", None)
    point.load = load
    monkeypatch.setattr(importlib.metadata, "entry_points", lambda group: [point])
    assert registry.get("flat") is SelfRegistered
