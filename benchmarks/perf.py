"""Harness vs a raw aiohttp client against a loopback endpoint that does no work.

    python benchmarks/perf.py                       # the standard cases, about 4 minutes
    python benchmarks/perf.py --quick               # fewer turns, one repeat
    python benchmarks/perf.py --clients shipped,aiohttp --markdown out.md
    python benchmarks/perf.py --workers 1,2         # the harness in 1 and in 2 processes
    python benchmarks/perf.py --workload            # `harness run` on the growing-context
                                                    # workload, pinned (perf_workload.py)

Starts ``null_endpoint.py`` as its own process, then runs each case in fresh client processes
(``perf_client.py``), alternating raw and harness runs ``--repeats`` times, so each run has
its own peak memory and both see the same machine state. Prints one table: turns/s, client
CPU ms per turn, events/s, peak RSS, request size, the endpoint's own CPU, and each harness
client's turns/s as a ratio of the raw client's run just before it (median over repeats, and
the range: on a shared machine one pair can catch a busy moment).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


@dataclass(frozen=True)
class Case:
    name: str
    concurrency: int
    sessions: int
    turns: int
    context: int
    stream: bool = True
    delay_ms: int = 0  # a paced endpoint: each answer after this long
    token_ms: int = 0  # a decoding endpoint: one event per write, this long apart


#: Runs of 3 s or more of the bare client, so start-up (building every session's first
#: prompt, opening the connections) weighs little against the steady state; 2,000 sessions
#: open 2,000 connections, and that is part of what the case measures.
CASES = [
    Case("80 x 2k", 80, 3200, 5, 2000),
    Case("500 x 2k", 500, 4000, 5, 2000),
    Case("2000 x 2k", 2000, 4000, 4, 2000),
    Case("80 x 80k", 80, 240, 30, 78000),
    Case("80 x 2k plain", 80, 3200, 5, 2000, stream=False),
    Case("80 x 2k paced 200ms", 80, 400, 5, 2000, delay_ms=200),
    Case("2000 x 2k paced 5s", 2000, 2000, 2, 2000, delay_ms=5000),
    Case("500 x 2k, a token per 20ms", 500, 1000, 2, 2000, token_ms=20),
]
QUICK = [
    Case("80 x 2k", 80, 240, 5, 2000),
    Case("500 x 2k", 500, 500, 4, 2000),
    Case("2000 x 2k", 2000, 2000, 2, 2000),
    Case("80 x 80k", 80, 80, 4, 78000),
]


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def start_endpoint(delay_ms: int, token_ms: int = 0) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        [
            sys.executable,
            str(HERE / "null_endpoint.py"),
            "--port",
            "0",
            "--delay-ms",
            str(delay_ms),
            "--token-ms",
            str(token_ms),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line.startswith("PORT "):
        proc.kill()
        raise SystemExit(f"endpoint did not start: {line!r}")
    return proc, f"http://127.0.0.1:{line.split()[1]}"


def run_client(
    url: str, case: Case, mode: str, client: str, endpoint: int, workers: int = 1
) -> dict[str, Any]:
    cmd = [
        sys.executable,
        str(HERE / "perf_client.py"),
        "--mode",
        mode,
        "--client",
        client,
        "--url",
        url,
        "--concurrency",
        str(case.concurrency),
        "--sessions",
        str(case.sessions),
        "--turns",
        str(case.turns),
        "--context",
        str(case.context),
        "--workers",
        str(workers),
    ]
    if not case.stream:
        cmd.append("--plain")
    cpu0 = cpu_seconds(endpoint)
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{mode}/{client} failed on {case.name}:\n{done.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    result["endpoint_cpu_ms_per_turn"] = (
        1000 * (cpu_seconds(endpoint) - cpu0) / max(1, result["requests"])
    )
    return result


def median(rows: list[dict[str, Any]], key: str) -> float:
    return statistics.median(float(r[key]) for r in rows)


def table(results: dict[tuple[str, str], list[dict[str, Any]]], cases: list[Case]) -> str:
    head = (
        "| case | client | turns/s | ratio | ratio per repeat | client CPU ms/turn | events/s "
        "| peak RSS MB | request KB | endpoint CPU ms/turn | loop lag p99 ms "
        "| send lag p99 ms |\n"
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n"
    )
    lines = []
    for case in cases:
        raw = results.get((case.name, "raw"))
        if not raw:
            continue
        for (name, client), rows in results.items():
            if name != case.name:
                continue
            tps = median(rows, "turns_per_s")
            # each repeat ran raw and this client back to back: their ratio, side by side
            pairs = [h["turns_per_s"] / r["turns_per_s"] for h, r in zip(rows, raw, strict=False)]
            many = len(pairs) > 1 and client != "raw"
            spread = f"{min(pairs):.2f}-{max(pairs):.2f}" if many else "-"
            lag = send = "-"
            me = [r["harness_self"] for r in rows if r.get("harness_self")]
            lags = [m["loop_lag_ms"]["p99"] for m in me if m.get("loop_lag_ms")]
            sends = [m["send_lag_ms"]["p99"] for m in me if m.get("send_lag_ms")]
            if lags:
                lag = f"{statistics.median(lags):.0f}"
            if sends:
                send = f"{statistics.median(sends):.1f}"
            label = "raw aiohttp (1 process)" if client == "raw" else f"harness ({client})"
            lines.append(
                f"| {case.name} | {label} | {tps:,.0f} | {statistics.median(pairs):.2f} | {spread} "
                f"| {median(rows, 'cpu_ms_per_turn'):.2f} | {median(rows, 'events_per_s'):,.0f} "
                f"| {max(r['peak_rss_mb'] for r in rows):.0f} | {median(rows, 'req_kb'):.1f} "
                f"| {median(rows, 'endpoint_cpu_ms_per_turn'):.2f} | {lag} | {send} |"
            )
    return head + "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", default="shipped", help="harness ChatClient variants, comma")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument(
        "--workers", default="1", help="harness worker processes to measure, comma (e.g. 1,2)"
    )
    ap.add_argument("--quick", action="store_true")
    ap.add_argument(
        "--cases",
        default="",
        help="only these cases, comma: a case's exact name, or else a part of names",
    )
    ap.add_argument("--json", type=Path, help="write every run's figures here")
    ap.add_argument("--markdown", type=Path, help="write the table here")
    ap.add_argument(
        "--workload",
        action="store_true",
        help="instead: `harness run` on the default growing-context workload against a bare "
        "client replaying its request bodies, endpoint and client pinned to their own cores "
        "(benchmarks/perf_workload.py, which takes the sizes)",
    )
    args = ap.parse_args()
    if args.workload:
        import perf_workload

        sys.argv = [str(HERE / "perf_workload.py"), "--repeats", str(args.repeats)]
        if args.json:
            sys.argv += ["--json", str(args.json)]
        perf_workload.main()
        return
    cases = QUICK if args.quick else CASES
    if args.cases:
        wanted = [w.strip() for w in args.cases.split(",")]
        names = {c.name for c in cases}
        cases = [c for c in cases if any(w == c.name or (w not in names and w in c.name)
                                         for w in wanted)]  # fmt: skip
    clients = [c for c in args.clients.split(",") if c]
    counts = [int(w) for w in args.workers.split(",") if w]
    runs = [("raw", "shipped", 1)] + [("harness", c, w) for c in clients for w in counts]
    repeats = 1 if args.quick else args.repeats
    # stopped by a signal: still stop the endpoints (the finally below)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    paces = sorted({(c.delay_ms, c.token_ms) for c in cases})
    endpoints = {pace: start_endpoint(*pace) for pace in paces}
    results: dict[tuple[str, str], list[dict[str, Any]]] = {}
    t0 = time.perf_counter()
    try:
        for case in cases:
            proc, url = endpoints[(case.delay_ms, case.token_ms)]
            for _ in range(repeats):
                for mode, client, workers in runs:
                    row = run_client(url, case, mode, client, proc.pid, workers)
                    name = client if workers == 1 else f"{client}, {workers} processes"
                    key = (case.name, "raw" if mode == "raw" else name)
                    results.setdefault(key, []).append(row)
                    print(
                        f"{case.name:>26} {key[1]:>20}: {row['turns_per_s']:8,.0f} turns/s "
                        f"{row['cpu_ms_per_turn']:5.2f} ms/turn {row['peak_rss_mb']:6.0f} MB",
                        file=sys.stderr,
                        flush=True,
                    )
    finally:
        for proc, _ in endpoints.values():
            proc.terminate()
            proc.wait(timeout=10)
    if args.json:
        rows = [dict(r, case=k[0], client=k[1]) for k, rs in results.items() for r in rs]
        args.json.write_text(json.dumps(rows, indent=1))
    out = table(results, cases)
    print(out)
    print(f"({time.perf_counter() - t0:.0f} s, {os.cpu_count()} cores)")
    if args.markdown:
        args.markdown.write_text(out)


if __name__ == "__main__":
    main()
