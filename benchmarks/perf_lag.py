"""The harness's event-loop lag while the judging processes work, at 80, 500 and 2,000 sessions.

    python benchmarks/perf_lag.py                       # 80, 500, 2000 sessions; judges auto and 0
    python benchmarks/perf_lag.py --sessions 500 --judges auto
    python benchmarks/perf_lag.py --harness-cores 0-1 --delay-ms 200  # judges may use core 1

Each case runs ``perf_client.py --mode harness`` (``drive()`` with the shipped client, every
turn classified) against the null endpoint answering a DSML tool call in the content
(``--shape raw``: the harness parses and classifies every answer, the costly case), with the
harness's answers judged in its pool (``--judges`` auto: one process per usable core) and, side
by side in the same run, on the event loop (``--judges 0``: as before the pool). The endpoint
is pinned to the last core and the harness to the others (``taskset``); on a 2-core machine
that is core 0 for the harness, its judging process included, and core 1 for the endpoint.
The figures: the self-report's event-loop lag p99 and max, the time sessions waited for
their verdicts (p50, p99), turns/s, and the harness's own CPU per turn (its judging processes
not included).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
#: sessions, turns each: 3 s or more of load at each size on 2 cores
CASES = {80: (800, 4), 500: (2000, 3), 2000: (4000, 2)}


def start_endpoint(core: str, delay_ms: int) -> tuple[subprocess.Popen[str], str]:
    cmd = ["taskset", "-c", core, sys.executable, str(HERE / "null_endpoint.py")]
    cmd += ["--port", "0", "--shape", "raw", "--delay-ms", str(delay_ms)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line.startswith("PORT "):
        proc.kill()
        raise SystemExit(f"the endpoint did not start: {line!r}")
    return proc, f"http://127.0.0.1:{line.split()[1]}"


def run(
    concurrency: int, judges: str, cores: str, endpoint_core: str, delay_ms: int
) -> dict[str, Any]:
    sessions, turns = CASES.get(concurrency, (concurrency * 2, 3))
    proc, url = start_endpoint(endpoint_core, delay_ms)
    try:
        cmd = ["taskset", "-c", cores, sys.executable, str(HERE / "perf_client.py")]
        cmd += ["--mode", "harness", "--url", url, "--concurrency", str(concurrency)]
        cmd += ["--sessions", str(sessions), "--turns", str(turns)]
        if judges != "auto":
            cmd += ["--judges", judges]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=900, check=False)
        if done.returncode != 0:
            raise SystemExit(f"perf_client failed:\n{done.stderr[-3000:]}")
        result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    me = result["harness_self"] or {}
    lag = me.get("loop_lag_ms") or {}
    wait = me.get("judge_wait_ms") or {}
    return {
        "concurrency": concurrency,
        "judges": judges,
        "turns": result["turns"],
        "turns_per_s": round(result["turns_per_s"], 1),
        "loop_cpu_ms_per_turn": round(result["cpu_ms_per_turn"], 2),
        "lag_p99_ms": lag.get("p99"),
        "lag_max_ms": lag.get("max"),
        "verdict_wait_p50_ms": wait.get("p50"),
        "verdict_wait_p99_ms": wait.get("p99"),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sessions", default="80,500,2000", help="concurrencies, comma-separated")
    ap.add_argument("--judges", default="auto,0", help="judging processes to compare")
    ap.add_argument(
        "--harness-cores",
        help="taskset list for the harness and its judging processes (default: every core "
        "but the endpoint's)",
    )
    ap.add_argument("--delay-ms", type=int, default=0, help="the endpoint answers this late")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    n = os.cpu_count() or 1
    if n < 2:
        raise SystemExit("needs two cores (the endpoint and the harness pinned apart)")
    endpoint_core, cores = str(n - 1), f"0-{n - 2}" if n > 2 else "0"
    cores = args.harness_cores or cores
    rows = []
    load0 = os.getloadavg()[0]
    for c in (int(x) for x in args.sessions.split(",")):
        for judges in args.judges.split(","):
            row = run(c, judges, cores, endpoint_core, args.delay_ms)
            rows.append(row)
            print(json.dumps(row), file=sys.stderr, flush=True)
    print(
        "| sessions in flight | judging | turns/s | harness CPU ms/turn (loop process) "
        "| loop lag p99 / max ms | verdict wait p50 / p99 ms |\n|---|---|---:|---:|---|---|"
    )
    for r in rows:
        how = "on the loop" if r["judges"] == "0" else f"pool ({r['judges']})"
        print(
            f"| {r['concurrency']:,} | {how} | {r['turns_per_s']:,.0f} "
            f"| {r['loop_cpu_ms_per_turn']:.2f} | {r['lag_p99_ms']} / {r['lag_max_ms']} "
            f"| {r['verdict_wait_p50_ms']} / {r['verdict_wait_p99_ms']} |"
        )
    print(
        f"\n(harness on cores {cores}, endpoint on core {endpoint_core}, answering after "
        f"{args.delay_ms} ms; load average "
        f"{load0:.1f} before, {os.getloadavg()[0]:.1f} after)"
    )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
