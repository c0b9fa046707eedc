"""One whole run: for each variant (and repeat), bring its server up, drive the sessions, stop it.

What a run leaves behind is written as it happens: ``turns.jsonl`` per turn,
``sessions.jsonl`` per finished session (what ``--resume`` skips), ``outcomes.json`` per
finished variant, ``transcripts.jsonl`` the exact requests of corrupted sessions (of all with
``keep_transcripts``). After a variant's load, with ``confirm`` its corrupted turns are re-sent
alone (``confirm.jsonl``) and with ``reference_sessions`` some sessions run again one at a time
(``reference.jsonl``), on the same server. A server that dies mid-run stops that variant
cleanly; the run goes on with the next one and the outcome says so.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import secrets
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from harness.analysis import sequential
from harness.client.chat import ChatClient
from harness.drive.driver import DriveOptions, Progress, drive
from harness.drive.rawmode import RawClient
from harness.drive.selfreport import save_row
from harness.drive.session import ACTIVE_TRANSCRIPTS, Session, SessionPlan, Shared, make_plans
from harness.drive.trace_session import sessions_for
from harness.errors import UsageError
from harness.pool.parent import (
    ClientSpec,
    SessionSource,
    WorkerError,
    WorkerPool,
    drive_workers,
    effective_workers,
)
from harness.record.transcripts import TRANSCRIPTS_FILE, TranscriptLog
from harness.record.turns import TURNS_FILE, TurnWriter
from harness.run.afterload import after_load, after_load_left
from harness.run.plan import run_order
from harness.run.serverprobe import Contact, first_contact, model_source
from harness.target.launch import Target, make_target
from harness.target.metrics import MetricsScraper, flush_cache, warm_up
from harness.target.readiness import EndpointTarget, watch
from harness.target.spec import TargetSpec
from harness.workload.matrix import Variant
from harness.workload.scenario import Scenario

log = logging.getLogger(__name__)

SESSIONS_FILE = "sessions.jsonl"
OUTCOMES_FILE = "outcomes.json"


@dataclass(frozen=True)
class RunOptions:
    scenario: Scenario
    variants: tuple[Variant, ...]
    out_dir: Path
    sessions: int
    concurrency: int
    target: TargetSpec | None = None  # None: --endpoint
    seed: int = 1
    repeats: int = 1
    order: str = "abab"
    stream: bool = True
    on_corruption: str = "retry"
    endpoint: str | None = None
    model: str | None = None  # None: the first model the server lists in /v1/models
    api_key: str | None = None
    request_timeout: float = 120.0
    run_timeout: float | None = None
    sim_args: tuple[str, ...] = ()
    metrics_interval: float = 5.0
    keep_transcripts: bool = False  # all sessions' transcripts, not only corrupted ones
    confirm: bool = False  # re-send every corrupted turn alone after the variant's load
    reference_sessions: int = 0  # sessions re-run one at a time after the variant's load
    workload: Path | None = None  # a trace (JSONL): its conversations are the sessions
    workload_mode: str = "replay"  # replay | continue (harness.drive.trace_session)
    pace: str = "recorded"  # recorded | fast
    api: str = "chat"  # chat | completions | generate (harness.drive.rawmode)
    max_sessions: int | None = None  # --until-significant: the budget per variant
    workers: int = 1  # processes driving each variant's sessions (harness.pool.parent)
    alpha: float = 0.05
    strict_variants: bool = False  # a variant its server does not confirm stops the run
    args: dict[str, Any] = field(default_factory=dict)  # the command line, for run.json

    def schedule(self) -> list[tuple[Variant, int]]:
        return run_order(list(self.variants), self.repeats, scheme=self.order)


def new_run_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(2)


def prepare_run_dir(path: Path) -> None:
    if path.exists() and any(path.iterdir()):
        raise UsageError(
            f"output folder {path} exists and is not empty; choose another --out "
            f"(or continue it with --resume {path})"
        )
    path.mkdir(parents=True, exist_ok=True)


def write_run_json(opts: RunOptions, run_id: str) -> None:
    meta = {
        "run_id": run_id,
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "scenario": opts.scenario.name,
        "scenario_source": opts.scenario.source,
        "target": str(opts.target.path) if opts.target else None,
        "sessions": opts.sessions,
        "concurrency": opts.concurrency,
        "workers": opts.workers,
        "seed": opts.seed,
        "repeats": opts.repeats,
        "stream": opts.stream,
        "endpoint": opts.endpoint,
        "model": opts.model,
        "model_source": model_source(opts.model, opts.args),
        "variants": [{"label": v.label, "factors": v.as_dict()} for v in opts.variants],
        "order": [{"variant": v.label, "repeat": r} for v, r in opts.schedule()],
        "args": opts.args,
        "python": sys.version.split()[0],
    }
    (opts.out_dir / "run.json").write_text(json.dumps(meta, indent=2) + "\n")


@dataclass
class VariantOutcome:
    label: str
    repeat: int
    sessions: int
    ended: dict[str, int]
    wall_s: float
    error: str | None = None


def finished_sessions(run_dir: Path) -> set[tuple[str, int, int]]:
    """(variant, repeat, session) of every session that ran to its end."""
    path = run_dir / SESSIONS_FILE
    done: set[tuple[str, int, int]] = set()
    if not path.exists():
        return done
    for line in path.read_text().splitlines():
        with contextlib.suppress(json.JSONDecodeError, KeyError):
            row = json.loads(line)
            done.add((row["variant"], row["repeat"], row["session"]))
    return done


def _target_for(opts: RunOptions, variant: Variant, repeat: int) -> Target:
    if opts.endpoint or opts.target is None:
        assert opts.endpoint is not None
        return EndpointTarget(opts.endpoint)
    extra = opts.sim_args if opts.target.name == "sim" else ()
    return make_target(opts.target, variant, opts.out_dir, extra_args=extra, repeat=repeat)


async def _run_variant(
    opts: RunOptions,
    run_id: str,
    variant: Variant,
    repeat: int,
    plans: list[SessionPlan],
    writer: TurnWriter,
    progress: Progress,
    announce: Callable[[str], None],
    make_session: Callable[[SessionPlan, Shared], Session] | None = None,
    reference: list[SessionPlan] | None = None,
) -> VariantOutcome:
    """Start the variant's server, drive ``plans``, then the after-load work (--confirm, and
    the ``reference`` sessions re-run alone), stop the server."""
    target = _target_for(opts, variant, repeat)
    name = variant.label + (f" (repeat {repeat + 1})" if opts.repeats > 1 else "")
    t0 = time.perf_counter()
    how = {"launch": "starting the server", "hook": "running the before hook"}
    where = target.describe()
    announce(f"{name}: {how.get(where.get('mode', ''), 'waiting for ' + str(where.get('url')))}")
    ended: dict[str, int] = {}
    error = None
    sessions_log = open(opts.out_dir / SESSIONS_FILE, "a")  # noqa: SIM115, ASYNC230 - closed below
    # worker processes start (and import) while the server starts
    workers = effective_workers(opts.workers, plans, opts.concurrency)
    pool = WorkerPool(workers) if workers > 1 else None
    starting = asyncio.create_task(pool.start()) if pool is not None else None
    try:
        base_url = await target.start()
        spec = opts.target
        flush = None
        if spec is not None and not opts.endpoint:
            if spec.flush_cache:
                flush = await flush_cache(base_url, api_key=opts.api_key)
                if not flush["ok"]:
                    announce(f"{name}: warning: the cache flush failed: {flush['message']}")
            if spec.warm_up:
                await warm_up(base_url, opts.model or spec.model, api_key=opts.api_key)
        facts = await first_contact(
            Contact(
                run_dir=opts.out_dir,
                variant=variant,
                repeat=repeat,
                base_url=base_url,
                described=target.describe(),
                rules=spec.rules_for(variant) if spec is not None and not opts.endpoint else {},
                model=opts.model,
                model_source=model_source(opts.model, opts.args),
                api_key=opts.api_key,
                api=opts.api,
                scenario=opts.scenario,
                flush=flush,
                strict=opts.strict_variants,
            ),
            announce,
        )
        model = facts["model"]
        announce(f"{name}: {len(plans)} sessions on {base_url}")
        client = ChatClient(
            base_url,
            model=model,
            api_key=opts.api_key,
            max_connections=max(opts.concurrency, 1) + 8,
            request_timeout=opts.request_timeout,
        )
        sessions_client: Any = client  # raw mode: the prompt rendered here, the output parsed here
        if opts.api != "chat":
            drop_bos = bool((facts.get("rendering") or {}).get("drop_bos"))
            sessions_client = RawClient(client, opts.api, opts.scenario.dialect, drop_bos)
        base = {
            "run_id": run_id,
            "variant": variant.label,
            "factors": variant.as_dict(),
            "repeat": repeat,
        }

        def session_done(index: int, why: str | None) -> None:
            ended[why or "?"] = ended.get(why or "?", 0) + 1
            row = {"variant": variant.label, "repeat": repeat, "session": index, "ended": why}
            sessions_log.write(json.dumps(row) + "\n")
            sessions_log.flush()

        transcripts = TranscriptLog(
            opts.out_dir / TRANSCRIPTS_FILE,
            base,
            model=model,
            stream=opts.stream,
            dialect=opts.scenario.dialect,
            keep_all=opts.keep_transcripts,
        )
        scrape = spec is None or spec.metrics
        try:
            async with (
                MetricsScraper(
                    base_url,
                    opts.out_dir,
                    variant=variant.label,
                    repeat=repeat,
                    interval_s=opts.metrics_interval,
                )
                if scrape
                else contextlib.nullcontext()
            ):
                options = DriveOptions(
                    concurrency=opts.concurrency,
                    stream=opts.stream,
                    on_corruption=opts.on_corruption,
                )
                if pool is None:
                    # the driver builds the sessions' Shared: it picks the log up from the context
                    token = ACTIVE_TRANSCRIPTS.set(transcripts)
                    load: asyncio.Task[Any] = asyncio.create_task(
                        drive(
                            sessions_client,
                            opts.scenario,
                            plans,
                            writer,
                            base,
                            options,
                            progress,
                            on_session_end=session_done,
                            make_session=make_session,
                        )
                    )
                    ACTIVE_TRANSCRIPTS.reset(token)
                else:
                    assert starting is not None
                    await starting
                    load = asyncio.create_task(
                        drive_workers(
                            pool,
                            ClientSpec(
                                base_url,
                                model,
                                opts.api_key,
                                opts.concurrency + 8,
                                opts.request_timeout,
                                opts.api,
                                getattr(sessions_client, "drop_bos", False),
                            ),  # fmt: skip
                            opts.scenario,
                            plans,
                            writer,
                            base,
                            options,
                            progress,
                            on_session_end=session_done,
                            source=SessionSource(
                                opts.workload, opts.workload_mode, opts.pace, opts.api, opts.seed
                            ),
                            transcripts=transcripts,
                        )
                    )
                watcher = asyncio.create_task(watch(target, load))
                try:
                    await load
                except asyncio.CancelledError:
                    error = await watcher
                    if error is None:
                        raise
                    announce(f"{name}: stopped: {error}")
                except WorkerError as exc:
                    error = str(exc)
                    announce(f"{name}: stopped: {error}")
                finally:
                    watcher.cancel()
                    if plans:  # (a resumed variant with only its after-load work left)
                        save_row(opts.out_dir, variant.label, repeat, progress.harness_self)
                alive = getattr(target, "alive", None)
                if error is None and alive is not None and not alive():
                    error = "the server process died during the run"
                    announce(f"{name}: {error}")
                if error is None:
                    chosen = plans[: opts.reference_sessions] if reference is None else reference
                    await after_load(opts, run_id, variant, repeat, chosen, client, base, announce)
        finally:
            transcripts.close()
            await client.aclose()
    finally:
        sessions_log.close()
        if pool is not None and starting is not None:
            with contextlib.suppress(Exception):
                await starting  # quick: the processes import on their own
            await pool.close()  # when the load never started (drive_workers closes it)
        await target.stop()
    wall = time.perf_counter() - t0
    announce(f"{name}: done in {wall:.0f}s")
    return VariantOutcome(variant.label, repeat, len(plans), ended, wall, error)


async def execute(
    opts: RunOptions,
    run_id: str,
    progress: Progress,
    announce: Callable[[str], None] = lambda _msg: None,
    skip: set[tuple[str, int, int]] | None = None,
) -> list[VariantOutcome]:
    """Run every variant in the planned order. Turns are on disk as they complete."""
    plans, make = sessions_for(
        opts.workload,
        opts.workload_mode,
        opts.pace,
        opts.api,
        opts.scenario,
        opts.seed,
        make_plans(opts.scenario, opts.sessions, opts.seed),
    )
    outcomes: list[VariantOutcome] = []
    skip = skip or set()

    def save() -> None:
        path = opts.out_dir / OUTCOMES_FILE
        path.write_text(json.dumps([asdict(o) for o in outcomes], indent=2) + "\n")

    rounds = [plans]
    if opts.max_sessions and opts.workload is None:
        # --until-significant: rounds of --sessions more sessions per variant, up to the budget
        looks = math.ceil(opts.max_sessions / opts.sessions)
        every = make_plans(opts.scenario, looks * opts.sessions, opts.seed)
        rounds = [every[i : i + opts.sessions] for i in range(0, len(every), opts.sessions)]
    with TurnWriter(opts.out_dir / TURNS_FILE) as writer:
        async with asyncio.timeout(opts.run_timeout):
            for look, round_plans in enumerate(rounds, 1):
                for variant, repeat in opts.schedule():
                    todo = [p for p in round_plans if (variant.label, repeat, p.index) not in skip]
                    reference, confirm_left = after_load_left(
                        opts, variant, repeat, round_plans, bool(skip)
                    )
                    if not todo and not reference and not confirm_left:
                        continue
                    outcomes.append(
                        await _run_variant(
                            opts,
                            run_id,
                            variant,
                            repeat,
                            todo,
                            writer,
                            progress,
                            announce,
                            make,
                            reference,
                        )  # fmt: skip
                    )
                    save()
                if len(rounds) > 1:
                    writer.sync()
                    decided, why = sequential.decision(
                        opts.out_dir / TURNS_FILE,
                        [v.label for v in opts.variants],
                        look=look,
                        looks=len(rounds),
                        alpha=opts.alpha,
                    )
                    announce(f"after {look * opts.sessions} sessions per variant: {why}")
                    if decided:
                        break
    return outcomes
