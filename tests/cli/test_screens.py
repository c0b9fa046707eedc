"""What people see: the live progress display in a real terminal (tmux) and report.html in a
real browser (headless Chromium). Both skip, saying why, where the tool is not installed
(CI installs the pip packages only; docs/screens.py says how to get them)."""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import matplotlib
import pytest
from PIL import Image, ImageChops

from harness.report import build as report
from harness.report.webfont import BAR_FAMILY
from tests.report.test_report import make_run, turn

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


# ---- glyphs: DSML's full-width bars and Chinese drawn, not boxes --------------------------
#
# A character no font has is drawn as the same empty box whatever it is; so a character is
# drawn when the page differs from the same page with it replaced by a code point no font
# has (U+10FFFD). The check is shown to see boxes first: two such code points give the same
# picture, and without the page's own font the bars are boxes on a machine with Latin fonts
# alone (the DejaVu fonts matplotlib ships, through a fontconfig file of the test's own).

NO_FONT = "\U0010fffd"
OTHER_NO_FONT = "\U0010fffe"
DSML = '<｜DSML｜invoke name="read_file">读取文件</｜DSML｜invoke>'
CHINESE = "先看看读取文件"
NO_CHROMIUM = (
    "chromium is not installed (apt-get install chromium): glyphs are checked in a real browser"
)


def report_page(tmp_path: Path) -> str:
    """A real report of a run whose corrupted turn holds Chinese and DSML: its head (the
    styles, the fonts) and its worst examples (the evidence, where the text is)."""
    run = make_run(tmp_path / "run", [
        turn("k=a", 0),
        turn("k=b", 0, "token_salad", f"先看看 {DSML} then salad",
             evidence={"reason": "mixed scripts", "offset": 4, "score": 0.9}),
    ])  # fmt: skip
    report.write_report(run)
    page = (run / "report.html").read_text(encoding="utf-8")
    head = page[: page.index("</head>") + len("</head>")]
    return head + "<body>" + page[page.index("<h2>Worst examples</h2>") :]


def latin_only(tmp_path: Path) -> dict[str, str]:
    """The environment of a machine with Latin fonts alone (DejaVu Sans and Sans Mono)."""
    fonts = tmp_path / "fonts"
    fonts.mkdir()
    for font in (Path(matplotlib.get_data_path()) / "fonts" / "ttf").glob("DejaVuSans*.ttf"):
        (fonts / font.name).symlink_to(font)
    conf = tmp_path / "fonts.conf"
    conf.write_text(
        '<?xml version="1.0"?><!DOCTYPE fontconfig SYSTEM "urn:fontconfig:fonts.dtd">'
        f"<fontconfig><dir>{fonts}</dir><cachedir>{tmp_path / 'fc-cache'}</cachedir>"
        "</fontconfig>"
    )
    return {"FONTCONFIG_FILE": str(conf)}


def shot(page: str, tmp_path: Path, name: str, env: dict[str, str] | None) -> Image.Image:
    html = tmp_path / f"{name}.html"
    html.write_text(page, encoding="utf-8")
    png = screens.screenshot(html, tmp_path / f"{name}.png", width=900, height=320, env=env)
    return Image.open(png).convert("RGB")


def same(a: Image.Image, b: Image.Image) -> bool:
    return ImageChops.difference(a, b).getbbox() is None


def drawn(page: str, chars: str, tmp_path: Path, name: str, env: dict[str, str] | None) -> bool:
    """Whether ``chars`` are drawn: the page differs from the page with them replaced by a
    code point no font has."""
    boxes = page.translate({ord(c): NO_FONT for c in chars})
    assert boxes != page
    return not same(shot(page, tmp_path, name, env), shot(boxes, tmp_path, name + "-boxes", env))


@pytest.mark.skipif(screens.chromium() is None, reason=NO_CHROMIUM)
def test_dsml_bars_are_drawn_on_a_machine_with_latin_fonts_alone(tmp_path: Path) -> None:
    page = report_page(tmp_path)
    env = latin_only(tmp_path)
    # the check sees boxes: two code points no font has are the same box
    one, other = page.replace("｜", NO_FONT), page.replace("｜", OTHER_NO_FONT)
    assert same(shot(one, tmp_path, "no-font", env), shot(other, tmp_path, "other-no-font", env))
    # without the page's own font the bars are boxes here; with it they are drawn
    assert f'"{BAR_FAMILY}"' in page
    bare = re.sub(r"@font-face\{[^}]*\}", "", page)
    assert not drawn(bare, "｜", tmp_path, "bare", env)
    assert drawn(page, "｜", tmp_path, "page", env)


@pytest.mark.skipif(screens.chromium() is None, reason=NO_CHROMIUM)
def test_chinese_is_drawn_where_the_machine_has_a_font_for_it(tmp_path: Path) -> None:
    fc = shutil.which("fc-list")
    has = fc and subprocess.run([fc, ":charset=8bfb"], capture_output=True, text=True).stdout
    if not has:
        pytest.skip("no font on this machine has Chinese, so no page can draw it (Debian: "
                    "apt-get install fonts-noto-cjk)")  # fmt: skip
    page = report_page(tmp_path)
    assert drawn(page, CHINESE, tmp_path, "chinese", None)
    assert drawn(page, "｜", tmp_path, "bars", None)
