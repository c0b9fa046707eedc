"""One measured client run against the null endpoint; prints one JSON line.

    python benchmarks/perf_client.py --mode harness|raw --url URL --concurrency 80 \\
        --sessions 800 --turns 5 --context 2000 [--plain] [--memory] [--workers N]

``harness``: ``harness.drive.driver.drive()`` with the shipped scenario resized to the context, its
own ``ChatClient``, ``TurnWriter`` to a temporary folder: everything a run does per turn
(request body from the history, stream parsing, classification, the record, the tools).
With ``--workers N`` the same over N worker processes (``harness.pool.parent.drive_workers``),
this process the one writer of the records, as in ``harness run --workers N``.
``raw``: a minimal aiohttp client sending requests of the same size at the same concurrency,
reading the bytes and counting events, nothing more (the transport's upper bound).

Both build each session's first request inside the timed part. CPU is the process's
(``time.process_time``); peak memory is ``ru_maxrss``; each run is its own process so its
peak is its own. ``--memory`` adds a tracemalloc breakdown taken half-way (slower: the
turns/s of such a run are not comparable).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import resource
import sys
import tempfile
import time
import tracemalloc
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from harness.client.chat import ChatClient  # noqa: E402
from harness.drive import driver as driver_module  # noqa: E402
from harness.drive.driver import DriveHooks, DriveOptions, Progress, drive  # noqa: E402
from harness.drive.load import Load, Sinks  # noqa: E402
from harness.drive.permits import Permits  # noqa: E402
from harness.drive.session import SessionPlan, first_messages, make_plans  # noqa: E402
from harness.drive.trace_session import SessionSource  # noqa: E402
from harness.pool.parent import ClientSpec, WorkerPool, drive_workers  # noqa: E402
from harness.record.turns import TurnWriter  # noqa: E402
from harness.workload.scenario import Scenario, load_scenario  # noqa: E402

ROOT = str(Path(__file__).resolve().parent.parent) + "/"
BASE = {"run_id": "bench", "variant": "bench", "factors": {}, "repeat": 0}


def scenario_for(args: argparse.Namespace) -> Scenario:
    growth = max(800, args.context // 20)
    return load_scenario().with_overrides(
        sessions=args.sessions,
        steps=max(2, args.turns),
        max_turns=args.turns,
        start_context=args.context,
        max_context=args.context + growth,
    )


def rss_mb() -> float:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * resource.getpagesize() / 2**20


def memory_breakdown(snapshot: tracemalloc.Snapshot, top: int = 12) -> list[dict[str, Any]]:
    """Traced bytes grouped by the source file that allocated them, largest first."""
    by_file: Counter[str] = Counter()
    for stat in snapshot.statistics("filename"):
        name = stat.traceback[0].filename
        for marker in ("site-packages/", f"python{sys.version_info[0]}.{sys.version_info[1]}/"):
            if marker in name:
                name = name.split(marker, 1)[1]
                break
        name = name.removeprefix(ROOT)
        by_file[name] += stat.size
    lines = [
        {
            "line": f"{s.traceback[0].filename.rsplit('/', 2)[-1]}:{s.traceback[0].lineno}",
            "mb": round(s.size / 2**20, 2),
        }
        for s in snapshot.statistics("lineno")[:top]
    ]
    return [{"file": f, "mb": round(b / 2**20, 2)} for f, b in by_file.most_common(top)] + lines


class HalfWay:
    """Takes a tracemalloc snapshot once ``count()`` reaches half of ``total``."""

    def __init__(self, total: int, enabled: bool) -> None:
        self.half = max(1, total // 2)
        self.enabled = enabled
        self.n = 0
        self.result: dict[str, Any] | None = None

    def count(self) -> None:
        self.n += 1
        if self.enabled and self.n == self.half:
            current, peak = tracemalloc.get_traced_memory()
            self.result = {
                "traced_mb": round(current / 2**20, 2),
                "traced_peak_mb": round(peak / 2**20, 2),
                "rss_mb": round(rss_mb(), 1),
                "by_file": memory_breakdown(tracemalloc.take_snapshot()),
            }


async def run_harness(
    args: argparse.Namespace, scenario: Scenario, make_client: Callable[..., Any]
) -> dict[str, Any]:
    plans = make_plans(scenario, args.sessions, seed=7)
    client = make_client(
        args.url, model="bench", max_connections=args.concurrency + 8, request_timeout=120
    )
    progress = Progress()
    half = HalfWay(args.sessions * args.turns, args.memory)
    with tempfile.TemporaryDirectory() as tmp:
        writer = TurnWriter(Path(tmp) / "turns.jsonl")
        t0 = time.perf_counter()
        cpu0 = time.process_time()
        try:
            sessions = await drive(
                client,
                scenario,
                plans,
                writer,
                BASE,
                DriveOptions(
                    concurrency=args.concurrency, stream=not args.plain, judges=args.judges
                ),
                progress,
                DriveHooks(on_turn=lambda _rec: half.count()),
            )
        finally:
            wall = time.perf_counter() - t0
            cpu = time.process_time() - cpu0
            writer.close()
            await client.aclose()
        size = (Path(tmp) / "turns.jsonl").stat().st_size
    ended = Counter(s.ended for s in sessions)
    return {
        "turns": progress.turns,
        "wall_s": wall,
        "cpu_s": cpu,
        "errors": progress.transport_errors,
        "corrupted": progress.corrupted_turns,
        "ended": dict(ended),
        "records_mb": round(size / 2**20, 2),
        "harness_self": progress.harness_self,
        "memory": half.result,
    }


async def run_workers(args: argparse.Namespace, scenario: Scenario) -> dict[str, Any]:
    """The harness over ``args.workers`` processes (``drive_workers``). The processes start
    and import before the clock starts, as the raw client's imports do (``harness run``
    starts them while the server starts). CPU is the workers' own over their load plus the
    parent's; peak memory is the parent's plus each worker's."""
    plans = make_plans(scenario, args.sessions, seed=7)
    spec = ClientSpec(args.url, "bench", max_connections=args.concurrency + 8)
    pool = WorkerPool(args.workers)
    await pool.start()
    progress = Progress()
    with tempfile.TemporaryDirectory() as tmp:
        writer = TurnWriter(Path(tmp) / "turns.jsonl")
        t0 = time.perf_counter()
        try:
            options = DriveOptions(concurrency=args.concurrency, stream=not args.plain)
            load = Load(spec, scenario, tuple(plans), BASE, options, SessionSource(),
                        Permits(args.concurrency))  # fmt: skip
            ended = await drive_workers(pool, load, Sinks(writer, progress))
        finally:
            wall = time.perf_counter() - t0
            writer.close()
        size = (Path(tmp) / "turns.jsonl").stat().st_size
    me = progress.harness_self or {}
    return {
        "turns": progress.turns,
        "wall_s": wall,
        "cpu_s": me.get("cpu_s", 0.0),
        "errors": progress.transport_errors,
        "corrupted": progress.corrupted_turns,
        "ended": dict(Counter(ended.values())),
        "records_mb": round(size / 2**20, 2),
        "harness_self": me,
        "workers_rss_mb": me.get("peak_rss_mb", 0.0),
        "memory": None,
    }


async def run_raw(args: argparse.Namespace, scenario: Scenario) -> dict[str, Any]:
    plans = make_plans(scenario, args.sessions, seed=7)
    tools = scenario.openai_tools()
    limit = asyncio.Semaphore(args.concurrency)
    url = args.url.rstrip("/") + "/v1/chat/completions"
    stream = not args.plain
    counts = {"turns": 0, "events": 0, "errors": 0}
    half = HalfWay(args.sessions * args.turns, args.memory)
    # the harness's requests grow over a session: send the size of its middle turn
    mid = scenario_mid_context(scenario, args.turns)

    async def session(http: aiohttp.ClientSession, plan: SessionPlan) -> None:
        sized = SessionPlan(**{**plan.__dict__, "start_context": mid})
        body: dict[str, Any] = {
            "model": "bench",
            "messages": first_messages(scenario, sized),
            "tools": tools,
            "temperature": 0.0,
            "max_tokens": scenario.max_tokens,
            "seed": plan.seed,
            "stream": stream,
        }
        if stream:
            body["stream_options"] = {"include_usage": True}
        data = orjson.dumps(body)
        for _ in range(args.turns):
            async with limit:
                try:
                    async with http.post(url, data=data, headers=HEADERS) as resp:
                        if stream:
                            async for chunk in resp.content.iter_any():
                                counts["events"] += chunk.count(b"data:")
                        else:
                            await resp.read()
                except aiohttp.ClientError:
                    counts["errors"] += 1
            counts["turns"] += 1
            half.count()

    connector = aiohttp.TCPConnector(limit=args.concurrency + 8)
    t0 = time.perf_counter()
    cpu0 = time.process_time()
    async with aiohttp.ClientSession(connector=connector) as http:
        await asyncio.gather(*(session(http, p) for p in plans))
    return {
        "turns": counts["turns"],
        "wall_s": time.perf_counter() - t0,
        "cpu_s": time.process_time() - cpu0,
        "errors": counts["errors"],
        "memory": half.result,
    }


HEADERS = {"content-type": "application/json"}


def scenario_mid_context(scenario: Scenario, turns: int) -> int:
    plan = SessionPlan(
        0, 0, "", scenario.steps, turns, scenario.start_context, scenario.max_context
    )
    return plan.target_context(turns // 2)


async def endpoint_stats(url: str) -> dict[str, int]:
    async with aiohttp.ClientSession() as http, http.get(url.rstrip("/") + "/stats") as resp:
        return dict(await resp.json())


class GcClock:
    """Seconds spent in the cyclic garbage collector, and collections per generation."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.collections = [0, 0, 0]
        self._t = 0.0
        gc.callbacks.append(self._on)

    def _on(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._t = time.perf_counter()
        else:
            self.seconds += time.perf_counter() - self._t
            self.collections[info["generation"]] += 1


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    scenario = scenario_for(args)
    gc_clock = GcClock()
    if args.client.endswith("+gcoff"):  # drive() without its garbage-collector setting
        args.client = args.client.removesuffix("+gcoff")
        driver_module.GC_THRESHOLDS = (0, 0, 0)
        args.gcoff = True
    if args.memory:
        tracemalloc.start()
    before = await endpoint_stats(args.url)
    rss0 = rss_mb()
    if args.mode == "raw":
        result = await run_raw(args, scenario)
    elif args.workers > 1:
        result = await run_workers(args, scenario)
    else:
        result = await run_harness(args, scenario, client_factory(args.client))
    after = await endpoint_stats(args.url)
    requests = max(1, after["requests"] - before["requests"])
    result.update(
        mode=args.mode if args.mode == "raw" else f"harness/{args.client}",
        workers=args.workers if args.mode == "harness" else 1,
        gcoff=getattr(args, "gcoff", False),
        concurrency=args.concurrency,
        sessions=args.sessions,
        context=args.context,
        stream=not args.plain,
        requests=after["requests"] - before["requests"],
        req_kb=round((after["bytes_in"] - before["bytes_in"]) / requests / 1024, 1),
        events=after["events"] - before["events"],
        rss_start_mb=round(rss0, 1),
        peak_rss_mb=round(
            resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
            + result.get("workers_rss_mb", 0.0),
            1,
        ),
    )
    result["gc_s"] = round(gc_clock.seconds, 3)
    result["gc_collections"] = gc_clock.collections
    result["turns_per_s"] = result["turns"] / result["wall_s"]
    result["cpu_ms_per_turn"] = 1000 * result["cpu_s"] / max(1, result["turns"])
    result["events_per_s"] = result["events"] / result["wall_s"]
    return result


def client_factory(name: str) -> Callable[..., Any]:
    if name == "shipped":
        return ChatClient
    import client_variants

    return client_variants.VARIANTS[name]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mode", choices=("harness", "raw"), required=True)
    ap.add_argument(
        "--client",
        default="shipped",
        help="harness mode: ChatClient variant (shipped, rawlines, aiohttp); a '+gcoff' "
        "suffix runs drive() without raising the garbage collector's thresholds",
    )
    ap.add_argument("--url", required=True)
    ap.add_argument("--concurrency", type=int, required=True)
    ap.add_argument("--sessions", type=int, required=True)
    ap.add_argument("--turns", type=int, required=True, help="turns per session")
    ap.add_argument("--context", type=int, default=2000, help="tokens in the first request")
    ap.add_argument("--plain", action="store_true", help="non-streamed requests")
    ap.add_argument(
        "--workers", type=int, default=1, help="harness mode: worker processes (drive_workers)"
    )
    ap.add_argument("--memory", action="store_true", help="tracemalloc breakdown half-way")
    ap.add_argument(
        "--judges",
        type=int,
        default=None,
        help="harness mode: judging processes (default: one per usable core; 0: on the loop)",
    )
    args = ap.parse_args()
    print(json.dumps(asyncio.run(main_async(args))), flush=True)


if __name__ == "__main__":
    main()
