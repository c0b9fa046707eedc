"""One whole run: for each variant, bring its server up, drive the sessions, stop it."""

from __future__ import annotations

import contextlib
import json
import logging
import secrets
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from harness.client import ChatClient
from harness.config import Scenario
from harness.driver import DriveOptions, Progress, drive
from harness.errors import InfrastructureError, UsageError
from harness.matrix import Variant
from harness.records import TURNS_FILE, TurnWriter
from harness.session import make_plans
from harness.targets import EndpointTarget, SimTarget

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RunOptions:
    scenario: Scenario
    variants: tuple[Variant, ...]
    out_dir: Path
    sessions: int
    concurrency: int
    seed: int = 1
    stream: bool = True
    on_corruption: str = "retry"
    endpoint: str | None = None
    model: str = "deepseek-v4-flash"
    api_key: str | None = None
    request_timeout: float = 120.0
    sim_args: tuple[str, ...] = ()
    ready_timeout: float = 60.0
    args: dict[str, Any] = field(default_factory=dict)  # the command line, for run.json


def new_run_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(2)


def prepare_run_dir(path: Path) -> None:
    if path.exists() and any(path.iterdir()):
        raise UsageError(f"output folder {path} exists and is not empty; choose another --out")
    path.mkdir(parents=True, exist_ok=True)


def write_run_json(opts: RunOptions, run_id: str, extra: dict[str, Any] | None = None) -> None:
    meta = {
        "run_id": run_id,
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "scenario": opts.scenario.name,
        "scenario_source": opts.scenario.source,
        "sessions": opts.sessions,
        "concurrency": opts.concurrency,
        "seed": opts.seed,
        "stream": opts.stream,
        "endpoint": opts.endpoint,
        "model": opts.model,
        "variants": [{"label": v.label, "factors": v.as_dict()} for v in opts.variants],
        "args": opts.args,
        "python": sys.version.split()[0],
        **(extra or {}),
    }
    (opts.out_dir / "run.json").write_text(json.dumps(meta, indent=2) + "\n")


@dataclass
class VariantOutcome:
    label: str
    sessions: int
    ended: dict[str, int]
    wall_s: float
    error: str | None = None


async def execute(
    opts: RunOptions,
    run_id: str,
    progress: Progress,
    announce: Callable[[str], None] = lambda _msg: None,
) -> list[VariantOutcome]:
    """Run every variant in order. Returns what happened to each; turns are on disk."""
    plans = make_plans(opts.scenario, opts.sessions, opts.seed)
    outcomes: list[VariantOutcome] = []
    with TurnWriter(opts.out_dir / TURNS_FILE) as writer:
        for variant in opts.variants:
            target: EndpointTarget | SimTarget
            if opts.endpoint:
                target = EndpointTarget(opts.endpoint, ready_timeout_s=opts.ready_timeout)
            else:
                safe = variant.label.replace("=", "-").replace(",", "_")
                target = SimTarget(
                    variant,
                    log_path=opts.out_dir / "servers" / f"{safe}.log",
                    extra_args=list(opts.sim_args),
                    ready_timeout_s=opts.ready_timeout,
                )
            announce(f"variant {variant.label}: starting server")
            t0 = time.perf_counter()
            try:
                base_url = await target.start()
                announce(f"variant {variant.label}: {len(plans)} sessions on {base_url}")
                client = ChatClient(
                    base_url,
                    model=opts.model,
                    api_key=opts.api_key,
                    max_connections=max(opts.concurrency, 1) + 8,
                    request_timeout=opts.request_timeout,
                )
                try:
                    base = {
                        "run_id": run_id,
                        "variant": variant.label,
                        "factors": variant.as_dict(),
                        "repeat": 0,
                    }
                    sessions = await drive(
                        client,
                        opts.scenario,
                        plans,
                        writer,
                        base,
                        DriveOptions(
                            concurrency=opts.concurrency,
                            stream=opts.stream,
                            on_corruption=opts.on_corruption,
                        ),
                        progress,
                    )
                finally:
                    await client.aclose()
            except InfrastructureError as exc:
                outcomes.append(
                    VariantOutcome(variant.label, 0, {}, time.perf_counter() - t0, str(exc))
                )
                raise
            finally:
                with contextlib.suppress(Exception):
                    await target.stop()
            ended: dict[str, int] = {}
            for s in sessions:
                ended[s.ended or "?"] = ended.get(s.ended or "?", 0) + 1
            outcomes.append(
                VariantOutcome(variant.label, len(sessions), ended, time.perf_counter() - t0)
            )
            announce(f"variant {variant.label}: done in {time.perf_counter() - t0:.0f}s")
    (opts.out_dir / "outcomes.json").write_text(
        json.dumps([asdict(o) for o in outcomes], indent=2) + "\n"
    )
    return outcomes
