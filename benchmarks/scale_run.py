"""A long `harness run`: the harness's memory during the load and while the report is built,
and the time from the last turn to the exit.

    python benchmarks/scale_run.py --out runs/scale -- --sessions 3800 --concurrency 256 \\
        --max-context 6000 --speed 50 --ab index_k=fp8,bf16

Runs ``harness run ARGS --out DIR --no-progress`` under ``/usr/bin/time -v`` (where there is
one: the peak resident memory of the largest process) and reads ``/proc`` every
``--interval`` seconds: the resident memory of every process under it, the harness's (the
parent, its workers, their judging processes) summed apart from the simulator's
(``python -m harness.sim``). The last turn is the latest ``sent_at + latency_s`` in
turns.jsonl; the samples after it are the report's. Then ``harness report DIR`` (the report
rebuilt from the run folder, as a user would) is measured the same way. One JSON line:
peaks in MB, seconds, turns and the run folder's size.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import orjson

ROOT = Path(__file__).resolve().parent.parent
PAGE = os.sysconf("SC_PAGE_SIZE")


def _children() -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        out.setdefault(ppid, []).append(int(entry))
    return out


def _tree(root: int) -> list[int]:
    kids = _children()
    todo, seen = [root], []
    while todo:
        pid = todo.pop()
        seen.append(pid)
        todo.extend(kids.get(pid, ()))
    return seen


def _rss_mb(pid: int) -> tuple[float, str]:
    try:
        pages = int(Path(f"/proc/{pid}/statm").read_text().split()[1])
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except (OSError, ValueError, IndexError):
        return 0.0, ""
    return pages * PAGE / 1e6, cmd


def sample(root: int) -> dict[str, float]:
    """Resident MB of the harness's processes under ``root`` and of the simulator's."""
    harness = sim = 0.0
    for pid in _tree(root):
        rss, cmd = _rss_mb(pid)
        if "harness.sim" in cmd:
            sim += rss
        elif "python" in cmd:  # not /usr/bin/time itself
            harness += rss
    return {"harness_mb": harness, "sim_mb": sim}


def measure(cmd: list[str], interval: float) -> tuple[list[dict[str, float]], float, str]:
    """Run ``cmd`` (under /usr/bin/time -v where there is one), sampling its processes."""
    timer = shutil.which("time") or ("/usr/bin/time" if Path("/usr/bin/time").exists() else None)
    full = [timer, "-v", *cmd] if timer else cmd
    samples: list[dict[str, float]] = []
    proc = subprocess.Popen(full, stderr=subprocess.PIPE, text=True)
    while proc.poll() is None:
        samples.append({"t": time.time(), **sample(proc.pid)})
        time.sleep(interval)
    ended = time.time()
    err = proc.stderr.read() if proc.stderr else ""
    return samples, ended, err


def _largest_process_mb(timed: str) -> float | None:
    for line in timed.splitlines():
        if "Maximum resident set size" in line:
            return int(line.rsplit(":", 1)[1]) / 1000
    return None


def last_turn(turns: Path) -> tuple[float, int]:
    """The wall clock of the last turn's end, and the turns."""
    last, n = 0.0, 0
    with open(turns, "rb") as fh:
        for raw in fh:
            try:
                r = orjson.loads(raw)
            except orjson.JSONDecodeError:
                continue
            n += 1
            end = (r.get("sent_at") or 0.0) + (r.get("latency_s") or 0.0)
            last = max(last, end)
    return last, n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="the run folder (must not exist)")
    ap.add_argument("--interval", type=float, default=2.0, help="seconds between samples")
    ap.add_argument("args", nargs=argparse.REMAINDER, help="-- then harness run's arguments")
    a = ap.parse_args()
    args = a.args[1:] if a.args[:1] == ["--"] else a.args
    harness = [sys.executable, "-m", "harness.cli.main"]
    run = [*harness, "run", *args, "--out", str(a.out), "--no-progress"]
    started = time.time()
    samples, ended, timed = measure(run, a.interval)
    last, n = last_turn(a.out / "turns.jsonl")
    load = [s for s in samples if s["t"] <= last]
    after = [s for s in samples if s["t"] > last]
    out: dict[str, Any] = {
        "turns": n,
        "run_s": round(ended - started, 1),
        "last_turn_to_exit_s": round(ended - last, 1),
        "harness_peak_mb_load": round(max((s["harness_mb"] for s in load), default=0), 1),
        "harness_peak_mb_after_last_turn": round(
            max((s["harness_mb"] for s in after), default=0), 1
        ),
        "sim_peak_mb": round(max((s["sim_mb"] for s in samples), default=0), 1),
        "largest_process_peak_mb": _largest_process_mb(timed),
    }
    t0 = time.time()
    report_samples, report_end, report_timed = measure(
        [*harness, "report", str(a.out)], a.interval / 4
    )
    out["report_rebuild_s"] = round(report_end - t0, 1)
    out["report_rebuild_peak_mb"] = _largest_process_mb(report_timed) or round(
        max((s["harness_mb"] for s in report_samples), default=0), 1
    )
    sizes = {p.name: p.stat().st_size / 1e6 for p in a.out.iterdir() if p.is_file()}
    out["run_folder_mb"] = round(sum(sizes.values()), 1)
    out["files_mb"] = {k: round(v, 1) for k, v in sorted(sizes.items(), key=lambda kv: -kv[1])[:5]}
    (a.out / "scale_samples.json").write_bytes(orjson.dumps(samples))
    print(json.dumps(out))


if __name__ == "__main__":
    os.chdir(ROOT)
    main()
