"""One variant (one repeat) of a run, in its phases: server up, load, after-load, server down.

- **Server up** (``harness.run.serverup``): the server starts (or stays up from the block
  before), first contact, the variant's dialect: a ``Served``.
- **Load** (``_load``): the variant's ``Permits`` are made, its sessions driven by its
  ``LoadDriver`` (on this event loop, or over worker processes started while the server
  started), beside the metrics scrape, the canary and the server log's watch; the server is
  watched, and a load stopped early says why.
- **After-load** (``harness.run.afterload``): the lone passes on the idle server.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.drive.driver import DriveOptions, Progress
from harness.drive.load import Load, LoadDriver, LocalDriver, Sinks
from harness.drive.permits import Permits
from harness.drive.selfreport import save_row
from harness.drive.session import SessionPlan
from harness.errors import EndpointRefused, ServerUnanswering
from harness.pool.cluster import ClusterPool
from harness.pool.parent import WorkerDriver, WorkerError, WorkerPool, effective_workers
from harness.record.rundir import KV_CANARY_LINES_FILE, SESSIONS_FILE, TRANSCRIPTS_FILE
from harness.record.transcripts import TranscriptLog
from harness.record.turns import JsonlAppender, TurnWriter
from harness.run.afterload import Loaded, after_load
from harness.run.canary_runner import Canary, open_canary
from harness.run.options import LoadSpec, RunOptions
from harness.run.oracle_alarms import LogWatch
from harness.run.serverup import Served, ServerUp
from harness.target.launch import Target
from harness.target.metrics import MetricsScraper
from harness.target.readiness import died_message, watch
from harness.workload.matrix import Variant

log = logging.getLogger(__name__)


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


@dataclass
class RunContext:
    """What every variant run of one run shares."""

    opts: RunOptions
    run_id: str
    writer: TurnWriter
    progress: Progress
    announce: Callable[[str], None]
    #: ``--shard``: the sessions of each host's slice, for this host's share of the permits
    slices: list[int] | None = None
    clock: dict[str, Any] | None = None  # a shard's clock.json, the server's offset to add

    def permits(self) -> Permits:
        """A variant's permits: ``--concurrency`` of them, on a shard this host's share."""
        permits, shard = Permits(self.opts.load.concurrency), self.opts.load.shard
        if shard is not None and self.slices is not None:
            permits = permits.share(self.slices, shard.index - 1)
        return permits


@dataclass
class Block:
    """One variant (one repeat) to run: the sessions to drive, those to re-run alone after
    (None: the first --reference-sessions of them), and its server, made by the caller.
    ``started``: kept up from the block before; ``keep``: leave it up for the next block
    when this one ends without error."""

    variant: Variant
    repeat: int
    plans: list[SessionPlan]
    reference: list[SessionPlan] | None
    target: Target
    started: bool = False
    keep: bool = False


def load_driver(load: LoadSpec, plans: list[SessionPlan], in_flight: int) -> LoadDriver:
    """The variant's driver: worker processes (``--workers``, a Ray cluster) when more than
    one would have sessions and permits, else this event loop."""
    if load.cluster is not None and plans:  # as many as the cluster has CPUs, up to this
        return WorkerDriver(
            ClusterPool(load.cluster or None, effective_workers(len(plans), plans, in_flight))
        )
    if load.cluster is None and (workers := effective_workers(load.workers, plans, in_flight)) > 1:
        return WorkerDriver(WorkerPool(workers))
    return LocalDriver(load.judges)


def log_watch(opts: RunOptions, target: Target, tag: dict[str, Any]) -> LogWatch | None:
    """--oracle kv_canary: a watch on the server's log (--server-log, or a launched one's),
    each canary line kept in the run folder as it is read, with ``tag`` (variant, repeat)."""
    if "kv_canary" not in opts.after.oracles:
        return None
    path = opts.after.server_log or getattr(target, "log_path", None)
    if path is None:
        log.warning("--oracle kv_canary: no server log to read for this variant")
        return None
    watch = LogWatch(Path(path), opts.out_dir / KV_CANARY_LINES_FILE, tag)
    watch.start()
    return watch


@dataclass
class VariantRun:
    """One block of the run, phase by phase; ``opts`` is the run's, with this variant's
    dialect once decided (and the canary on where the replay oracle cannot be exact)."""

    ctx: RunContext
    block: Block
    opts: RunOptions = field(init=False)
    ended: dict[str, int] = field(default_factory=dict)
    code: int = 0
    stop_run: bool = False
    dialect_from: str | None = None  # where the variant's dialect came from, once decided
    death: dict[str, Any] | None = None  # the server died under the load (_death)

    def __post_init__(self) -> None:
        self.opts = self.ctx.opts

    @property
    def name(self) -> str:
        b = self.block
        return b.variant.label + (
            f" (repeat {b.repeat + 1})" if self.opts.schedule.repeats > 1 else ""
        )

    @property
    def base(self) -> dict[str, Any]:
        """The fields every record of this variant carries."""
        b = self.block
        base = {
            "run_id": self.ctx.run_id,
            "variant": b.variant.label,
            "factors": b.variant.as_dict(),
            "repeat": b.repeat,
        }
        if self.dialect_from is not None:
            base.update(dialect_from=self.dialect_from, workload=self.opts.scenario.workload)
        return base

    def announce(self, what: str) -> None:
        self.ctx.announce(f"{self.name}: {what}")

    async def run(self) -> VariantOutcome:
        """The phases in turn; the server stopped at the end (unless ``keep``)."""
        block, t0 = self.block, time.perf_counter()
        permits = self.ctx.permits()  # the variant's, made once
        driver = load_driver(self.opts.load, block.plans, permits.count)
        # worker processes start (and import) while the server starts
        starting = asyncio.create_task(driver.start())
        error, completed, version, model = None, False, None, self.opts.endpoint.model
        self._sessions_log = JsonlAppender(self.opts.out_dir / SESSIONS_FILE)  # closed below
        try:
            served = await ServerUp(
                self.opts, block.variant, block.repeat, block.target, block.started,
                len(block.plans), permits.count, self.ctx.clock, self.ctx.announce,
                self.name,
            ).run()  # fmt: skip
            self.opts, self.dialect_from = served.opts, served.dialect_from
            version, model = served.version, served.model
            client = served.client.chat_client()
            try:

                async def after() -> None:  # on the idle server, the scrape still going
                    await after_load(self.opts, self._loaded(), client, self.ctx.announce)

                error = await self._load(served, driver, starting, after, permits)
            finally:
                await client.aclose()
            completed = True
        finally:
            self._sessions_log.close()
            with contextlib.suppress(Exception):
                await starting  # quick: the processes import on their own
            await driver.close()  # when the load never started (a pool's run closes it)
            if not (block.keep and completed and error is None):
                await block.target.stop()
        wall = time.perf_counter() - t0
        self.announce(f"done in {wall:.0f}s")
        return VariantOutcome(
            block.variant.label, block.repeat, len(block.plans), self.ended, wall, error,
            self.code, self.stop_run, version, model, self.death,
        )  # fmt: skip

    # -- load ----------------------------------------------------------------------------

    async def _load(
        self,
        served: Served,
        driver: LoadDriver,
        starting: asyncio.Task[None],
        after: Callable[[], Awaitable[None]],
        permits: Permits,
    ) -> str | None:
        """Drive the sessions beside the metrics, the canary and the log watch, then (when
        the load ran to its end, the server still up) ``after``; why the load stopped early
        (None: it did not)."""
        opts, block = self.opts, self.block
        transcripts = self._transcripts(served)
        canary: Canary | None = None
        try:
            async with self._metrics(served.base_url):
                if opts.after.canary and block.plans:
                    canary = await open_canary(
                        opts, served.base_url, served.model, self.base,
                        lambda: self.ctx.progress.last_inflight, self.ctx.announce,
                    )  # fmt: skip
                tag = {"variant": block.variant.label, "repeat": block.repeat}
                watch = log_watch(opts, block.target, tag)  # --oracle kv_canary: its log
                self.ctx.progress.begin(block.variant.label, block.repeat, block.plans)
                await starting
                load = asyncio.create_task(driver.run(self._the_load(served, permits), Sinks(
                    self.ctx.writer, self.ctx.progress, transcripts, self._session_done,
                )))  # fmt: skip
                if canary is not None:
                    canary.start()
                error = await self._wait(load)
                if watch is not None:
                    await watch.stop()  # (its last lines kept)
                if canary is not None:
                    await canary.stop()
                alive = getattr(block.target, "alive", None)
                if error is None and alive is not None and not alive():
                    error = died_message(getattr(block.target, "death", lambda: None)())
                    self.announce(error)
                self.death = self._death(error)
                if error is not None and not self.code:
                    self.code = 3
                if error is None:
                    if canary is not None:
                        await canary.after()
                    await after()
        finally:
            if canary is not None:
                await canary.aclose()
            transcripts.close()
        return error

    def _death(self, error: str | None) -> dict[str, Any] | None:
        """The finding of a server that died under the load: how (its exit code or signal),
        when (seconds into the load, turns done) and what it said last (its log)."""
        death = getattr(self.block.target, "death", lambda: None)()
        if error is None or death is None:
            return None
        counts = self.ctx.progress.variants.get(self.block.variant.label)
        started = counts.started if counts is not None else None
        return {
            **death,
            "variant": self.block.variant.label,
            "repeat": self.block.repeat,
            "at": round(time.time(), 3),  # when it was seen dead (wall clock, like sent_at)
            "after_s": round(time.monotonic() - started, 1) if started is not None else None,
            "turns_done": counts.turns if counts is not None else None,
        }

    def _the_load(self, served: Served, permits: Permits) -> Load:
        """The variant's load, under its permits."""
        opts = self.opts
        options = DriveOptions(
            concurrency=permits.count,
            stream=opts.endpoint.stream,
            on_corruption=opts.load.on_corruption,
            hold_slots=opts.source.holds_slots,
            judges=opts.load.judges,
        )
        return Load(
            served.client, opts.scenario, tuple(self.block.plans), self.base, options,
            opts.source, permits,
        )  # fmt: skip

    def _transcripts(self, served: Served) -> TranscriptLog:
        opts, after = self.opts, self.opts.after
        return TranscriptLog(
            opts.out_dir / TRANSCRIPTS_FILE,
            self.base,
            model=served.model,
            stream=opts.endpoint.stream,
            dialect=opts.scenario.dialect,
            # the judge's sample of passed turns needs their conversations
            keep_all=after.keep_transcripts
            or (after.confirm and after.judge_sample > 0)
            or "replay" in after.oracles  # the replay oracle re-sends every session's sends
            or opts.scenario.passkeys  # every session's answer to the passkey ask
            or "spec_accept" in after.oracles,  # every send's meta_info
        )

    def _metrics(self, base_url: str) -> contextlib.AbstractAsyncContextManager[Any]:
        endpoint = self.opts.endpoint
        if endpoint.target is not None and not endpoint.target.metrics:
            return contextlib.nullcontext()
        return MetricsScraper(
            base_url,
            self.opts.out_dir,
            variant=self.block.variant.label,
            repeat=self.block.repeat,
            interval_s=endpoint.metrics_interval,
        )

    def _session_done(self, index: int, why: str | None) -> None:
        self.ended[why or "?"] = self.ended.get(why or "?", 0) + 1
        b = self.block
        row = {"variant": b.variant.label, "repeat": b.repeat, "session": index, "ended": why}
        self._sessions_log.append(json.dumps(row).encode() + b"\n")

    async def _wait(self, load: asyncio.Task[Any]) -> str | None:
        """Wait for the load while watching the server; why it stopped early (None: it ran to
        its end)."""
        error = None
        watcher = asyncio.create_task(watch(self.block.target, load))
        try:
            await load
        except asyncio.CancelledError:
            error = await watcher
            if error is None:
                raise
            self.announce(f"stopped: {error}")
        except (WorkerError, EndpointRefused, ServerUnanswering) as exc:
            # a worker died, the endpoint refuses the requests, or the server stopped
            # answering: this variant ends here, the run goes on (a refusal every variant
            # would get ends the run: ``stop_run``)
            error, self.code = str(exc), exc.exit_code
            self.stop_run = bool(getattr(exc, "whole_run", False))
            refused = isinstance(exc, EndpointRefused)  # (said at the end, once)
            self.announce("stopped" + ("" if refused else f": {error}"))
        finally:
            self.ctx.progress.end()
            watcher.cancel()
            if self.block.plans:  # (a resumed variant with only its after-load work left)
                b = self.block
                save_row(self.opts.out_dir, b.variant.label, b.repeat,
                         self.ctx.progress.harness_self)  # fmt: skip
        return error

    # -- after-load ----------------------------------------------------------------------

    def _loaded(self) -> Loaded:
        b = self.block
        reference = b.plans[: self.opts.after.reference_sessions]
        return Loaded(
            self.ctx.run_id, b.variant, b.repeat, self.base,
            reference if b.reference is None else b.reference,
        )  # fmt: skip
