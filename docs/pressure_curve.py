"""Corruption against cache pressure and think time on the simulator (docs/img/pressure_curve.png).

For each pressure level, index-K precision and think time, start a simulator with a small KV
pool on a loopback port, drive scenarios/cache_pressure.toml (without its shared prompts and
forks) sized by the planner against it, and count the sessions the simulator corrupted, its
load-backs from the host tier and its evictions. Only the modelled pool corrupts here
(``calibrated_race=False``), its odds scaled by ``--fault-scale`` so a small run shows them.

Then the same-load runs (``same_load_runs``): a closed loop of ``--load`` sessions without
think time, against agents that think between turns, as many more sessions as keep about the
same number of requests in flight, each session growing the same way.

    python docs/pressure_curve.py --out docs/img/pressure_curve.png

Takes about twelve minutes on 2 cores; ``--quick`` for a smaller grid, ``--from-json
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

from harness.client.chat import ChatClient
from harness.drive.driver import DriveOptions, Progress, drive
from harness.drive.session import make_plans
from harness.record.turns import TurnWriter, read_turns
from harness.sim.app import create_app
from harness.sim.config import SimConfig
from harness.target.metrics import parse_prometheus
from harness.workload.scenario import load_scenario

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
    pressure: float | None,
    index_k: str,
    think: tuple[float, float],
    *,
    sessions: int,
    capacity: int,
    speed: float,
    seed: int,
    fault_scale: float,
    hicache: str = "on",
    max_context: int | None = None,
) -> dict[str, Any]:
    """Drive one configuration; the session corruption rate and the pool's counters.

    ``pressure`` sizes the sessions' growth with the planner; ``None`` keeps the scenario's
    growth up to ``max_context`` (the pressure is then what the sessions add up to).
    """
    # no shared prompts and no forks here: every session's context is its own, so the
    # pressure stated is the pool's distinct load
    if pressure is not None:
        scenario = load_scenario(SCENARIO).with_overrides(
            sessions=sessions, pressure=pressure, think_time_s=think, prefix_groups=0, branches=1
        )
    else:
        scenario = load_scenario().with_overrides(  # the default coding agent, no pressure plan
            sessions=sessions, steps=20, max_turns=30, start_context=3000,
            max_context=max_context, think_time_s=think,
        )  # fmt: skip
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
    inflight = [r["inflight"] for r in rows]
    latency = [r["latency_s"] for r in rows if r.get("latency_s") is not None]
    if pressure is None:  # what the sessions added up to: their peak live context
        pressure = sessions * max(r.get("prompt_tokens") or 0 for r in rows) / capacity
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
        "inflight_mean": sum(inflight) / max(len(inflight), 1),
        "latency_mean_s": sum(latency) / max(len(latency), 1),
    }


def _mean(rows: list[dict[str, Any]], key: str) -> float:
    return sum(r[key] for r in rows) / len(rows)


def plot(
    results: list[dict[str, Any]], path: Path, note: str = "", same_load: list[dict[str, Any]] = ()
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import PercentFormatter

    panels = 3 if same_load else 2
    fig, axes = plt.subplots(1, panels, figsize=(5.5 * panels, 4.5))
    ax, bx = axes[0], axes[1]
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
        at = {x: [r for r in rows if r["pressure"] == x] for x in xs}
        ax.plot(xs, [_mean(at[x], "session_rate") for x in xs], ls, color=color, marker="o",
                label=label)  # fmt: skip
        bx.plot(xs, [_mean(at[x], "loadbacks") / max(_mean(at[x], "turns"), 1) for x in xs], ls,
                color=color, marker="o", label=label)  # fmt: skip
    for a in (ax, bx):
        a.axvline(1.0, color="#888", lw=0.8)
        a.set_xlabel("pressure (peak live context / KV capacity)")
    ax.set_ylabel("sessions corrupted")
    bx.set_ylabel("turns that loaded their prefix back from host")
    ax.set_title("Same sessions, pressure planned")
    bx.set_title("Load-backs from the host tier")
    if same_load:
        cx = axes[2]
        for index_k, color in (("bf16", "#d1495b"), ("fp8", "#4c9f70")):
            rows = [r for r in same_load if r["index_k"] == index_k]
            ks = sorted({r["sessions"] for r in rows})
            at = {k: [r for r in rows if r["sessions"] == k] for k in ks}
            xs = [_mean(at[k], "think_mean_s") for k in ks]
            cx.plot(xs, [_mean(at[k], "session_rate") for k in ks], "-", color=color,
                    marker="o", label=index_k)  # fmt: skip
            if index_k == "bf16":
                for x, k in zip(xs, ks, strict=True):
                    cx.annotate(
                        f"{k} sessions\npressure {_mean(at[k], 'pressure'):.1f}\n"
                        f"{_mean(at[k], 'inflight_mean'):.0f} in flight",
                        (x, _mean(at[k], "session_rate")), textcoords="offset points",
                        xytext=(4, 6), fontsize=7,
                    )  # fmt: skip
        cx.set_ylim(top=max(0.05, max(r["session_rate"] for r in same_load) * 1.45))
        cx.set_xlabel("think time between turns, mean (s, simulator time)")
        cx.set_ylabel("sessions corrupted")
        cx.set_title("Same load: agents that think keep more context live")
        cx.legend(fontsize=8)
    for a in axes:
        a.yaxis.set_major_formatter(PercentFormatter(1.0))
        a.grid(alpha=0.3)
        a.set_ylim(bottom=0)  # keeps the top set above
    ax.legend(fontsize=8)
    title = "Simulator: the race needs cache pressure (modelled pool only)"
    fig.suptitle(title + (f"\n{note}" if note else ""), fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


async def same_load_runs(args: argparse.Namespace, seeds: int) -> list[dict[str, Any]]:
    """Agent sessions that think, against a closed loop at the same requests in flight.

    ``--load`` sessions without think time make the closed loop; agents run ``load x (1+k)``
    sessions that think ``k`` times the closed loop's mean turn latency (0.5k-1.5k), so about
    as many requests are in flight. Every session grows the same way (to ``--load-pressure``
    x capacity / load tokens), so the agents hold ``1+k`` times the closed loop's live context.
    """
    c = args.load
    max_context = int(args.load_pressure * args.capacity / c)
    out = []
    for index_k in ("bf16", "fp8"):
        for seed in range(seeds):
            latency = None
            for k in (0, 1, 2, 3):
                think = (0.0, 0.0)
                if k:
                    assert latency is not None
                    think = (0.5 * k * latency, 1.5 * k * latency)
                r = await one_run(
                    None, index_k, think, sessions=c * (1 + k), capacity=args.capacity,
                    speed=args.speed, seed=seed, fault_scale=args.fault_scale,
                    max_context=max_context,
                )  # fmt: skip
                if k == 0:
                    latency = r["latency_mean_s"]
                r["think_mean_s"] = sum(think) / 2
                out.append(r)
                print(json.dumps(r))  # noqa: T201 - a script
    return out


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
    p.add_argument("--load", type=int, default=12, help="requests in flight of the same-load runs")
    p.add_argument("--load-pressure", type=float, default=0.8,
                   help="the closed loop's pressure in the same-load runs")  # fmt: skip
    p.add_argument("--from-json", type=Path, help="redraw from the results of an earlier run")
    args = p.parse_args()
    seeds = 1 if args.quick else args.seeds
    note = (
        f"{args.capacity:,}-token GPU pool (host tier 2x), race odds x{args.fault_scale:g}, "
        f"mean of {seeds} seed(s). Left: {args.sessions} sessions, think time "
        f"{args.think[0]:g}-{args.think[1]:g} s. Right: a closed loop of {args.load} sessions "
        f"(pressure {args.load_pressure:g}) against agents growing alike"
    )
    if args.from_json:
        saved = json.loads(args.from_json.read_text())
        if isinstance(saved, list):  # a file from before the same-load runs
            saved = {"pressure": saved, "same_load": []}
        plot(saved["pressure"], args.out, note, saved["same_load"])
        return
    levels = [0.5, 1.5, 3.0] if args.quick else [0.5, 1.0, 1.5, 2.0, 3.0]
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
    same = await same_load_runs(args, seeds)
    saved = {"pressure": results, "same_load": same}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(saved, indent=1) + "\n")
    plot(results, args.out, note, same)
    print(f"wrote {args.out}")  # noqa: T201 - a script


if __name__ == "__main__":
    asyncio.run(main())
