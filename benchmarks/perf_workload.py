"""The harness on the workload users run, against a bare client sending the same bodies.

    python benchmarks/perf_workload.py                  # 500 sessions x 12 turns, 3 repeats
    python benchmarks/perf_workload.py --sessions 200 --repeats 1

The default coding-agent scenario, whose contexts grow every turn by the fake tools' results
(about 2k to 35k tokens over 12 turns, 74 KB a request on average), against the null endpoint
(``null_endpoint.py --shape raw``: one streamed DSML tool call per answer). The endpoint runs
on core 1 and the client on core 0 (``taskset``), so neither takes the other's CPU.

1. A recording pass: ``harness run --endpoint URL --sessions N --turns T --workers 1`` against
   an endpoint that writes every request body to a file (not measured).
2. Then, ``--repeats`` times, alternated: the bare client (aiohttp, ``--concurrency`` requests
   in flight, replaying the recorded bodies in order and reading every answer to its end), and
   the same ``harness run`` command, each against a fresh endpoint.

The measure is the endpoint's own: requests per second between the arrival of the 10th and of
the 90th percentile request (the steady state, without start-up and the last stragglers).
Each harness run also gives the time from its start to the first request and from the last
request to its exit (start-up, and the summary, plots and report). The ratio is the harness's
rate over the bare client's run just before it; the table gives the median and the range.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ENDPOINT_CORE = "1"
CLIENT_CORE = "0"


def start_endpoint(record: Path | None = None) -> tuple[subprocess.Popen[str], str]:
    cmd = ["taskset", "-c", ENDPOINT_CORE, sys.executable, str(HERE / "null_endpoint.py")]
    cmd += ["--port", "0", "--shape", "raw"]
    if record is not None:
        cmd += ["--record", str(record)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line.startswith("PORT "):
        proc.kill()
        raise SystemExit(f"the endpoint did not start: {line!r}")
    return proc, f"http://127.0.0.1:{line.split()[1]}"


def stats(url: str) -> dict[str, Any]:
    import urllib.request

    with urllib.request.urlopen(url + "/stats", timeout=30) as resp:
        doc: dict[str, Any] = json.load(resp)
    return doc


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def stop(proc: subprocess.Popen[str]) -> None:
    proc.terminate()
    proc.wait(timeout=30)


def steady_rate(arrivals: list[float]) -> float:
    """Requests per second between the 10th and the 90th percentile arrival."""
    n = len(arrivals)
    lo, hi = n // 10, (9 * n) // 10
    span = arrivals[hi] - arrivals[lo]
    return (hi - lo) / span if span > 0 else float("nan")


def harness_cmd(url: str, out: Path, args: argparse.Namespace) -> list[str]:
    return [
        "taskset", "-c", CLIENT_CORE,
        sys.executable, "-m", "harness.cli", "run",
        "--endpoint", url,
        "--sessions", str(args.sessions),
        "--concurrency", str(args.concurrency),
        "--turns", str(args.turns),
        "--workers", "1",
        "--seed", "1",
        "--out", str(out),
    ]  # fmt: skip


def run_harness(args: argparse.Namespace, record: Path | None) -> dict[str, Any]:
    proc, url = start_endpoint(record)
    out = Path(tempfile.mkdtemp(prefix="perf-workload-"))
    try:
        t0, c0 = time.monotonic(), children_cpu()
        done = subprocess.run(
            harness_cmd(url, out / "run", args), capture_output=True, text=True, timeout=1800
        )
        t1, c1 = time.monotonic(), children_cpu()
        endpoint_cpu = cpu_seconds(proc.pid)
        if done.returncode != 0:
            raise SystemExit(f"harness run failed ({done.returncode}):\n{done.stderr[-3000:]}")
        arrivals = stats(url)["arrivals"]
    finally:
        stop(proc)
        shutil.rmtree(out, ignore_errors=True)
    return {
        "client": "harness",
        "requests": len(arrivals),
        "rate": steady_rate(arrivals),
        "to_first_request_s": arrivals[0] - t0,
        "after_last_request_s": t1 - arrivals[-1],
        "wall_s": t1 - t0,
        "client_cpu_ms": 1000 * (c1 - c0) / len(arrivals),
        "endpoint_cpu_ms": 1000 * endpoint_cpu / len(arrivals),
    }


def run_bare(args: argparse.Namespace, bodies: Path) -> dict[str, Any]:
    proc, url = start_endpoint()
    try:
        cmd = ["taskset", "-c", CLIENT_CORE, sys.executable, __file__, "--replay", str(bodies)]
        cmd += ["--url", url, "--concurrency", str(args.concurrency)]
        c0 = children_cpu()
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
        c1 = children_cpu()
        if done.returncode != 0:
            raise SystemExit(f"the bare client failed:\n{done.stderr[-3000:]}")
        arrivals = stats(url)["arrivals"]
        endpoint_cpu = cpu_seconds(proc.pid)
    finally:
        stop(proc)
    return {
        "client": "bare",
        "requests": len(arrivals),
        "rate": steady_rate(arrivals),
        "client_cpu_ms": 1000 * (c1 - c0) / len(arrivals),
        "endpoint_cpu_ms": 1000 * endpoint_cpu / len(arrivals),
    }


def read_bodies(path: Path) -> list[bytes]:
    data = path.read_bytes()
    bodies, at = [], 0
    while at < len(data):
        size = int.from_bytes(data[at : at + 4], "big")
        bodies.append(data[at + 4 : at + 4 + size])
        at += 4 + size
    return bodies


async def replay(url: str, bodies: list[bytes], concurrency: int) -> int:
    """Send every body in order, ``concurrency`` in flight, reading each answer to its end.

    Like with like: the harness's transport settings (``ChatClient``): the same pool size,
    no per-host limit, no compression asked nor decompressed, no proxy lookup, the same
    headers and connect timeouts, and the same read path (``iter_any``); only what the harness
    does with the bytes is left out, and the read timeout (the harness watches each stream
    with one timer: ``_ReadWatch``; the bare client has none, which only makes it faster)."""
    import aiohttp

    from harness.client import DEFAULT_REQUEST_TIMEOUT, connections_for

    queue = iter(bodies)
    done = 0
    connector = aiohttp.TCPConnector(limit=connections_for(concurrency), limit_per_host=0)
    headers = {"content-type": "application/json", "accept-encoding": "identity"}
    timeout = aiohttp.ClientTimeout(
        total=None,
        connect=DEFAULT_REQUEST_TIMEOUT,
        sock_connect=10.0,
        sock_read=None,
    )
    async with aiohttp.ClientSession(
        connector=connector, timeout=timeout, auto_decompress=False, trust_env=False
    ) as session:

        async def one() -> None:
            nonlocal done
            for body in queue:
                async with session.post(
                    url + "/v1/chat/completions", data=body, headers=headers
                ) as resp:
                    async for _ in resp.content.iter_any():
                        pass
                done += 1

        await asyncio.gather(*(one() for _ in range(concurrency)))
    return done


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sessions", type=int, default=500)
    ap.add_argument("--concurrency", type=int, default=500)
    ap.add_argument("--turns", type=int, default=12)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", type=Path, help="write every run's figures here")
    ap.add_argument("--replay", type=Path, help=argparse.SUPPRESS)  # the bare client itself
    ap.add_argument("--url", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.replay:
        sent = asyncio.run(replay(args.url, read_bodies(args.replay), args.concurrency))
        print(json.dumps({"requests": sent}))
        return
    if shutil.which("taskset") is None or (os.cpu_count() or 1) < 2:
        raise SystemExit("needs taskset and two cores (the endpoint and the client pinned apart)")
    work = Path(tempfile.mkdtemp(prefix="perf-bodies-"))
    try:
        bodies = work / "bodies.bin"
        first = run_harness(args, bodies)
        size = bodies.stat().st_size
        print(
            f"recorded {first['requests']} requests, {size / 1e6:.0f} MB "
            f"({size / max(1, first['requests']) / 1e3:.0f} KB a request)",
            file=sys.stderr,
        )
        rows: list[dict[str, Any]] = []
        for _ in range(args.repeats):
            for run in (lambda: run_bare(args, bodies), lambda: run_harness(args, None)):
                row = run()
                rows.append(row)
                print(
                    f"{row['client']:>8}: {row['rate']:7.0f} requests/s, CPU per request: "
                    f"client {row['client_cpu_ms']:.2f} ms, "
                    f"endpoint {row['endpoint_cpu_ms']:.2f} ms",
                    file=sys.stderr,
                )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    bare = [r for r in rows if r["client"] == "bare"]
    ours = [r for r in rows if r["client"] == "harness"]
    ratios = [h["rate"] / b["rate"] for b, h in zip(bare, ours, strict=True)]
    print(
        f"| client (core {CLIENT_CORE}) | requests/s at the endpoint (core {ENDPOINT_CORE}) |\n"
        f"|---|---|\n"
        f"| bare aiohttp, same bodies | {statistics.median(r['rate'] for r in bare):,.0f} |\n"
        f"| `harness run --workers 1` | {statistics.median(r['rate'] for r in ours):,.0f} "
        f"(ratio **{statistics.median(ratios):.2f}**, {min(ratios):.2f}-{max(ratios):.2f}) |\n"
        f"\nharness: {statistics.median(r['to_first_request_s'] for r in ours):.2f} s from the "
        f"command to the first request, "
        f"{statistics.median(r['after_last_request_s'] for r in ours):.2f} s from the last "
        f"request to the exit ({args.sessions} sessions x {args.turns} turns, "
        f"{args.concurrency} in flight, {args.repeats} repeats)"
    )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
