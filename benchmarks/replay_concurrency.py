"""The replay oracle one send at a time against N sessions' sends at once
(``--oracle-concurrency N``), on the simulator in its deterministic mode: sends a second side
by side, and whether every send got the same verdict.

One ``harness run --ab deterministic=on --oracle replay --oracle-sample 0`` records the
sessions (every transcript kept, nothing replayed); then, for each N, a fresh simulator of
the same seed and the same replay of every send of the run, timed.

    python benchmarks/replay_concurrency.py --sessions 100 --turns 9 --lanes 1,4,8,16 \
        --speed 1000 --out replay-lanes
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from harness.client.chat import ChatClient  # noqa: E402
from harness.record.rundir import ORACLE_REPLAY_FILE  # noqa: E402
from harness.run.oracle_replay import Access, Sample, replay_oracle_variant  # noqa: E402

MODEL = "deepseek-ai/DeepSeek-V4-Flash"
VARIANT = "deterministic=on"


def record(args: argparse.Namespace, out: Path) -> None:
    cmd = [sys.executable, "-m", "harness.cli", "run", "--ab", "deterministic=on",
           "--sessions", str(args.sessions), "--turns", str(args.turns), "--concurrency", "64",
           "--max-context", "24000", "--speed", str(args.speed), "--seed", str(args.seed),
           "--oracle", "replay", "--oracle-sample", "0", "--judge", "off", "--no-progress",
           "--out", str(out)]  # fmt: skip
    subprocess.run(cmd, check=True, cwd=ROOT)


def start_sim(args: argparse.Namespace, port_file: Path) -> tuple[subprocess.Popen[bytes], str]:
    cmd = [sys.executable, "-m", "harness.sim", "--port", "0", "--port-file", str(port_file),
           "--enable-deterministic-inference", "--speed", str(args.speed), "--seed",
           str(args.seed), "--log-level", "warning"]  # fmt: skip
    proc = subprocess.Popen(cmd, cwd=ROOT)
    deadline = time.monotonic() + 60
    while not port_file.exists():
        if time.monotonic() > deadline or proc.poll() is not None:
            proc.kill()
            raise SystemExit("the simulator did not start")
        time.sleep(0.05)
    return proc, f"http://127.0.0.1:{port_file.read_text().strip()}"


async def replay(url: str, run: Path, lanes: int) -> tuple[list[dict[str, Any]], float]:
    client = ChatClient(url, model=MODEL, max_connections=lanes + 2)
    try:
        t0 = time.perf_counter()
        rows = await replay_oracle_variant(client, run, "bench", VARIANT, 0, Sample(),
                                           access=Access(None, "off"), lanes=lanes)  # fmt: skip
        return rows, time.perf_counter() - t0
    finally:
        await client.aclose()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sessions", type=int, default=100)
    p.add_argument("--turns", type=int, default=9)
    p.add_argument("--lanes", default="1,4,8,16")
    p.add_argument("--speed", type=float, default=1000.0)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--out", type=Path, default=Path("replay-lanes"))
    args = p.parse_args()
    base = args.out / "load"
    if not (base / "transcripts.jsonl").exists():
        record(args, base)
    verdicts: dict[int, dict[tuple[Any, ...], str]] = {}
    print(
        "| concurrency | sends | seconds | sends/s | speed-up | diverged | re-sent alone "
        "(differed at N / flagged under load) |"
    )
    print("|---|---|---|---|---|---|---|")
    first = None
    for n in [int(x) for x in args.lanes.split(",")]:
        run = args.out / f"lanes-{n}"
        shutil.rmtree(run, ignore_errors=True)
        shutil.copytree(base, run)
        (run / ORACLE_REPLAY_FILE).unlink(missing_ok=True)
        proc, url = start_sim(args, run / "sim.port")
        try:
            rows, took = asyncio.run(replay(url, run, n))
        finally:
            proc.terminate()
            proc.wait(10)
        keys = ("session", "turn", "attempt")
        verdicts[n] = {tuple(r[k] for k in keys): r["status"] for r in rows}
        rate = len(rows) / took
        first = first or rate
        diverged = sum(r["status"] == "diverged" for r in rows)
        again = sum("concurrent_diverged" in r for r in rows)
        differed = sum(bool(r.get("concurrent_diverged")) for r in rows)
        print(f"| {n} | {len(rows):,} | {took:.1f} | {rate:.1f} | {rate / first:.2f} | "
              f"{diverged} | {again} ({differed} / {again - differed}) |")  # fmt: skip
    same = all(v == next(iter(verdicts.values())) for v in verdicts.values())
    print(f"the same verdict for every send at every concurrency: {same}")


if __name__ == "__main__":
    main()
