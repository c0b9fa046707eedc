"""`harness merge` at scale: its peak memory and time for shards of hundreds of thousands of turns.

    python benchmarks/merge_scale.py                       # 2 shards, x250 and x850 their turns
    python benchmarks/merge_scale.py --copies 250 850 2000

Two real shards of one run (``harness run --shard I/2``, 40 sessions x 6 turns, run at once
against ``harness sim``) are made once; each shard's turns and finished sessions are then
copied ``--copies`` times over (the copies' session numbers shifted past the plan's, every
other field as the shard wrote it), and ``harness merge`` of the two is run on each size in a
fresh process whose peak resident memory is read from ``getrusage`` (the merge's whole
command: every turn in plan order, the summary, statistics, plots and report). One line per
size: turns, peak MB, seconds.
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CLI = [sys.executable, "-m", "harness.cli"]
SESSIONS = 40


def make_shards(work: Path) -> list[Path]:
    port_file = work / "port"
    sim = subprocess.Popen(
        [*CLI, "sim", "--port", "0", "--port-file", str(port_file), "--speed", "50"],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while not port_file.is_file() or not port_file.read_text().strip():
            if time.monotonic() > deadline or sim.poll() is not None:
                raise SystemExit("the simulator did not start")
            time.sleep(0.1)
        url = f"http://127.0.0.1:{port_file.read_text().strip()}"
        shards = [work / f"s{i}" for i in (1, 2)]
        runs = [
            subprocess.Popen(
                [
                    *CLI,
                    "run",
                    "--endpoint",
                    url,
                    "--sessions",
                    str(SESSIONS),
                    "--turns",
                    "6",
                    "--seed",
                    "3",
                    "--no-progress",
                    "--shard",
                    f"{i}/2",
                    "--out",
                    str(shard),
                ],
                cwd=ROOT,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
            )  # fmt: skip
            for i, shard in enumerate(shards, 1)
        ]
        for run in runs:
            _, err = run.communicate(timeout=300)
            if run.returncode != 0:
                raise SystemExit(f"a shard failed:\n{err[-2000:]}")
    finally:
        sim.terminate()
        sim.wait(timeout=10)
    return shards


def grow(shard: Path, into: Path, copies: int) -> int:
    """``shard`` copied to ``into`` with its turns and sessions ``copies`` times over."""
    shutil.copytree(shard, into, ignore=shutil.ignore_patterns("turns.parquet"))
    turns = [json.loads(x) for x in (shard / "turns.jsonl").read_text().splitlines()]
    sessions = [json.loads(x) for x in (shard / "sessions.jsonl").read_text().splitlines()]
    for name, rows in (("turns.jsonl", turns), ("sessions.jsonl", sessions)):
        with open(into / name, "w") as fh:
            for k in range(copies):
                for row in rows:
                    fh.write(json.dumps(dict(row, session=row["session"] + SESSIONS * k)) + "\n")
    return len(turns) * copies


def measure(shards: list[Path], out: Path) -> tuple[float, float]:
    """(peak MB, seconds) of ``harness merge`` in a process of its own."""
    probe = (
        "import resource, subprocess, sys, time\n"
        "t = time.monotonic()\n"
        "code = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL).returncode\n"
        "peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss\n"
        "print(code, peak, time.monotonic() - t)\n"
    )
    cmd = [sys.executable, "-c", probe, *CLI, "merge", *map(str, shards), "-o", str(out)]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=True)
    code, peak_kb, seconds = done.stdout.split()
    if int(code) != 0:
        raise SystemExit(f"harness merge exited {code}")
    return int(peak_kb) / 1024, float(seconds)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--copies", type=int, nargs="+", default=[250, 850])
    args = ap.parse_args()
    assert resource.RUSAGE_CHILDREN  # (Linux and macOS)
    work = Path(tempfile.mkdtemp(prefix="merge-scale-"))
    try:
        shards = make_shards(work)
        for copies in args.copies:
            grown = [work / f"{copies}-{s.name}" for s in shards]
            turns = sum(grow(s, g, copies) for s, g in zip(shards, grown, strict=True))
            peak, seconds = measure(grown, work / f"{copies}-merged")
            row = {"turns": turns, "peak_mb": round(peak), "seconds": round(seconds, 1)}
            print(json.dumps(row), flush=True)
            for path in (*grown, work / f"{copies}-merged"):
                shutil.rmtree(path)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
