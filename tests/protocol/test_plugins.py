"""The one registry shape: duplicates refused, unknown names listed, built-ins and plug-ins loaded lazily."""

from __future__ import annotations

import importlib.metadata

import pytest

from protocol.plugins import Registry, UnknownEntry


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
