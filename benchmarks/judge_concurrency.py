"""The judge's wall time against the requests it keeps in flight (``--judge-concurrency``).

    python benchmarks/judge_concurrency.py --out DIR --sessions 200 --lanes 1 8 --rounds 2

Starts one ``harness sim`` (``--speed``, ``--fault-rate``: flagged turns to judge), runs
``harness run --endpoint`` against it with the judge off and every transcript kept, then
scores the run's flagged turns and a seeded sample of the passed ones (``--judge-sample``)
with ``harness.run.judge.judge_turns`` on that same simulator (it scores a text against its
memory of the answers it gave, so the scores are those of the run), once per lane count and
round, alternating, into a fresh ``judge.jsonl`` each time. Prints one JSON line per pass:
the lanes, the rows, the rows scored again alone (held: above the rule's floor beside
others), the wall seconds, the CPU seconds of this process (the judge's client) and of the
simulator.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TICK = os.sysconf("SC_CLK_TCK")


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def _start_sim(a: argparse.Namespace, port_file: Path) -> tuple[subprocess.Popen[bytes], str]:
    """The simulator on a port of its choosing, once it listens (its ``--port-file``)."""
    sim = subprocess.Popen(
        [sys.executable, "-m", "harness.cli.main", "sim", "--port", "0", "--port-file",
         str(port_file), "--speed", str(a.speed), "--seed", "7", "--fault-rate",
         str(a.fault_rate)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    deadline = time.monotonic() + 60
    while not (port_file.exists() and port_file.read_text().strip()):
        if time.monotonic() > deadline or sim.poll() is not None:
            sim.kill()
            raise SystemExit("the simulator did not start")
        time.sleep(0.05)
    return sim, f"http://127.0.0.1:{port_file.read_text().strip()}"


async def _judge(url: str, run: Path, out: Path, lanes: int, share: float, sim: int) -> dict:
    from harness.client.scoring import Scorer
    from harness.record.rundir import JUDGE_FILE, TRANSCRIPTS_FILE
    from harness.record.transcripts import load_transcripts
    from harness.run.judge import judge_turns

    transcripts = load_transcripts(run / TRANSCRIPTS_FILE)
    t0, c0, s0 = time.perf_counter(), time.process_time(), _cpu_s(sim)
    async with Scorer(url, "sglang", connections=lanes) as scorer:
        n, why = await judge_turns(scorer, transcripts, out / JUDGE_FILE, part=(None, None),
                                   share=share, seed=1, base={}, lanes=lanes)  # fmt: skip
    wall, client, server = time.perf_counter() - t0, time.process_time() - c0, _cpu_s(sim) - s0
    rows = [json.loads(x) for x in (out / JUDGE_FILE).read_text().splitlines()]
    return {"lanes": lanes, "rows": n, "cannot_score": why,
            "held": sum("beside_nll_worst" in r for r in rows),
            "flagged": sum(bool(r.get("flagged")) for r in rows), "wall_s": round(wall, 1),
            "client_cpu_s": round(client, 1), "sim_cpu_s": round(server, 1)}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="a folder (made; must not exist)")
    ap.add_argument("--sessions", type=int, default=200)
    ap.add_argument("--max-context", type=int, default=6000)
    ap.add_argument("--speed", type=float, default=50.0)
    ap.add_argument("--fault-rate", type=float, default=0.05)
    ap.add_argument("--judge-sample", type=float, default=0.1)
    ap.add_argument("--lanes", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--rounds", type=int, default=2)
    a = ap.parse_args()
    a.out.mkdir(parents=True)
    harness = [sys.executable, "-m", "harness.cli.main"]
    sim, url = _start_sim(a, a.out / "sim.port")
    try:
        run = a.out / "run"
        subprocess.run(
            [*harness, "run", "--endpoint", url, "--sessions", str(a.sessions),
             "--concurrency", "128", "--max-context", str(a.max_context), "--seed", "11",
             "--judge", "off", "--keep-transcripts", "--no-progress", "--out", str(run)],
            check=False, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        for r in range(a.rounds):
            for lanes in a.lanes:
                out = a.out / f"judge-{lanes}-{r}"
                out.mkdir()
                got = asyncio.run(_judge(url, run, out, lanes, a.judge_sample, sim.pid))
                print(json.dumps({"round": r, **got}), flush=True)
    finally:
        sim.terminate()
        sim.wait()
        shutil.rmtree(a.out / "run" / "servers", ignore_errors=True)


if __name__ == "__main__":
    os.chdir(ROOT)
    main()
