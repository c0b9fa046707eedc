"""Corruption against cache pressure and think time on the simulator (docs/img/pressure_curve.png).

For each pressure level, index-K precision and think time, start a simulator with a small KV
pool on a loopback port, drive scenarios/cache_pressure.toml (without its shared prompts and
forks) sized by the planner against it, and count the sessions the simulator corrupted, its
load-backs from the host tier and its evictions. Only the modelled pool corrupts here
(``calibrated_race=False``), its odds scaled by ``--fault-scale`` so a small run shows them.

    python docs/pressure_curve.py --out docs/img/pressure_curve.png

Takes about seven minutes on 2 cores; ``--quick`` for a smaller grid, ``--from-json
docs/img/pressure_curve.json`` to redraw the figure from saved results.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import uvicorn

from harness.client import ChatClient
from harness.config import load_scenario
from harness.driver import DriveOptions, Progress, drive
from harness.metrics import parse_prometheus
from harness.records import TurnWriter, read_turns
from harness.session import make_plans
from harness.sim.app import create_app
from harness.sim.config import SimConfig

ROOT = Path(__file__).resolve().parent.parent
SCENARIO = ROOT / "scenarios" / "cache_pressure.toml"


class Sim:
    """A simulator in a thread on 127.0.0.1, port 0."""

    def __init__(self, config: SimConfig) -> None:
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(1024)
        app = create_app(config)
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
        self.thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True
        )

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.sock.getsockname()[1]}"

    def __enter__(self) -> Sim:
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started and time.monotonic() < deadline:
            time.sleep(0.01)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
        self.sock.close()


async def one_run(
    pressure: float,
    index_k: str,
    think: tuple[float, float],
    *,
    sessions: int,
    capacity: int,
    speed: float,
    seed: int,
    fault_scale: float,
    hicache: str = "on",
) -> dict[str, Any]:
    """Drive one configuration; the session corruption rate and the pool's counters."""
    # no shared prompts and no forks here: every session's context is its own, so the
    # pressure stated is the pool's distinct load
    scenario = load_scenario(SCENARIO).with_overrides(
        sessions=sessions, pressure=pressure, think_time_s=think, prefix_groups=0, branches=1
    )
    config = SimConfig(
        index_k=index_k,
        hicache=hicache,
        kv_capacity=capacity,
        speed=speed,
        seed=seed,
        calibrated_race=False,
        fault_scale=fault_scale,
    )
    with Sim(config) as sim, tempfile.TemporaryDirectory() as tmp:
        client = ChatClient(sim.url, model="m", request_timeout=60)
        base = {"run_id": "curve", "variant": "v", "factors": {}, "repeat": 0}
        try:
            with TurnWriter(Path(tmp) / "turns.jsonl") as writer:
                await drive(
                    client,
                    scenario,
                    make_plans(scenario, sessions, seed),
                    writer,
                    base,
                    DriveOptions(concurrency=sessions),
                    Progress(),
                )
        finally:
            await client.aclose()
        rows = read_turns(Path(tmp) / "turns.jsonl")
        async with httpx.AsyncClient(base_url=sim.url) as http:
            metrics = parse_prometheus((await http.get("/metrics")).text)
    bad = {r["session"] for r in rows if r.get("sim_injected") not in (None, "none")}
    prompt = sum(r.get("prompt_tokens") or 0 for r in rows)
    cached = sum(r.get("cached_tokens") or 0 for r in rows)
    return {
        "pressure": pressure,
        "index_k": index_k,
        "hicache": hicache,
        "think_s": list(think),
        "sessions": sessions,
        "corrupted_sessions": len(bad),
        "session_rate": len(bad) / sessions,
        "turns": len(rows),
        "max_prompt": max((r.get("prompt_tokens") or 0 for r in rows), default=0),
        "cached_share": cached / prompt if prompt else 0.0,
        "loadbacks": metrics.get("sim:hicache_loadbacks_total", 0.0),
        "loaded_tokens": metrics.get("sim:hicache_loaded_tokens_total", 0.0),
        "evicted_tokens": metrics.get("sim:kv_evicted_tokens_total", 0.0),
    }


def plot(results: list[dict[str, Any]], path: Path, note: str = "") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import PercentFormatter

    fig, (ax, bx) = plt.subplots(1, 2, figsize=(11, 4.5))
    styles = {
        ("bf16", True): ("#d1495b", "-", "bf16, think time"),
        ("bf16", False): ("#d1495b", "--", "bf16, no think time"),
        ("fp8", True): ("#4c9f70", "-", "fp8, think time"),
        ("fp8", False): ("#4c9f70", "--", "fp8, no think time"),
    }
    for (index_k, thinks), (color, ls, label) in styles.items():
        rows = [r for r in results if r["index_k"] == index_k and (r["think_s"][1] > 0) == thinks]
        if not rows:
            continue
        xs = sorted({r["pressure"] for r in rows})

        def mean(key: str, x: float, rows: list[dict[str, Any]] = rows) -> float:
            vals = [r[key] for r in rows if r["pressure"] == x]
            return sum(vals) / len(vals)

        ax.plot(xs, [mean("session_rate", x) for x in xs], ls, color=color, marker="o", label=label)
        bx.plot(xs, [mean("loadbacks", x) / max(mean("turns", x), 1) for x in xs], ls,
                color=color, marker="o", label=label)  # fmt: skip
    ax.axvline(1.0, color="#888", lw=0.8)
    bx.axvline(1.0, color="#888", lw=0.8)
    ax.yaxis.set_major_formatter(PercentFormatter(1.0))
    bx.yaxis.set_major_formatter(PercentFormatter(1.0))
    ax.set_xlabel("pressure (peak live context / KV capacity)")
    bx.set_xlabel("pressure (peak live context / KV capacity)")
    ax.set_ylabel("sessions corrupted")
    bx.set_ylabel("turns that loaded their prefix back from host")
    ax.set_title("Corrupted sessions (HiCache on)")
    bx.set_title("Load-backs from the host tier")
    for a in (ax, bx):
        a.grid(alpha=0.3)
        a.set_ylim(bottom=0)
    ax.legend(fontsize=8)
    title = "Simulator: the race needs cache pressure (modelled pool only)"
    fig.suptitle(title + (f"\n{note}" if note else ""), fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


async def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, default=ROOT / "docs" / "img" / "pressure_curve.png")
    p.add_argument("--quick", action="store_true", help="fewer levels and seeds")
    p.add_argument("--sessions", type=int, default=24)
    p.add_argument("--capacity", type=int, default=240_000)
    p.add_argument("--speed", type=float, default=20.0)
    p.add_argument("--fault-scale", type=float, default=20.0)
    p.add_argument("--seeds", type=int, default=2)
    p.add_argument("--think", type=float, nargs=2, default=[0.05, 0.25])
    p.add_argument("--from-json", type=Path, help="redraw from the results of an earlier run")
    args = p.parse_args()
    note = (
        f"{args.sessions} sessions, {args.capacity:,}-token GPU pool (host tier 2x), race odds "
        f"x{args.fault_scale:g}, think time {args.think[0]:g}-{args.think[1]:g} s; "
        f"mean of {args.seeds} seeds"
    )
    if args.from_json:
        plot(json.loads(args.from_json.read_text()), args.out, note)
        return
    levels = [0.5, 1.5, 3.0] if args.quick else [0.5, 1.0, 1.5, 2.0, 3.0]
    seeds = 1 if args.quick else args.seeds
    results = []
    for pressure in levels:
        for index_k in ("bf16", "fp8"):
            for think in ((0.0, 0.0), tuple(args.think)):
                for seed in range(seeds):
                    r = await one_run(
                        pressure,
                        index_k,
                        think,  # type: ignore[arg-type]
                        sessions=args.sessions,
                        capacity=args.capacity,
                        speed=args.speed,
                        seed=seed,
                        fault_scale=args.fault_scale,
                    )
                    results.append(r)
                    print(json.dumps(r))  # noqa: T201 - a script
    args.out.with_suffix(".json").write_text(json.dumps(results, indent=1) + "\n")
    plot(results, args.out, note)
    print(f"wrote {args.out}")  # noqa: T201 - a script


if __name__ == "__main__":
    asyncio.run(main())
