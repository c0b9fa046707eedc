"""What people see: the live progress display in a real terminal (tmux) and report.html in a
real browser (headless Chromium). Both skip, saying why, where the tool is not installed
(CI installs the pip packages only; docs/screens.py says how to get them)."""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-m", "harness.cli"]
EVIL = (
    "ok so far <script>document.title='PWNED'</script>"
    "<img src=x onerror=\"document.title='PWNED'\"> zq#!~ vx&& garble"
)


def _screens() -> ModuleType:
    spec = importlib.util.spec_from_file_location("screens", ROOT / "docs" / "screens.py")
    assert spec is not None
    assert spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


screens = _screens()
SMALL_RUN = ["run", "--sessions", "6", "--turns", "6", "--max-context", "12000",
             "--ab", "index_k=fp8,bf16", "--seed", "3"]  # fmt: skip


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed (apt-get install "
                    "tmux): the live display needs a real terminal to be captured")  # fmt: skip
def test_the_progress_display_in_an_80_column_terminal(tmp_path: Path) -> None:
    out = tmp_path / "run"
    captures = screens.tmux_capture(
        [*CLI, "-v", *SMALL_RUN, "--speed", "1.5", "--out", str(out)], width=80, height=30
    )
    problems = screens.check_progress(captures, ["index_k=fp8", "index_k=bf16"], width=80)
    assert problems == [], "\n".join(problems) + "\n\n" + screens.last_running(captures)
    shown = screens.last_running(captures)
    # logs (here -v's debug records) were printed above the display, which stayed whole
    above = shown.split("\nrun: ")[0]
    assert "DEBUG" in above or "index_k=" in above
    assert (out / "report.html").is_file()


@pytest.mark.slow
@pytest.mark.skipif(screens.chromium() is None, reason="chromium is not installed (apt-get "
                    "install chromium): the report is checked in a real browser")  # fmt: skip
def test_report_html_renders_its_plots_and_runs_no_script_from_model_output(
    tmp_path: Path,
) -> None:
    out = tmp_path / "run"
    proc = subprocess.run([*CLI, *SMALL_RUN, "--speed", "20", "--out", str(out), "--no-progress"],
                          capture_output=True, text=True, cwd=ROOT, timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    # a model answer that carries markup: the report must show it as text, never run it
    turns = (out / "turns.jsonl").read_text().splitlines()
    evil = json.loads(turns[-1])
    evil.update(session=99, label="token_salad", corrupted=True, content=EVIL,
                evidence={"offset": 9, "why": "<b onmouseover=x>"}, tool_calls=[])  # fmt: skip
    (out / "turns.jsonl").write_text("\n".join([*turns, json.dumps(evil)]) + "\n")
    again = subprocess.run([*CLI, "report", str(out)], capture_output=True, text=True, cwd=ROOT,
                           timeout=300)  # fmt: skip
    assert again.returncode == 0, again.stderr
    png = tmp_path / "report.png"
    problems = screens.check_report(out, png)
    assert problems == []
    page = screens.dom(out / "report.html")
    assert "PWNED" not in page.split("</title>")[0]
    assert "&lt;script&gt;document.title='PWNED'&lt;/script&gt;" in page  # shown, as text
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
