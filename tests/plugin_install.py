"""Install the example verifier package (tests/rlvr_core/verifier_plugin) the way an organization
would, with pip, into a folder of its own; and make this process see it.

    site = install_verifier_plugin(tmp)          # pip install --target tmp/site (offline, no deps)
    with verifiers_from(site, monkeypatch): ...  # sys.path + a fresh entry-point lookup

Child processes (the owner's spawned evaluation worker, a `trainer-node` subprocess) see the
plug-in through sys.path (spawn passes it on) or PYTHONPATH (`plugin_env`).
"""

from __future__ import annotations

import contextlib
import importlib
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

PLUGIN_SOURCE = Path(__file__).resolve().parent / "rlvr_core" / "verifier_plugin"
PLUGIN_VERIFIERS = ("acme_fragile", "acme_last_number")
PLUGIN_PACKAGE = "acme_org_verifiers"


def install_verifier_plugin(root: Path) -> Path:
    """pip-install the example package into root/site (a copy is built, so the tree stays clean)."""
    source = root / "source"
    shutil.copytree(PLUGIN_SOURCE, source, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    site = root / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation", "--no-index",
         "--disable-pip-version-check", "--target", str(site), str(source)],
        check=True, capture_output=True, text=True, timeout=180,
    )
    return site


@contextlib.contextmanager
def verifiers_from(site: Path, monkeypatch) -> Iterator[None]:
    """This process looks the verifier entry points up again with `site` on sys.path (undone after)."""
    from rlvr_core.verifiers import base

    base.VERIFIERS.names()  # built-ins register on their module's first import: load them into the real registry
    monkeypatch.syspath_prepend(str(site))
    importlib.invalidate_caches()
    monkeypatch.setattr(base.VERIFIERS, "_entries", dict(base.VERIFIERS._entries))
    monkeypatch.setattr(base.VERIFIERS, "_loaded", False)
    monkeypatch.setattr(base, "_INSTANCES", {})
    try:
        yield
    finally:  # the package leaves with its folder: a later test may import a module of the same name
        for name in [m for m in sys.modules if m == PLUGIN_PACKAGE or m.startswith(PLUGIN_PACKAGE + ".")]:
            del sys.modules[name]


def plugin_env(site: Path, repo: Path) -> dict[str, str]:
    """The environment of a child process that should see the plug-in and this checkout's code."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(repo), str(site), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env
