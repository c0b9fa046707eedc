"""A real regression in a real engine: llama.cpp's quantized-copy bug (issues 12253 and 12354,
fixed by PR 12310), in the xllamacpp 0.1.11 wheel (b4933) and not in 0.1.12 (b5036).

With 2 slots, a q8_0 KV cache and flash attention, llama.cpp defragments its cache as the
sessions' cells are freed and refilled; the buggy CPU copy writes 32 times the bytes of each
move, over other cells of the cache (corrupted answers) or past its end (the server dies):
which one a run meets turns on where the moves land. Corrupted answers come as text, or as
bytes that are no UTF-8, which the server cannot encode: it fails those streams, saying so,
and the harness counts them as corrupted turns (not transport failures). Both
wheels come from the package registry (27 MB each, installed once into the harness's cache);
the model is the tests' SmolLM2-135M; the target file and the scenario are the shipped ones,
with 12 sessions.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness.errors import UsageError
from harness.record.turns import read_turns
from harness.servers.llamacpp import default_model

ROOT = Path(__file__).resolve().parents[2]
SIGNALS = ("SIGSEGV", "SIGFPE", "SIGBUS", "SIGABRT")


@pytest.mark.slow
def test_the_old_build_corrupts_or_dies_and_the_fixed_one_is_clean(tmp_path: Path) -> None:
    try:
        default_model()
    except UsageError as exc:
        pytest.skip(str(exc))
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "harness.cli.main", "run",
           "--target", str(ROOT / "scenarios" / "targets" / "llamacpp_versions.toml"),
           "--scenario", str(ROOT / "scenarios" / "kv_churn.toml"),
           "--ab", "llamacpp=0.1.11,0.1.12", "--sessions", "12", "--out", str(out)]  # fmt: skip
    env = {**os.environ, "HARNESS_CACHE_DIR": os.environ.get("HARNESS_CACHE_DIR")
           or str(Path.home() / ".cache" / "harness")}  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=2400, env=env, check=False)
    assert done.returncode in (0, 3), done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    summary = json.loads((out / "summary.json").read_text())
    fixed = result["variants"]["llamacpp=0.1.12"]
    assert fixed["sessions"] == 12
    assert fixed["corrupted_sessions"] == 0, (out / "report.md").read_text()[-4000:]
    assert fixed["transport_errors"] == 0
    deaths = {d["variant"]: d for d in summary.get("server_deaths", [])}
    assert "llamacpp=0.1.12" not in deaths
    broken = [r["transport_error"] for r in read_turns(out / "turns.jsonl")
              if r["variant"] == "llamacpp=0.1.11" and r.get("transport_error")]  # fmt: skip
    if "llamacpp=0.1.11" in deaths:  # the moves ran past the cache: the server died
        assert done.returncode == 3
        assert deaths["llamacpp=0.1.11"]["signal"] in SIGNALS
        assert "killed by SIG" in result["error"]
        assert "**Server crash:** llamacpp=0.1.11" in (out / "report.md").read_text()
    else:  # they landed in the cache: corrupted answers, significantly more than 0.1.12's
        assert done.returncode == 0, done.stderr[-3000:]
        # a failed stream of the old build is the server's "invalid UTF-8" (its output's
        # corruption, a corrupted turn), never a transport failure
        assert all("invalid UTF-8" in e for e in broken), broken
        assert result["variants"]["llamacpp=0.1.11"]["transport_errors"] == 0
        [session] = [c for c in summary["comparisons"] if c["unit"] == "session"]
        assert session["b"] == "llamacpp=0.1.12" or session["a"] == "llamacpp=0.1.12"
        assert session["p_value"] < 0.01
