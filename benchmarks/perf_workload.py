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

Both clients are CPU-bound on their core (the endpoint answers at once), so on a quiet machine
the rate ratio is the ratio of their CPU per request. On a machine shared with other work the
rates say how much of core 0 each run got; so each client's CPU is also sampled (``/proc``,
every 20 ms) and cut to the same steady state: "CPU ms a request", and its ratio beside the
rate's.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
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


def start_endpoint(
    record: Path | None = None, shape: str = "raw"
) -> tuple[subprocess.Popen[str], str]:
    cmd = ["taskset", "-c", ENDPOINT_CORE, sys.executable, str(HERE / "null_endpoint.py")]
    cmd += ["--port", "0", "--shape", shape]
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


def children_of(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as fh:
            return [int(k) for k in fh.read().split()]
    except OSError:
        return []


def tree_cpu_seconds(pid: int) -> float:
    """A process's CPU seconds and its living children's (the judging processes)."""
    total = cpu_seconds(pid)
    for kid in children_of(pid):
        with contextlib.suppress(OSError, ValueError, IndexError):
            total += cpu_seconds(kid)
    return total


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


class CpuSampler:
    """A process's CPU seconds, read from /proc every 20 ms with the monotonic time (the
    clock the endpoint stamps arrivals with), so the CPU it spent in the steady state can be
    cut out: on a machine shared with other work, the rate of a CPU-bound client says how
    much of its core it got, its CPU per request what it costs."""

    def __init__(self, pid: int, judge_cores: set[int] | None = None) -> None:
        import threading

        self.pid = pid
        self.samples: list[tuple[float, float]] = []
        self.loop_samples: list[tuple[float, float]] = []  # the client process alone
        # --judge-cores: the harness's children (its judging processes) are moved there as
        # they appear, so the loop keeps its core to itself
        self.judge_cores = judge_cores
        self._pinned: set[int] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            if self.judge_cores:
                for kid in set(children_of(self.pid)) - self._pinned:
                    with contextlib.suppress(OSError):
                        os.sched_setaffinity(kid, self.judge_cores)
                        self._pinned.add(kid)
            try:
                now = time.monotonic()
                self.samples.append((now, tree_cpu_seconds(self.pid)))
                self.loop_samples.append((now, cpu_seconds(self.pid)))
            except (OSError, ValueError, IndexError):
                return  # the process is gone
            self._stop.wait(0.02)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def at(self, when: float) -> float:
        """CPU seconds at ``when`` (the last sample before it)."""
        before = [cpu for t, cpu in self.samples if t <= when]
        return before[-1] if before else 0.0

    def steady_ms(self, arrivals: list[float], loop_only: bool = False) -> float:
        """CPU ms per request between the 10th and the 90th percentile arrival (the client
        and its judging processes; ``loop_only``: the client process alone)."""
        n = len(arrivals)
        lo, hi = n // 10, (9 * n) // 10
        samples = self.loop_samples if loop_only else self.samples

        def at(when: float) -> float:
            before = [cpu for t, cpu in samples if t <= when]
            return before[-1] if before else 0.0

        return 1000 * (at(arrivals[hi]) - at(arrivals[lo])) / max(1, hi - lo)


def harness_cmd(url: str, out: Path, args: argparse.Namespace) -> list[str]:
    return [
        "taskset", "-c", CLIENT_CORE,
        sys.executable, "-m", "harness.cli", "run",
        "--endpoint", url,
        "--sessions", str(args.sessions),
        "--concurrency", str(args.concurrency),
        "--turns", str(args.turns),
        "--workers", "1",
        *(["--judges", args.judges] if args.judges else []),
        "--seed", "1",
        "--out", str(out),
    ]  # fmt: skip


def run_harness(args: argparse.Namespace, record: Path | None) -> dict[str, Any]:
    proc, url = start_endpoint(record, args.shape)
    out = Path(tempfile.mkdtemp(prefix="perf-workload-"))
    try:
        t0, c0 = time.monotonic(), children_cpu()
        done, sampler = run_sampled(harness_cmd(url, out / "run", args), judge_cores(args))
        t1, c1 = time.monotonic(), children_cpu()
        endpoint_cpu = cpu_seconds(proc.pid)
        if done.returncode != 0:
            raise SystemExit(f"harness run failed ({done.returncode}):\n{done.stderr[-3000:]}")
        arrivals = stats(url)["arrivals"]
        summary = json.loads((out / "run" / "summary.json").read_text())
        me = summary["variants"][0]["harness_self"][0]
    finally:
        stop(proc)
        shutil.rmtree(out, ignore_errors=True)
    return {
        "client": "harness",
        "loop_lag_p99_ms": (me.get("loop_lag_ms") or {}).get("p99"),
        "judge_wait_p50_ms": (me.get("judge_wait_ms") or {}).get("p50"),
        "requests": len(arrivals),
        "rate": steady_rate(arrivals),
        "to_first_request_s": arrivals[0] - t0,
        "after_last_request_s": t1 - arrivals[-1],
        "wall_s": t1 - t0,
        "client_cpu_ms": 1000 * (c1 - c0) / len(arrivals),
        "steady_cpu_ms": sampler.steady_ms(arrivals),
        "steady_loop_cpu_ms": sampler.steady_ms(arrivals, loop_only=True),
        "endpoint_cpu_ms": 1000 * endpoint_cpu / len(arrivals),
    }


def judge_cores(args: argparse.Namespace) -> set[int] | None:
    """``--judge-cores 2-5,7``: the cores the judging processes are moved to."""
    if not args.judge_cores:
        return None
    cores: set[int] = set()
    for part in args.judge_cores.split(","):
        lo, _, hi = part.partition("-")
        cores.update(range(int(lo), int(hi or lo) + 1))
    return cores


def run_bare(args: argparse.Namespace, bodies: Path) -> dict[str, Any]:
    proc, url = start_endpoint(shape=args.shape)
    try:
        cmd = ["taskset", "-c", CLIENT_CORE, sys.executable, __file__, "--replay", str(bodies)]
        cmd += ["--url", url, "--concurrency", str(args.concurrency)]
        c0 = children_cpu()
        done, sampler = run_sampled(cmd)
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
        "steady_cpu_ms": sampler.steady_ms(arrivals),
        "endpoint_cpu_ms": 1000 * endpoint_cpu / len(arrivals),
    }


def run_sampled(
    cmd: list[str], judges_on: set[int] | None = None
) -> tuple[subprocess.CompletedProcess[str], CpuSampler]:
    """Run ``cmd`` (``taskset`` execs the client: the same process), sampling its CPU."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    sampler = CpuSampler(proc.pid, judges_on)
    try:
        stdout, stderr = proc.communicate(timeout=1800)
    finally:
        sampler.stop()
        if proc.poll() is None:
            proc.kill()
    return subprocess.CompletedProcess(cmd, proc.returncode, stdout, stderr), sampler


def read_bodies(path: Path) -> list[bytes]:
    data = path.read_bytes()
    bodies, at = [], 0
    while at < len(data):
        size = int.from_bytes(data[at : at + 4], "big")
        bodies.append(data[at + 4 : at + 4 + size])
        at += 4 + size
    return bodies


#: the headers the harness's chat requests carry (``ChatClient``), without a key
BARE_HEADERS = {"content-type": "application/json", "accept-encoding": "identity"}


def bare_session(concurrency: int) -> Any:
    """The bare client's aiohttp session, with the harness's transport settings
    (``ChatClient``): the same pool size, no per-host limit, no compression asked nor
    decompressed, no proxy lookup, the same connect timeouts; no read timeout (the harness
    watches each stream with one timer, ``_ReadWatch``; the bare client has none, which only
    makes it faster). Made in the running loop."""
    import aiohttp

    from harness.client import DEFAULT_REQUEST_TIMEOUT, connections_for

    connector = aiohttp.TCPConnector(limit=connections_for(concurrency), limit_per_host=0)
    timeout = aiohttp.ClientTimeout(
        total=None,
        connect=DEFAULT_REQUEST_TIMEOUT,
        sock_connect=10.0,
        sock_read=None,
    )
    return aiohttp.ClientSession(
        connector=connector, timeout=timeout, auto_decompress=False, trust_env=False
    )


async def replay(url: str, bodies: list[bytes], concurrency: int) -> int:
    """Send every body in order, ``concurrency`` in flight, reading each answer to its end.

    Like with like: the harness's transport settings (``bare_session``), its headers and the
    same read path (``iter_any``); only what the harness does with the bytes is left out."""
    queue = iter(bodies)
    done = 0
    async with bare_session(concurrency) as session:

        async def one() -> None:
            nonlocal done
            for body in queue:
                async with session.post(
                    url + "/v1/chat/completions", data=body, headers=BARE_HEADERS
                ) as resp:
                    async for _ in resp.content.iter_any():
                        pass
                done += 1

        await asyncio.gather(*(one() for _ in range(concurrency)))
    return done


def table(rows: list[dict[str, Any]], args: argparse.Namespace, loads: tuple[float, float]) -> str:
    """The Markdown table: the endpoint's steady rate and each client's steady CPU per
    request, medians over the repeats; each ratio the harness's over the bare client's run
    just before it (median, range)."""
    bare = [r for r in rows if r["client"] == "bare"]
    ours = [r for r in rows if r["client"] == "harness"]
    pairs = list(zip(bare, ours, strict=True))
    rate = [h["rate"] / b["rate"] for b, h in pairs]
    cpu = [b["steady_cpu_ms"] / h["steady_cpu_ms"] for b, h in pairs]
    loop = [b["steady_cpu_ms"] / h["steady_loop_cpu_ms"] for b, h in pairs]

    def med(values: list[float]) -> float:
        return statistics.median(values)

    def span(values: list[float]) -> str:
        return f"**{med(values):.2f}** ({min(values):.2f}-{max(values):.2f})"

    return (
        f"| client (core {CLIENT_CORE}) | requests/s at the endpoint (core {ENDPOINT_CORE}) "
        f"| client CPU ms a request (steady state) |\n|---|---|---|\n"
        f"| bare aiohttp, same bodies | {med([r['rate'] for r in bare]):,.0f} "
        f"| {med([r['steady_cpu_ms'] for r in bare]):.2f} |\n"
        f"| `harness run --workers 1` | {med([r['rate'] for r in ours]):,.0f} "
        f"| {med([r['steady_cpu_ms'] for r in ours]):.2f} |\n"
        f"| harness / bare | {span(rate)} | bare / harness: {span(cpu)} |\n"
        f"| the harness's event-loop process alone | | "
        f"{med([r['steady_loop_cpu_ms'] for r in ours]):.2f} (bare / it: {span(loop)}) |\n"
        f"\nharness: {med([r['to_first_request_s'] for r in ours]):.2f} s from the command to "
        f"the first request, {med([r['after_last_request_s'] for r in ours]):.2f} s from the "
        f"last request to the exit ({args.sessions} sessions x {args.turns} turns, "
        f"{args.concurrency} in flight, answers {args.shape}, judges {args.judges or 'auto'}"
        f"{' on cores ' + args.judge_cores if args.judge_cores else ''}, "
        f"{len(pairs)} repeats; loop lag p99 "
        f"{med([r['loop_lag_p99_ms'] or 0 for r in ours]):.0f} ms; load average "
        f"{loads[0]:.1f} before, {loads[1]:.1f} after)"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sessions", type=int, default=500)
    ap.add_argument("--concurrency", type=int, default=500)
    ap.add_argument("--turns", type=int, default=12)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument(
        "--shape",
        choices=("raw", "parsed"),
        default="raw",
        help="raw: DSML in the content, the harness parses it; parsed: the server's tool_calls",
    )
    ap.add_argument("--judges", help="harness run --judges (default: its own, auto)")
    ap.add_argument(
        "--judge-cores",
        help="move the harness's judging processes to these cores (e.g. 2-5) as they start, "
        "so the client's core is the event loop's alone (needs more than two cores)",
    )
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
    load0 = os.getloadavg()[0]
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
                    f"client {row['steady_cpu_ms']:.2f} ms in the steady state "
                    f"({row['client_cpu_ms']:.2f} over the whole run), "
                    f"endpoint {row['endpoint_cpu_ms']:.2f} ms"
                    + (
                        f"; loop lag p99 {row['loop_lag_p99_ms']} ms, verdict wait p50 "
                        f"{row['judge_wait_p50_ms']} ms"
                        if row["client"] == "harness"
                        else ""
                    ),
                    file=sys.stderr,
                )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(table(rows, args, loads=(load0, os.getloadavg()[0])))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
