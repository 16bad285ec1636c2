#!/usr/bin/env python3
"""Regenerates the committed gRPC stubs in src/echomq/v1/ from ../../proto.

The stubs are committed so that `pip install` needs neither protoc nor the
repository's proto/ directory. tests/test_stubs_fresh.py runs this with
`--check`, which generates into a temporary directory and fails on any
difference, so committed stubs can never go stale.

Uses the protoc bundled in grpcio-tools (pinned in pyproject.toml's `test`
extra: its version is stamped into the output). That version is chosen on
purpose, not the newest: the generated modules refuse a protobuf runtime older
than their gencode and a grpcio older than their generator, so the generator's
version is the package's floor (see the dependencies in pyproject.toml).

    python scripts/generate_stubs.py           # rewrite src/echomq/v1/*_pb2*.py[i]
    python scripts/generate_stubs.py --check   # exit 1 and show a diff when stale
"""

from __future__ import annotations

import argparse
import difflib
import os
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent
PROTO_ROOT = (HERE / ".." / ".." / "proto").resolve()
PACKAGE_DIR = HERE / "src" / "echomq" / "v1"
# Generated files are named after these suffixes; anything else in v1/ is hand-written.
GENERATED_SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py")


def generate(out_root: Path) -> list[Path]:
    """Runs protoc into `out_root`; returns the generated files under echomq/v1/."""
    from grpc_tools import protoc  # imported late: only the dev extra has it

    protos = sorted(PROTO_ROOT.glob("echomq/v1/*.proto"))
    if not protos:
        raise SystemExit(f"no .proto files under {PROTO_ROOT}/echomq/v1")
    include = Path(protoc.__file__).parent / "_proto"  # google/protobuf/*.proto
    args = [
        "grpc_tools.protoc",
        f"-I{PROTO_ROOT}",
        f"-I{include}",
        f"--python_out={out_root}",
        f"--pyi_out={out_root}",
        f"--grpc_python_out={out_root}",
        # Relative paths, so the output does not depend on where the checkout lives.
        *[str(p.relative_to(PROTO_ROOT)) for p in protos],
    ]
    cwd = os.getcwd()
    os.chdir(PROTO_ROOT)
    try:
        if protoc.main(args) != 0:
            raise SystemExit("protoc failed")
    finally:
        os.chdir(cwd)
    return sorted(p for p in (out_root / "echomq" / "v1").iterdir() if p.name.endswith(GENERATED_SUFFIXES))


def committed() -> dict[str, str]:
    return {
        p.name: p.read_text()
        for p in PACKAGE_DIR.iterdir()
        if p.is_file() and p.name.endswith(GENERATED_SUFFIXES)
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail on a difference instead of writing")
    options = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        fresh = {p.name: p.read_text() for p in generate(Path(tmp))}
    if options.check:
        old = committed()
        if old == fresh:
            return 0
        for name in sorted(set(old) | set(fresh)):
            diff = difflib.unified_diff(
                old.get(name, "").splitlines(keepends=True),
                fresh.get(name, "").splitlines(keepends=True),
                f"committed/{name}",
                f"regenerated/{name}",
            )
            sys.stdout.writelines(diff)
        print("\nstubs are stale: run `python scripts/generate_stubs.py` and commit the result", file=sys.stderr)
        return 1
    for name in committed():
        if name not in fresh:
            (PACKAGE_DIR / name).unlink()
    for name, text in fresh.items():
        (PACKAGE_DIR / name).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
