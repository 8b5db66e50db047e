"""Make packages unimportable, as in an install that lacks them (the trainer image lacks the lab
and the owner). A meta-path finder placed first raises what a missing package raises."""

from __future__ import annotations

import sys


class BlockPackages:
    def __init__(self, *packages: str):
        self.packages = set(packages)

    def find_spec(self, name: str, path=None, target=None):
        """None lets the next finder look; a blocked name fails as a missing package does."""
        if name.split(".")[0] in self.packages:
            raise ModuleNotFoundError(f"No module named {name!r} (made unimportable by the test)", name=name)

    def install(self) -> BlockPackages:
        """Put the finder first; modules of these packages already imported are forgotten."""
        for module in [m for m in sys.modules if m.split(".")[0] in self.packages]:
            del sys.modules[module]
        sys.meta_path.insert(0, self)
        return self
