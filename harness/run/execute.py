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
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from harness import __version__
from harness.analysis import judge, sequential, variantcheck
from harness.client import connections_for
from harness.client.chat import ChatClient
from harness.client.spec import ClientSpec
from harness.drive import judging
from harness.drive.driver import DriveOptions, Progress, drive
from harness.drive.selfreport import save_row
from harness.drive.session import Session, SessionPlan, Shared, make_plans
from harness.drive.trace_session import sessions_for
from harness.errors import EXIT_INFRA, EndpointRefused, HarnessError, ServerUnanswering
from harness.pool.cluster import ClusterPool
from harness.pool.parent import (
    SessionSource,
    WorkerError,
    WorkerPool,
    drive_workers,
    effective_workers,
)
from harness.record.rundir import (
    OUTCOMES_FILE,
    SESSIONS_FILE,
    TARGET_COPY,
    TRANSCRIPTS_FILE,
    TURNS_FILE,
    RunDir,
)
from harness.record.transcripts import TranscriptLog
from harness.record.turns import JsonlAppender, TurnWriter
from harness.run.afterload import after_load, after_load_left
from harness.run.canary_runner import Canary, open_canary
from harness.run.options import RunOptions
from harness.run.oracle_alarms import LogWatch
from harness.run.oracle_replay import exactness
from harness.run.plan import round_orders
from harness.run.serverprobe import Contact, first_contact, model_source
from harness.run.shard import (
    plan_id,
    server_clock_offset,
    shard_concurrency,
    slice_plans,
    wait_until,
)
from harness.target.launch import Target, make_target
from harness.target.metrics import MetricsScraper, flush_cache, warm_up
from harness.target.readiness import EndpointTarget, died_message, server_version, watch
from harness.workload.dialect import DialectChoice, choose, model_names
from harness.workload.matrix import Variant

log = logging.getLogger(__name__)


def new_run_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(2)


def write_run_json(opts: RunOptions, run_id: str) -> None:
    meta = {
        "run_id": run_id,
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "scenario": opts.scenario.name,
        "temperature": opts.scenario.temperature,  # greedy: variants' answers compare
        "scenario_source": opts.scenario.source,
        "target": str(opts.target.path) if opts.target else None,
        "target_copy": TARGET_COPY if opts.target else None,
        "sessions": opts.sessions,
        "concurrency": opts.concurrency,
        "workers": opts.workers,
        "seed": opts.seed,
        "repeats": opts.repeats,
        "stream": opts.stream,
        "endpoint": opts.endpoint,
        "model": opts.model,
        "dialect": opts.scenario.dialect,
        "dialects": {},  # per variant, once its server answers (record_dialect)
        "model_source": model_source(opts.model, opts.args),
        "variants": [{"label": v.label, "factors": v.as_dict()} for v in opts.variants],
        "order": [{"variant": v.label, "repeat": r} for v, r in opts.schedule()],
        "args": opts.args,
        "command": opts.command,
        "harness_version": __version__,
        "python": sys.version.split()[0],
        "plan_id": plan_id(opts),
        "shard": opts.shard.to_dict() if opts.shard is not None else None,
        # the simulator's own flags (seed, speed, the demo's --fault-scale): a replay
        # launches it exactly as the run did
        "sim_args": list(opts.sim_args) if opts.target and opts.target.name == "sim" else None,
    }
    RunDir(opts.out_dir).write_meta(meta, opts.target.path if opts.target else None)


def finish_run_json(out_dir: Path, started: float) -> None:
    """Note in run.json when the run ended and how long its load took (also when stopped)."""
    run_dir = RunDir(out_dir)
    with contextlib.suppress(OSError, ValueError, HarnessError):
        meta = run_dir.read_meta()
        meta["finished_at"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        meta["duration_s"] = round(meta.get("duration_s", 0.0) + time.monotonic() - started, 1)
        run_dir.write_meta(meta)


@contextlib.contextmanager
def _finally(action: Callable[[], None]) -> Iterator[None]:
    try:
        yield
    finally:
        action()


def record_dialect(opts: RunOptions, variant: str, choice: DialectChoice) -> None:
    """Add the variant's dialect to run.json (written at the start, before any server)."""
    run_dir = RunDir(opts.out_dir)
    if not run_dir.run_file.exists():
        return
    meta = run_dir.read_meta()
    dialects = meta.get("dialects")
    dialects = dialects if isinstance(dialects, dict) else {}
    run_dir.write_meta({**meta, "dialects": {**dialects, variant: choice.to_dict()}})


@dataclass
class VariantOutcome:
    label: str
    repeat: int
    sessions: int
    ended: dict[str, int]
    wall_s: float
    error: str | None = None
    exit_code: int = 0  # 3: the server died or stopped answering; 2: it refused the requests
    stop_run: bool = False  # every variant would be refused the same: the run ends
    server_version: str | None = None  # what the server said of itself, when it did
    model: str | None = None  # the model the requests named
    #: the server died under the load: exit code or signal, seconds in, turns done, last
    #: lines of its log (LaunchTarget.death); None when it did not (or is not ours to see)
    server_death: dict[str, Any] | None = None


def _target_for(opts: RunOptions, variant: Variant, repeat: int) -> Target:
    if opts.endpoint or opts.target is None:
        assert opts.endpoint is not None
        return EndpointTarget(opts.endpoint, api_key=opts.api_key)
    extra = opts.sim_args if opts.target.name == "sim" else ()
    return make_target(opts.target, variant, opts.out_dir, extra_args=extra, repeat=repeat)


@dataclass
class _VariantRun:
    """One variant (one repeat) of the run, in its steps: server up, client, load, after-load,
    server down."""

    opts: RunOptions
    run_id: str
    variant: Variant
    repeat: int
    plans: list[SessionPlan]
    writer: TurnWriter
    progress: Progress
    announce: Callable[[str], None]
    make_session: Callable[[SessionPlan, Shared], Session] | None = None
    reference: list[SessionPlan] | None = None
    #: the server, made by the caller; ``started``: kept up from the block before (already
    #: started); ``keep``: leave it up for the next block when this one ends without error
    target: Target | None = None
    started: bool = False
    keep: bool = False
    clock: dict[str, Any] | None = None  # a shard's clock.json, the server's offset to add
    ended: dict[str, int] = field(default_factory=dict)
    code: int = 0
    death: dict[str, Any] | None = None  # the server died under the load (_death)
    stop_run: bool = False
    dialect_from: str | None = None  # where the variant's dialect came from, once decided
    #: --oracle kv_canary: the server log's canary lines during the load (run.oracle_alarms)
    log_lines: list[tuple[float, float, str]] | None = None

    @property
    def name(self) -> str:
        return self.variant.label + (
            f" (repeat {self.repeat + 1})" if self.opts.repeats > 1 else ""
        )

    @property
    def base(self) -> dict[str, Any]:
        """The fields every record of this variant carries."""
        base = {
            "run_id": self.run_id,
            "variant": self.variant.label,
            "factors": self.variant.as_dict(),
            "repeat": self.repeat,
        }
        if self.dialect_from is not None:
            base.update(dialect_from=self.dialect_from, workload=self.opts.scenario.workload)
        return base

    async def run(self) -> VariantOutcome:
        """Start the variant's server, drive ``plans``, then the after-load work (--confirm,
        and the ``reference`` sessions re-run alone), stop the server (unless ``keep``)."""
        opts = self.opts
        held = self.started and self.target is not None
        target = self.target or _target_for(opts, self.variant, self.repeat)
        t0 = time.perf_counter()
        how = {"launch": "starting the server", "hook": "running the before hook"}
        where = target.describe()
        first = how.get(where.get("mode", ""), "waiting for " + str(where.get("url")))
        self.announce(f"{self.name}: " + ("the server stays up" if held else first))
        error = None
        completed = False
        version: str | None = None
        model: str | None = opts.model
        self._sessions_log = JsonlAppender(opts.out_dir / SESSIONS_FILE)  # closed below
        # worker processes start (and import) while the server starts
        pool: WorkerPool | None = None
        if opts.cluster is not None:  # as many as the cluster has CPUs, up to what can run
            most = effective_workers(len(self.plans), self.plans, opts.concurrency)
            pool = ClusterPool(opts.cluster or None, most) if self.plans else None
        elif (workers := effective_workers(opts.workers, self.plans, opts.concurrency)) > 1:
            pool = WorkerPool(workers)
        starting = asyncio.create_task(pool.start()) if pool is not None else None
        if pool is None:  # the judging processes start (and warm up) while the server starts
            judging.shared(opts.judges)
        try:
            facts: dict[str, Any] | None = None
            if held:
                base_url = str(getattr(target, "base_url", ""))
                key = (self.variant.label, self.repeat)
                rows = variantcheck.load(opts.out_dir)
                mine = [r for r in rows if (r["variant"], r["repeat"]) == key]
                facts = mine[-1] if mine else None
            else:
                base_url = await target.start()
                if self.clock is not None and self.clock.get("server_offset_s") is None:
                    offset = await server_clock_offset(base_url, opts.api_key)
                    self.clock["server_offset_s"] = offset
                    RunDir(opts.out_dir).clock.write_text(json.dumps(self.clock, indent=2) + "\n")
            if facts is None:  # the first contact with this server
                flush = await self._prepare_server(base_url) if not held else None
                facts = await first_contact(self._contact(target, base_url, flush), self.announce)
            model = str(facts["model"])
            self.announce(f"{self.name}: {len(self.plans)} sessions on {base_url}")
            version = await server_version(base_url, opts.api_key)
            opts = await self._decide_dialect(base_url, model)
            if "replay" in opts.oracles and not opts.canary and self.plans:
                exact, why = exactness(facts.get("config") or {}, bool(
                    opts.target is not None and opts.target.deterministic))  # fmt: skip
                if not exact:  # the replay compares scores here: the canary's KL
                    self.announce(f"{self.name}: replay not exact ({why}): canary on")
                    opts = replace(opts, canary=True)
            client_spec = ClientSpec(
                base_url,
                model,
                opts.api_key,
                connections_for(max(opts.concurrency, 1)),
                opts.request_timeout,
                opts.api,
                opts.limits,
                bool((facts.get("rendering") or {}).get("drop_bos")),
            )
            client = client_spec.chat_client()
            # raw mode: the prompt rendered here, the output parsed here
            sessions_client = client_spec.sessions_client(client, opts.scenario.dialect)
            base = self.base
            transcripts = TranscriptLog(
                opts.out_dir / TRANSCRIPTS_FILE,
                base,
                model=model,
                stream=opts.stream,
                dialect=opts.scenario.dialect,
                # the judge's sample of passed turns needs their conversations
                keep_all=opts.keep_transcripts
                or (opts.confirm and opts.judge_sample > 0)
                or "replay" in opts.oracles  # the replay oracle re-sends every session's sends
                or opts.scenario.passkeys  # every session's answer to the passkey ask
                or "spec_accept" in opts.oracles,  # every send's meta_info
            )
            canary: Canary | None = None
            try:
                async with self._metrics(base_url):
                    if opts.canary and self.plans:
                        canary = await open_canary(
                            opts, base_url, model, base,
                            lambda: self.progress.last_inflight, self.announce,
                        )  # fmt: skip
                    watch = log_watch(opts, target)  # --oracle kv_canary: the server's log
                    load = await self._start_load(
                        client_spec, sessions_client, base, transcripts, pool, starting
                    )
                    if canary is not None:
                        canary.start()
                    error = await self._wait(target, load)
                    if watch is not None:
                        self.log_lines = await watch.stop()
                    if canary is not None:
                        await canary.stop()
                    alive = getattr(target, "alive", None)
                    if error is None and alive is not None and not alive():
                        error = died_message(getattr(target, "death", lambda: None)())
                        self.announce(f"{self.name}: {error}")
                    self.death = self._death(target, error)
                    if error is not None and not self.code:
                        self.code = EXIT_INFRA
                    if error is None:
                        if canary is not None:
                            await canary.after()
                        await self._after_load(client, base)
            finally:
                if canary is not None:
                    await canary.aclose()
                transcripts.close()
                await client.aclose()
            completed = True
        finally:
            self._sessions_log.close()
            if pool is not None and starting is not None:
                with contextlib.suppress(Exception):
                    await starting  # quick: the processes import on their own
                await pool.close()  # when the load never started (drive_workers closes it)
            if not (self.keep and completed and error is None):
                await target.stop()
        wall = time.perf_counter() - t0
        self.announce(f"{self.name}: done in {wall:.0f}s")
        return VariantOutcome(
            self.variant.label, self.repeat, len(self.plans), self.ended, wall, error, self.code,
            self.stop_run, version, model, self.death,
        )  # fmt: skip

    def _death(self, target: Target, error: str | None) -> dict[str, Any] | None:
        """The finding of a server that died under the load: how (its exit code or signal),
        when (seconds into the load, turns done) and what it said last (its log)."""
        death = getattr(target, "death", lambda: None)()
        if error is None or death is None:
            return None
        counts = self.progress.variants.get(self.variant.label)
        started = counts.started if counts is not None else None
        return {
            **death,
            "variant": self.variant.label,
            "repeat": self.repeat,
            "after_s": round(time.monotonic() - started, 1) if started is not None else None,
            "turns_done": counts.turns if counts is not None else None,
        }

    async def _decide_dialect(self, base_url: str, model: str) -> RunOptions:
        """The variant's dialect, from the option, the scenario or the served model's name
        (harness.workload.dialect); announced, in run.json, and the one its sessions use."""
        opts = self.opts
        names = await model_names(base_url, model, opts.api_key)
        choice = choose(opts.scenario.dialect, names, from_option=opts.dialect_from_option)
        if names[0] != model:  # both said: the name the requests carry, what is served
            self.announce(
                f"{self.name}: the server does not list {model} (the requests' model); it "
                f"serves {names[0]}: the dialect follows what it serves"
            )
        self.announce(f"{self.name}: dialect {choice.describe()}")
        record_dialect(opts, self.variant.label, choice)
        self.dialect_from = choice.source
        self.opts = replace(opts, scenario=replace(opts.scenario, dialect=choice.name))
        return self.opts

    async def _prepare_server(self, base_url: str) -> dict[str, Any] | None:
        """A launched server's cache flush and warm-up, when its target file asks; the
        flush's outcome (a failure is a warning: the repeats may not start alike)."""
        spec, opts = self.opts.target, self.opts
        flush = None
        if spec is not None and not opts.endpoint:
            if spec.flush_cache:
                flush = await flush_cache(base_url, api_key=opts.api_key)
                if not flush["ok"]:
                    self.announce(f"{self.name}: warning: the cache flush failed: "
                                  f"{flush['message']}")  # fmt: skip
            if spec.warm_up:
                await warm_up(base_url, opts.model or spec.model, api_key=opts.api_key)
        return flush

    def _contact(self, target: Target, base_url: str, flush: dict[str, Any] | None) -> Contact:
        opts, spec = self.opts, self.opts.target
        return Contact(
            run_dir=opts.out_dir,
            variant=self.variant,
            repeat=self.repeat,
            base_url=base_url,
            described=target.describe(),
            rules=spec.rules_for(self.variant) if spec is not None and not opts.endpoint else {},
            model=opts.model,
            model_source=model_source(opts.model, opts.args),
            api_key=opts.api_key,
            api=opts.api,
            scenario=opts.scenario,
            flush=flush,
            strict=opts.strict_variants,
        )

    def _metrics(self, base_url: str) -> contextlib.AbstractAsyncContextManager[Any]:
        spec = self.opts.target
        if spec is not None and not spec.metrics:
            return contextlib.nullcontext()
        return MetricsScraper(
            base_url,
            self.opts.out_dir,
            variant=self.variant.label,
            repeat=self.repeat,
            interval_s=self.opts.metrics_interval,
        )

    def _session_done(self, index: int, why: str | None) -> None:
        self.ended[why or "?"] = self.ended.get(why or "?", 0) + 1
        row = {"variant": self.variant.label, "repeat": self.repeat, "session": index, "ended": why}
        self._sessions_log.append(json.dumps(row).encode() + b"\n")

    async def _start_load(
        self,
        client_spec: ClientSpec,
        sessions_client: Any,
        base: dict[str, Any],
        transcripts: TranscriptLog,
        pool: WorkerPool | None,
        starting: asyncio.Task[None] | None,
    ) -> asyncio.Task[Any]:
        """The task driving every session: on this event loop, or over the worker pool."""
        opts = self.opts
        options = DriveOptions(
            concurrency=opts.concurrency,
            stream=opts.stream,
            on_corruption=opts.on_corruption,
            # a trace sent at its recorded pace idles between turns
            hold_slots=opts.workload is None or opts.pace != "recorded",
            judges=opts.judges,
        )
        self.progress.begin(self.variant.label, self.repeat, self.plans)
        if pool is None:
            return asyncio.create_task(
                drive(
                    sessions_client,
                    opts.scenario,
                    self.plans,
                    self.writer,
                    base,
                    options,
                    self.progress,
                    on_session_end=self._session_done,
                    make_session=self.make_session,
                    transcripts=transcripts,
                )
            )
        assert starting is not None
        await starting
        return asyncio.create_task(
            drive_workers(
                pool,
                replace(client_spec, max_connections=connections_for(opts.concurrency)),
                opts.scenario,
                self.plans,
                self.writer,
                base,
                options,
                self.progress,
                on_session_end=self._session_done,
                source=SessionSource(
                    opts.workload, opts.workload_mode, opts.pace, opts.api, opts.seed
                ),
                transcripts=transcripts,
            )
        )

    async def _wait(self, target: Target, load: asyncio.Task[Any]) -> str | None:
        """Wait for the load while watching the server; why it stopped early (None: it ran to
        its end)."""
        error = None
        watcher = asyncio.create_task(watch(target, load))
        try:
            await load
        except asyncio.CancelledError:
            error = await watcher
            if error is None:
                raise
            self.announce(f"{self.name}: stopped: {error}")
        except (WorkerError, EndpointRefused, ServerUnanswering) as exc:
            # a worker died, the endpoint refuses the requests, or the server stopped
            # answering: this variant ends here, the run goes on (a refusal every variant
            # would get ends the run: ``stop_run``)
            error, self.code = str(exc), exc.exit_code
            self.stop_run = bool(getattr(exc, "whole_run", False))
            refused = isinstance(exc, EndpointRefused)  # (said at the end, once)
            self.announce(f"{self.name}: stopped" + ("" if refused else f": {error}"))
        finally:
            self.progress.end()
            watcher.cancel()
            if self.plans:  # (a resumed variant with only its after-load work left)
                save_row(
                    self.opts.out_dir, self.variant.label, self.repeat, self.progress.harness_self
                )
        return error

    async def _after_load(self, client: ChatClient, base: dict[str, Any]) -> None:
        opts = self.opts
        chosen = self.plans[: opts.reference_sessions] if self.reference is None else self.reference
        await after_load(
            opts, self.run_id, self.variant, self.repeat, chosen, client, base, self.announce,
            log_lines=self.log_lines,
        )  # fmt: skip


def log_watch(opts: RunOptions, target: Target) -> LogWatch | None:
    """--oracle kv_canary: a watch on the server's log (--server-log, or a launched one's)."""
    if "kv_canary" not in opts.oracles:
        return None
    path = opts.server_log or getattr(target, "log_path", None)
    if path is None:
        log.warning("--oracle kv_canary: no server log to read for this variant")
        return None
    watch = LogWatch(Path(path))
    watch.start()
    return watch


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
    clock = None
    if (shard := opts.shard) is not None:
        # this host's slice of the plan, with its share of the concurrency
        opts = replace(opts, concurrency=shard_concurrency(opts.concurrency, plans, shard))
        plans = slice_plans(plans, shard)
        announce(f"shard {shard.label}: {len(plans)} sessions a variant, "
                 f"{opts.concurrency} in flight")  # fmt: skip
        late = await wait_until(opts.start_at, announce) if opts.start_at is not None else None
        clock = {
            "shard": shard.to_dict(),
            "start_unix": time.time(),
            "start_at": opts.start_at,
            "late_s": None if late is None else round(late, 3),
            "server_offset_s": None,
        }
        RunDir(opts.out_dir).clock.write_text(json.dumps(clock, indent=2) + "\n")

    def save() -> None:
        path = opts.out_dir / OUTCOMES_FILE
        path.write_text(json.dumps([asdict(o) for o in outcomes], indent=2) + "\n")

    rounds = [plans]
    if opts.max_sessions and opts.workload is None:
        # --until-significant: rounds of --sessions more sessions per variant, up to the budget
        looks = math.ceil(opts.max_sessions / opts.sessions)
        every = make_plans(opts.scenario, looks * opts.sessions, opts.seed)
        rounds = [every[i : i + opts.sessions] for i in range(0, len(every), opts.sessions)]
    for variant, repeat in opts.schedule():  # what the progress display shows to come
        todo = [p for p in rounds[0] if (variant.label, repeat, p.index) not in skip]
        progress.expect(variant.label, todo, repeat)
    held: tuple[Variant, int, Target] | None = None  # a server kept up between two rounds
    load_began = time.monotonic()
    try:
        with (
            TurnWriter(opts.out_dir / TURNS_FILE) as writer,
            _finally(lambda: finish_run_json(opts.out_dir, load_began)),
        ):
            async with asyncio.timeout(opts.run_timeout):
                for look, order in enumerate(round_orders(opts.schedule(), len(rounds)), 1):
                    round_plans = rounds[look - 1]
                    for i, (variant, repeat) in enumerate(order):
                        todo = [
                            p for p in round_plans if (variant.label, repeat, p.index) not in skip
                        ]
                        reference, confirm_left = after_load_left(
                            opts, variant, repeat, round_plans, bool(skip)
                        )
                        if not todo and not reference and not confirm_left:
                            continue
                        started = held is not None and held[:2] == (variant, repeat)
                        if held is not None and not started:
                            await held[2].stop()
                        target = held[2] if held is not None and started else None
                        target = target or _target_for(opts, variant, repeat)
                        held = None
                        # the last block of a round starts the next one: its server stays up
                        keep = i == len(order) - 1 and look < len(rounds)
                        step = _VariantRun(
                            opts, run_id, variant, repeat, todo, writer, progress, announce,
                            make, reference, target, started, keep, clock,
                        )  # fmt: skip
                        outcome = await step.run()
                        outcomes.append(outcome)
                        save()
                        if outcome.stop_run:
                            return outcomes  # every variant would be refused the same way
                        if keep and outcome.error is None:
                            held = (variant, repeat, target)
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
    finally:
        if held is not None:
            await held[2].stop()
        if opts.confirm or opts.judge == "auto":  # the judge's verdicts into turns.jsonl
            judge.merge_into_turns(opts.out_dir)
    return outcomes
