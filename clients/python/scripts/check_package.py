#!/usr/bin/env python3
"""Builds the package as it would be published and uses it from outside the
repository, beside google-cloud-pubsub.

1. `python -m build` (the sdist, then the wheel built from that sdist, so a
   file missing from the sdist breaks the wheel too) into a temporary
   directory outside the repository; checks both carry what a user needs
   (py.typed, the stubs and their .pyi, LICENSE, README).
2. A fresh virtualenv there (never the development one), with the wheel and
   google-cloud-pubsub installed together by pip's resolver.
3. In that venv, from a directory outside the repository: imports both, and
   appends and reads an entry through the given sidecar (blocking and
   asyncio APIs), with any warning from importing echomq an error.
4. The same smoke after moving the venv to protobuf 6 (still pubsub's
   range), and then to the declared floors, protobuf 5.27.2 and grpcio
   1.66.2 (pubsub then no longer fits, so it is not imported).

    python scripts/check_package.py --target 127.0.0.1:50051

pip's cache makes repeated runs quick; the venv itself is always new.
tests/test_packaging.py runs this against the test sidecar.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent
REPO = HERE.parent.parent
#: The floors pyproject.toml declares (the stub generator's versions).
PROTOBUF_FLOOR = "5.27.2"
GRPCIO_FLOOR = "1.66.2"

SMOKE = r'''
import asyncio, sys, uuid, warnings
target, with_pubsub = sys.argv[1], sys.argv[2] == "1"
with warnings.catch_warnings():
    warnings.simplefilter("error")  # e.g. protobuf's gencode/runtime version warning
    import echomq, echomq.sync
import grpc
from google.protobuf import __version__ as protobuf_version
assert "site-packages" in echomq.__file__, f"echomq imported from {echomq.__file__}, not the installed wheel"
if with_pubsub:
    from google.cloud import pubsub_v1
    pubsub_v1.types.PubsubMessage(data=b"x")  # pubsub's own generated messages work beside ours
stream = f"py:package:{uuid.uuid4().hex}"
with echomq.sync.Streams(target, timeout=10) as streams:
    appended = streams.append(stream, {"n": "1"})
    page = streams.read(stream)
assert [e.id for e in page.entries] == [appended.id] and page.entries[0].payload == {"n": b"1"}

async def main():
    async with echomq.Streams(target, timeout=10) as streams:
        more = await streams.append(stream, {"n": b"2"})
        every = [e.id async for e in streams.read_all(stream)]
    assert every == [appended.id, more.id], every

asyncio.run(main())
print(f"smoke ok: echomq {echomq.__version__}, protobuf {protobuf_version}, grpcio {grpc.__version__}"
      + (", beside google-cloud-pubsub" if with_pubsub else ""))
'''


def run(*command: str | Path, cwd: Path | None = None) -> str:
    began = time.monotonic()
    result = subprocess.run([str(c) for c in command], cwd=cwd, capture_output=True, text=True)
    took = time.monotonic() - began
    if result.returncode != 0:
        sys.stderr.write(result.stdout[-4000:] + result.stderr[-4000:])
        raise SystemExit(f"check_package: failed ({took:.1f} s): {' '.join(map(str, command))}")
    print(f"check_package: {took:5.1f} s  {' '.join(map(str, command))[:140]}", flush=True)
    return result.stdout


def check_artifacts(dist: Path) -> Path:
    [wheel] = dist.glob("echomq-*.whl")
    [sdist] = dist.glob("echomq-*.tar.gz")
    names = set(zipfile.ZipFile(wheel).namelist())
    for wanted in ("echomq/__init__.py", "echomq/py.typed", "echomq/v1/consumer_service_pb2.py",
                   "echomq/v1/consumer_service_pb2.pyi", "echomq/v1/admin_service_pb2_grpc.py"):
        assert wanted in names, f"{wheel.name} lacks {wanted}"
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names), f"{wheel.name} lacks its LICENSE"
    [metadata] = [n for n in names if n.endswith(".dist-info/METADATA")]
    text = zipfile.ZipFile(wheel).read(metadata).decode()
    for wanted in (f"Requires-Dist: protobuf<8,>={PROTOBUF_FLOOR}", f"Requires-Dist: grpcio<2,>={GRPCIO_FLOOR}",
                   "License-Expression: Apache-2.0", "Classifier: Typing :: Typed", "Project-URL: "):
        assert wanted in text, f"{wheel.name} METADATA lacks {wanted!r}"
    assert "Description-Content-Type: text/markdown" in text and "## Consumer" in text, "README not in METADATA"
    with tarfile.open(sdist) as archive:
        members = {m.split("/", 1)[1] for m in archive.getnames() if "/" in m}
    for wanted in ("LICENSE", "README.md", "pyproject.toml", "src/echomq/py.typed", "src/echomq/v1/types_pb2.py"):
        assert wanted in members, f"{sdist.name} lacks {wanted}"
    print(f"check_package: artifacts ok: {wheel.name}, {sdist.name}")
    return wheel


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", required=True, help="a running sidecar, host:port")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory")
    options = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="echomq-py-package-")).resolve()
    assert REPO not in work.parents, f"{work} is inside the repository"
    try:
        run(sys.executable, "-m", "build", "--outdir", work / "dist", HERE)
        wheel = check_artifacts(work / "dist")
        venv = work / "venv"
        run(sys.executable, "-m", "venv", venv)
        python = venv / "bin" / "python"
        pip = [python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
        project = work / "project"  # a directory of a fresh project, outside the repository
        project.mkdir()
        (project / "smoke.py").write_text(SMOKE)
        run(*pip, wheel, "google-cloud-pubsub", cwd=project)
        print(run(python, "smoke.py", options.target, "1", cwd=project).strip())
        run(*pip, "protobuf>=6.33.5,<7", cwd=project)
        print(run(python, "smoke.py", options.target, "1", cwd=project).strip())
        run(*pip, f"protobuf=={PROTOBUF_FLOOR}", f"grpcio=={GRPCIO_FLOOR}", cwd=project)
        print(run(python, "smoke.py", options.target, "0", cwd=project).strip())
    finally:
        if options.keep:
            print(f"check_package: kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
