"""The committed stubs in src/echomq/v1 match what ../../proto generates today."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent


def test_generated_stubs_are_fresh() -> None:
    result = subprocess.run(
        [sys.executable, str(HERE / "scripts" / "generate_stubs.py"), "--check"],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, f"{result.stderr}\n{result.stdout[-4000:]}"
