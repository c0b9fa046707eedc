"""The tooling's heavy libraries stay where a command needs them: importing any of its
modules (as the tests do) takes no scikit-learn nor the corpus extra's packages."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("sklearn", "django", "sphinx", "babel", "faker", "xllamacpp")


def test_importing_the_tooling_takes_no_heavy_library() -> None:
    names = sorted(
        f"tools.detector.{p.stem}" for p in (ROOT / "tools" / "detector").glob("[!_]*.py")
    )
    assert "tools.detector.train" in names
    code = (
        "import importlib, sys\n"
        f"for name in {names!r}:\n"
        "    importlib.import_module(name)\n"
        f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "[]"
