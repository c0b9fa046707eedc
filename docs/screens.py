"""What people see, captured and checked: the live progress display in a real terminal
(tmux, 80 columns) and report.html in a real browser (headless Chromium).

    python docs/screens.py [--out docs/img] [--run-dir DIR]

runs ``harness run --demo`` in a tmux pane (unless --run-dir names a run already made),
captures the pane while it runs, checks the progress lines, screenshots the run's
report.html, checks that the page rendered its plots, and writes ``progress.txt`` (the last
capture taken while the load ran) and ``report.png`` to --out. tests/cli/test_screens.py uses the
same functions on a small run. Needs tmux and chromium (Debian: apt-get install tmux chromium).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BROWSERS = ("chromium", "chromium-browser", "google-chrome")
CHROMIUM_FLAGS = (
    "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
)  # fmt: skip
#: A variant's progress line: its name, then the turns done of planned, whole.
VARIANT_LINE = re.compile(r"^(?P<name>\S+) +(?:[━╺]+  )?(?P<done>[\d,]+)/(?P<planned>[\d,]+) turns")
#: matplotlib's first two colours (the variants' bars): seen only where a plot rendered.
PLOT_COLOURS = ((31, 119, 180), (255, 127, 14))


def chromium() -> str | None:
    return next((b for b in map(shutil.which, BROWSERS) if b), None)


def _browser(
    args: list[str], timeout: float = 120, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Chromium with ``args``, a fresh profile, and ``env`` added to the environment (a
    FONTCONFIG_FILE: the fonts it may use)."""
    browser = chromium()
    if browser is None:
        raise RuntimeError("no chromium found (apt-get install chromium)")
    with tempfile.TemporaryDirectory() as profile:
        return subprocess.run(
            [browser, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *args],
            capture_output=True, text=True, timeout=timeout,
            env={**os.environ, **env} if env else None,
        )  # fmt: skip


def screenshot(
    html: Path, png: Path, width: int = 1200, height: int = 9000, env: dict[str, str] | None = None
) -> Path:
    """A full-height screenshot of ``html`` as Chromium renders it."""
    png.parent.mkdir(parents=True, exist_ok=True)
    png.unlink(missing_ok=True)
    done = _browser(
        [f"--window-size={width},{height}", f"--screenshot={png}", html.as_uri()], env=env
    )
    if not png.is_file():
        raise RuntimeError(f"chromium wrote no screenshot: {done.stderr[-400:]}")
    return png


def dom(html: Path) -> str:
    """The page's DOM after Chromium loaded it (and ran any script it has)."""
    return _browser(["--dump-dom", html.as_uri()]).stdout


def colour_pixels(png: Path, colour: tuple[int, int, int], tol: int = 40) -> int:
    """How many pixels of ``png`` are within ``tol`` of ``colour``."""
    import matplotlib.image as mpimg
    import numpy as np

    img = (mpimg.imread(png)[..., :3] * 255).astype(int)
    near = np.abs(img - np.array(colour)).max(axis=-1) <= tol
    return int(near.sum())


def check_report(run_dir: Path, png: Path) -> list[str]:
    """Problems with report.html as Chromium shows it (an empty list: none)."""
    html = run_dir / "report.html"
    problems = []
    page = dom(html)
    title = re.search(r"<title>(.*?)</title>", page, flags=re.S)
    if not title or not title.group(1).startswith("Corruption report"):
        problems.append(f"the title changed: {title.group(1) if title else None!r}")
    if re.search(r"<script\b", page, flags=re.I):
        problems.append("the page has a <script> element")
    if re.search(r"<[^>]+\son\w+\s*=", page):
        problems.append("an element of the page has an event handler attribute")
    images = len(re.findall(r'<img [^>]*src="data:image/png;base64,', page))
    if images == 0:
        problems.append("no plot in the page")
    screenshot(html, png)
    for colour in PLOT_COLOURS:
        if colour_pixels(png, colour) < 500:
            problems.append(f"the screenshot has next to no pixels of the plots' colour {colour}")
    return problems


# ---- the terminal ------------------------------------------------------------------------


def tmux_capture(
    command: list[str],
    width: int = 80,
    height: int = 30,
    limit_s: float = 240.0,
    cwd: Path = ROOT,
) -> list[str]:
    """Run ``command`` in a detached tmux pane of ``width`` x ``height`` and capture the pane
    every half second until the command ends (or ``limit_s``); returns the captures."""
    name = f"harness-screens-{os.getpid()}"
    tmux = ["tmux", "-L", name]  # a server of its own: nobody else's sessions are touched
    done = Path(tempfile.mkdtemp()) / "done"
    shell = " ".join(map(_quote, command)) + f"; echo $? > {_quote(str(done))}; sleep 60"
    env = {**os.environ, "TERM": "xterm-256color"}
    size = ["-x", str(width), "-y", str(height)]
    subprocess.run([*tmux, "-f", "/dev/null", "new-session", "-d", "-s", name, *size,
                    "-c", str(cwd), shell], check=True, env=env)  # fmt: skip
    captures: list[str] = []
    try:
        end = time.monotonic() + limit_s
        while time.monotonic() < end:
            shot = subprocess.run([*tmux, "capture-pane", "-p", "-t", name],
                                  capture_output=True, text=True)  # fmt: skip
            captures.append(shot.stdout)
            if done.exists():
                break
            time.sleep(0.5)
    finally:
        subprocess.run([*tmux, "kill-server"], capture_output=True)
    return captures


def _quote(text: str) -> str:
    import shlex

    return shlex.quote(text)


def progress_lines(capture: str) -> list[re.Match[str]]:
    """The variant lines of a capture (not the run's line above them)."""
    found = (VARIANT_LINE.match(line) for line in capture.splitlines())
    return [m for m in found if m is not None and m.group("name") != "run:"]


def check_progress(captures: list[str], variants: list[str], width: int = 80) -> list[str]:
    """Problems with the live display in the captures (an empty list: none)."""
    problems = []
    # while the load runs (afterwards the report's logs and the table follow the display)
    live = [c for c in captures if _running(c)]
    if len(live) < 2:
        return [f"the progress display showed in {len(live)} of {len(captures)} captures"]
    for cap in live:
        lines = [line for line in cap.splitlines() if line.strip()]
        if any(len(line) > width for line in lines):
            problems.append("a line is wider than the terminal")
        shown = progress_lines(cap)
        names = [m.group("name") for m in shown]
        if names != variants:
            problems.append(f"variant lines {names}, expected {variants}")
        tail = lines[-len(shown) :]
        if [VARIANT_LINE.match(line) is not None for line in tail] != [True] * len(shown):
            problems.append("something was printed over or under the progress lines")
        for m in shown:
            if int(m.group("done").replace(",", "")) > int(m.group("planned").replace(",", "")):
                problems.append(f"more turns done than planned: {m.group(0)}")
        for line in lines:
            if ("turns ·" in line or " turns" in line) and re.search(
                r"(DEBUG|INFO|WARNING) ", line
            ):
                problems.append(f"a log record and the progress on one line: {line!r}")
    moved = {tuple(m.group("done") for m in progress_lines(c)) for c in live}
    if len(moved) < 2:
        problems.append("the turns done never moved")
    return sorted(set(problems))


def _running(capture: str) -> bool:
    """A variant of the capture is still running or waiting (not all done)."""
    return any(" · done in " not in m.string for m in progress_lines(capture))


def last_running(captures: list[str]) -> str:
    """The last capture taken while the load ran."""
    running = [c for c in captures if _running(c)]
    return (running or captures or [""])[-1]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "img")
    ap.add_argument("--run-dir", type=Path, help="use this run for the report (no new run)")
    args = ap.parse_args()
    run_dir = args.run_dir
    if run_dir is None:
        where = Path(tempfile.mkdtemp())
        run_dir = where / "reports" / "demo"
        cmd = [sys.executable, "-m", "harness.cli", "run", "--demo", "--out", "reports/demo"]
        captures = tmux_capture(cmd, cwd=where)
        problems = check_progress(captures, ["index_k=fp8", "index_k=bf16"])
        running = [c for c in captures if _running(c)] or [""]
        shown = running[len(running) * 3 // 4].rstrip()  # the last variant well under way
        (args.out / "progress.txt").write_text(shown + "\n")
        print(f"progress: {len(captures)} captures; problems: {problems or 'none'}")
        print(shown)
    full = Path(tempfile.mkdtemp()) / "report-full.png"
    problems = check_report(run_dir, full)
    from PIL import Image

    with Image.open(full) as img:  # the top of the page: what was run, verdict, tables
        img.crop((0, 0, img.width, min(img.height, 2300))).save(args.out / "report.png")
    for name in ("corruption_by_variant", "corruption_by_context", "corruption_by_inflight",
                 "label_mix", "server_metrics"):  # fmt: skip
        plot = run_dir / "plots" / f"{name}.png"
        if plot.is_file():
            shutil.copy(plot, args.out / f"demo_{name}.png")
    print(f"report: {args.out / 'report.png'}; problems: {problems or 'none'}")
    print(f"run folder: {run_dir}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
