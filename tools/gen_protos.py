"""Regenerate the Python stubs in protocol/generated/ from proto/.

    python tools/gen_protos.py          # rewrite the stubs
    python tools/gen_protos.py --check  # exit 1 when the committed stubs are stale

The stubs are committed so that users need no protoc; tests/protocol/test_stubs_fresh.py
runs --check so a .proto edit without regeneration fails CI.
"""

from __future__ import annotations

import argparse
import filecmp
import re
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTO_ROOT = ROOT / "proto"
OUT_ROOT = ROOT / "protocol" / "generated"
PACKAGE_PREFIX = "protocol.generated"


def _generate(out_dir: Path) -> list[Path]:
    import grpc_tools
    from grpc_tools import protoc

    protos = sorted(PROTO_ROOT.rglob("*.proto"))
    include = Path(grpc_tools.__file__).parent / "_proto"
    args = [
        "protoc",
        f"-I{PROTO_ROOT}",
        f"-I{include}",
        f"--python_out={out_dir}",
        f"--pyi_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        *[str(p) for p in protos],
    ]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed")
    generated = sorted(p for p in out_dir.rglob("*") if p.suffix in {".py", ".pyi"})
    for path in generated:
        text = path.read_text()
        # protoc writes imports relative to the proto root; make them package-absolute.
        text = re.sub(r"^from (target_feedback\.)", rf"from {PACKAGE_PREFIX}.\1", text, flags=re.MULTILINE)
        path.write_text(text)
    for folder in {p.parent for p in generated} | {out_dir}:
        while folder != out_dir.parent:
            (folder / "__init__.py").touch()
            folder = folder.parent
    return generated


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="fail if committed stubs differ")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        fresh = Path(tmp) / "generated"
        fresh.mkdir()
        _generate(fresh)
        if args.check:
            stale = [
                str(p.relative_to(fresh))
                for p in fresh.rglob("*.py*")
                if not (OUT_ROOT / p.relative_to(fresh)).exists()
                or not filecmp.cmp(p, OUT_ROOT / p.relative_to(fresh), shallow=False)
            ]
            if stale:
                print("stale generated stubs: " + ", ".join(stale) + "\nrun: python tools/gen_protos.py")
                return 1
            print("generated stubs are up to date")
            return 0
        if OUT_ROOT.exists():
            shutil.rmtree(OUT_ROOT)
        shutil.copytree(fresh, OUT_ROOT)
        print(f"wrote stubs to {OUT_ROOT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
