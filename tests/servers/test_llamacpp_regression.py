"""A real regression in a real engine: llama.cpp's quantized-copy bug (issues 12253 and 12354,
fixed by PR 12310), in the xllamacpp 0.1.11 wheel (b4933) and not in 0.1.12 (b5036).

With 2 slots, a q8_0 KV cache and flash attention, llama.cpp defragments its cache as the
sessions' cells are freed and refilled; the buggy CPU copy writes 32 times the bytes of each
move. With small slots (2048 tokens each) that runs off the cache and the server dies: the
smallest settings that show the bug. Both wheels come from the package registry (27 MB each,
installed once into the harness's cache); the model is the tests' SmolLM2-135M.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness.errors import UsageError
from harness.servers.llamacpp import default_model

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_the_old_build_dies_under_the_load_and_the_fixed_one_does_not(tmp_path: Path) -> None:
    try:
        default_model()
    except UsageError as exc:
        pytest.skip(str(exc))
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "harness.cli.main", "run",
           "--target", str(ROOT / "scenarios" / "targets" / "llamacpp_versions.toml"),
           "--scenario", str(ROOT / "scenarios" / "kv_churn.toml"),
           "--ab", "llamacpp=0.1.11,0.1.12", "--target-var", "ctx=2048",
           "--max-context", "1800", "--sessions", "8", "--out", str(out)]  # fmt: skip
    env = {**os.environ, "HARNESS_CACHE_DIR": os.environ.get("HARNESS_CACHE_DIR")
           or str(Path.home() / ".cache" / "harness")}  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=1500, env=env, check=False)
    assert done.returncode == 3, done.stderr[-3000:]  # a server died: exit 3
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert "the server process died during the run (killed by SIG" in result["error"]
    deaths = {d["variant"]: d for d in json.loads((out / "summary.json").read_text())
              .get("server_deaths", [])}  # fmt: skip
    assert set(deaths) == {"llamacpp=0.1.11"}
    death = deaths["llamacpp=0.1.11"]
    assert death["signal"] in ("SIGSEGV", "SIGFPE", "SIGBUS", "SIGABRT")
    assert death["turns_done"] >= 1
    assert "its server was killed by SIG" in done.stderr
    assert "**Server crash:** llamacpp=0.1.11" in (out / "report.md").read_text()
    fixed = result["variants"]["llamacpp=0.1.12"]
    assert fixed["sessions"] == 8
    assert fixed["corrupted_sessions"] == 0, (out / "report.md").read_text()[-4000:]
    assert fixed["transport_errors"] == 0
