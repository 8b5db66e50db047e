"""The house's import rules, checked over the import graph of the source files, and in a process
where the owner and the lab cannot be imported.

- target_owner_node never imports trainer_node or lab;
- trainer_node never imports target_owner_node or lab, except the one lazy entry to the lab's
  commands in trainer_node/cli.py (listed below);
- protocol and rlvr_core import neither node nor the lab;
- flower_shim (the owner-side Flower ClientApp) imports neither node, the lab nor rlvr_core.
Module-level and function-level imports both count, and so do importlib.import_module("...")
calls with a literal name.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NODES_AND_LAB = {"trainer_node", "target_owner_node", "lab"}
FORBIDDEN = {
    "target_owner_node": {"trainer_node", "lab"},
    "trainer_node": {"target_owner_node", "lab"},
    "protocol": NODES_AND_LAB,
    "rlvr_core": NODES_AND_LAB,
    # the Flower shim runs at an owner as trainer-submitted code: the public client only (flower_shim/__init__.py)
    "flower_shim": NODES_AND_LAB | {"rlvr_core"},
}
# (file, imported package): the only exceptions. trainer_node/cli.py loads the lab's `simulate`
# and `bench` lazily, inside a function, and only when one of them runs.
ALLOWED = {("trainer_node/cli.py", "lab")}


def imported_packages(source: str) -> list[tuple[str, int, bool]]:
    """(top-level package, line, at module level?) for every absolute import in `source`."""
    tree = ast.parse(source)
    found: list[tuple[str, int, bool]] = []
    module_level = {id(node) for node in tree.body}
    module_level |= {id(child) for node in tree.body if isinstance(node, (ast.If, ast.Try))
                     for child in ast.walk(node)}

    def add(name: str, node: ast.AST) -> None:
        found.append((name.split(".")[0], node.lineno, id(node) in module_level))

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name, node)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            add(node.module, node)
        elif isinstance(node, ast.Call) and _called_name(node.func) in ("import_module", "__import__") and node.args:
            literal = _literal_prefix(node.args[0])
            if literal:
                add(literal, node)
    return found


def _called_name(func: ast.AST) -> str:
    return func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")


def _literal_prefix(arg: ast.AST) -> str:
    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
        return arg.value
    if isinstance(arg, ast.JoinedStr) and arg.values and isinstance(arg.values[0], ast.Constant):
        return str(arg.values[0].value)
    return ""


def violations() -> list[str]:
    found = []
    for package, forbidden in FORBIDDEN.items():
        for path in sorted((ROOT / package).rglob("*.py")):
            relative = path.relative_to(ROOT).as_posix()
            for imported, line, _ in imported_packages(path.read_text(encoding="utf-8")):
                if imported in forbidden and (relative, imported) not in ALLOWED:
                    found.append(f"{relative}:{line} imports {imported}")
    return found


def test_no_party_imports_the_other_party_or_the_lab():
    assert violations() == []


def test_the_one_allowed_import_is_lazy_and_still_there():
    source = (ROOT / "trainer_node/cli.py").read_text(encoding="utf-8")
    lab_imports = [(line, top) for name, line, top in imported_packages(source) if name == "lab"]
    assert lab_imports, "trainer_node/cli.py no longer loads the lab: drop it from ALLOWED"
    assert not any(top for _, top in lab_imports), f"trainer_node/cli.py imports the lab at module level: {lab_imports}"


def test_the_scanner_sees_every_form_of_import():
    source = textwrap.dedent("""
        import lab.simulate
        from target_owner_node import scaffold
        from . import sibling
        try:
            import trainer_node.cli as cli
        except ImportError:
            pass

        def later():
            from lab.bench import spec
            import importlib
            importlib.import_module("target_owner_node.cli")
            importlib.import_module(f"trainer_node.policies.{name}")
    """)
    found = {(name, top) for name, _, top in imported_packages(source)}
    assert found == {("lab", True), ("target_owner_node", True), ("trainer_node", True), ("lab", False),
                     ("importlib", False), ("target_owner_node", False), ("trainer_node", False)}


STANDALONE_SCRIPT = """
import importlib, pkgutil, sys
from tests.import_blocker import BlockPackages
BlockPackages("target_owner_node", "lab").install()

import trainer_node
modules = sorted(m.name for m in pkgutil.walk_packages(trainer_node.__path__, "trainer_node."))
for name in modules:
    importlib.import_module(name)
leaked = sorted(m for m in sys.modules if m.split(".")[0] in ("target_owner_node", "lab"))
assert not leaked, leaked
print("imported", len(modules), "trainer_node modules")

from trainer_node.cli import main
assert main(["train", "--config", sys.argv[1], "--no-progress"]) == 0
assert main(["simulate", "--steps", "1"]) == 2
"""


def test_the_trainer_imports_and_trains_without_the_owner_and_the_lab(tmp_path):
    """The trainer image's situation: neither `target_owner_node` nor `lab` can be imported."""
    from tests.trainer_node.grpo_helpers import make_model_dir
    from tests.trainer_node.test_cli import MINI_TESTBED

    (tmp_path / "mini.toml").write_text(MINI_TESTBED)
    config = tmp_path / "train.toml"
    config.write_text(textwrap.dedent(f"""
        [model]
        path = "{make_model_dir(tmp_path)}"
        [data]
        testbed = "{tmp_path / 'mini.toml'}"
        eval_size = 4
        [policy]
        batch_size = 2
        rollouts_per_prompt = 2
        [rollout]
        max_new_tokens = 4
        [run]
        steps = 2
        out_dir = "{tmp_path / 'run'}"
    """))
    result = subprocess.run(
        [sys.executable, "-c", STANDALONE_SCRIPT, str(config)], capture_output=True, text=True, timeout=300, check=False,
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "imported" in result.stdout
    assert (tmp_path / "run" / "summary.json").is_file() and (tmp_path / "run" / "checkpoints").is_dir()
    # the lab's commands say what is missing and how to get it
    assert "part of the lab" in result.stderr and "pip install -e ." in result.stderr


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_every_ruled_package_has_sources(package):
    assert list((ROOT / package).rglob("*.py")), package
