"""The package as published: built with `python -m build`, installed from the
wheel into a fresh venv outside the repository beside google-cloud-pubsub,
and used against the real sidecar under protobuf 7, 6 and the declared
floors (scripts/check_package.py says how). Needs PyPI, or pip's cache."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from support import Sidecar

HERE = Path(__file__).resolve().parent.parent


def test_the_built_wheel_installs_beside_google_cloud_pubsub_and_works(live_sidecar: Sidecar) -> None:
    result = subprocess.run(
        [sys.executable, str(HERE / "scripts" / "check_package.py"), "--target", live_sidecar.target],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, f"{result.stdout[-6000:]}\n{result.stderr[-6000:]}"
    assert result.stdout.count("smoke ok") == 3, result.stdout
    print(result.stdout)
