"""How long `harness --version`, `--help`, `run --help` and a mistyped flag take, in fresh
processes, repeated (hyperfine-like); optionally side by side with another git revision.

    python benchmarks/startup.py [--repeats 20] [--base REV]

Each command runs ``--repeats`` times, alternating with the base revision's when given (its
``harness/`` exported with ``git archive`` and put first on PYTHONPATH), after one warm-up run
each; the table gives the median, min and max wall time, the median CPU time (user and
system: what a busy machine does not inflate), and the bare interpreter (``python -c pass``)
for scale. Find what a command imports with
``python -X importtime -m harness.cli --help``.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from io import BytesIO
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EMPTY = tempfile.mkdtemp(prefix="harness-startup-")
COMMANDS = {
    "python -c pass": ["-c", "pass"],
    "harness --version": ["-m", "harness.cli", "--version"],
    "harness --help": ["-m", "harness.cli", "--help"],
    "harness run --help": ["-m", "harness.cli", "run", "--help"],
    "harness run --sesions 3 (typo)": ["-m", "harness.cli", "run", "--sesions", "3"],
}


def export(rev: str) -> Path:
    """The ``harness`` package of git revision ``rev`` in a temporary folder."""
    data = subprocess.run(["git", "archive", rev, "harness"], cwd=ROOT, check=True,
                          capture_output=True).stdout  # fmt: skip
    dest = Path(tempfile.mkdtemp(prefix="harness-base-"))
    with tarfile.open(fileobj=BytesIO(data)) as tar:
        tar.extractall(dest, filter="data")
    return dest


def once(args: list[str], pythonpath: Path) -> tuple[float, float]:
    """Wall and CPU seconds (user + system) of one fresh process. It runs in an empty folder,
    so the package comes from ``pythonpath`` (``-m`` puts the working folder first)."""
    env = {**os.environ, "PYTHONPATH": str(pythonpath)}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run([sys.executable, *args], env=env, capture_output=True, cwd=EMPTY)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--base", help="git revision to time side by side (e.g. main)")
    args = ap.parse_args()
    base = export(args.base) if args.base else None
    head = f"{'command':32} {'wall median s':>13} {'min':>6} {'max':>6} {'CPU median s':>12}"
    if base is not None:
        head += f" {'base wall':>10} {'base CPU':>9} {'CPU base/this':>13}"
    print(head)
    for name, cmd in COMMANDS.items():
        once(cmd, ROOT)  # warm the file cache
        if base is not None:
            once(cmd, base)
        ours, theirs = [], []
        for _ in range(args.repeats):
            ours.append(once(cmd, ROOT))
            if base is not None:
                theirs.append(once(cmd, base))
        wall = [w for w, _ in ours]
        cpu = statistics.median(c for _, c in ours)
        line = (f"{name:32} {statistics.median(wall):13.3f} {min(wall):6.3f} {max(wall):6.3f} "
                f"{cpu:12.3f}")  # fmt: skip
        if theirs:
            bcpu = statistics.median(c for _, c in theirs)
            line += f" {statistics.median(w for w, _ in theirs):10.3f} {bcpu:9.3f}"
            line += f" {bcpu / cpu:13.1f}"
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
