"""Many sessions at once: concurrency, the in-flight count, deadlines, progress counts.

Every ``drive()`` measures the harness itself (``harness.drive.selfreport``): event-loop lag, send
lag, pool waits, CPU and turns per second, left in ``Progress.harness_self`` when it returns
(also when it is cancelled).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, cast

from harness.client.chat import ChatClient
from harness.client.output import TurnOutput, server_failure
from harness.drive.answering import ServerWatch
from harness.drive.inflight import InflightBoard
from harness.drive.selfreport import SelfReport
from harness.drive.session import Session, SessionPlan, Shared
from harness.record.transcripts import TranscriptLog
from harness.record.turns import TurnRecord, TurnWriter
from harness.workload.scenario import Scenario

log = logging.getLogger(__name__)


@dataclass
class Progress:
    """Counters the CLI renders; updated on the event loop, one turn at a time."""

    sessions_total: int = 0
    sessions_done: int = 0
    turns: int = 0
    corrupted_turns: int = 0
    transport_errors: int = 0
    corrupted_sessions: set[tuple[int, int]] = field(default_factory=set)
    harness_self: dict[str, Any] | None = None  # the last drive()'s self-report

    def on_turn(self, rec: TurnRecord) -> None:
        self.count(
            bool(rec.get("corrupted")),
            server_failure(rec.get("transport_error")),
            (rec.get("repeat", 0), rec["session"]),
        )

    def count(self, corrupted: bool, transport_error: bool, key: tuple[int, int]) -> None:
        """One finished turn: its verdict and its (repeat, session)."""
        self.turns += 1
        if corrupted:
            self.corrupted_turns += 1
            self.corrupted_sessions.add(key)
        if transport_error:
            self.transport_errors += 1


# The cyclic garbage collector's thresholds while sessions run. At the default (700
# allocations) 2,000 sessions spent 10-25% of the run's CPU in collections; with 20,000
# about 5% (docs/performance.md).
GC_THRESHOLDS = (20_000, 10, 10)  # gen0 raised; gen1 and gen2 keep their cadence
_gc_users = 0
_gc_saved: tuple[int, int, int] | None = None


@contextlib.contextmanager
def _fewer_collections() -> Iterator[None]:
    global _gc_users, _gc_saved
    if _gc_users == 0:
        _gc_saved = gc.get_threshold()
        raised = (max(now, ours) for now, ours in zip(_gc_saved, GC_THRESHOLDS, strict=True))
        gc.set_threshold(*raised)
    _gc_users += 1
    try:
        yield
    finally:
        _gc_users -= 1
        if _gc_users == 0 and _gc_saved is not None:
            gc.set_threshold(*_gc_saved)


@dataclass(frozen=True)
class DriveOptions:
    concurrency: int
    stream: bool = True
    on_corruption: str = "retry"
    ramp_up_s: float = 0.0  # spread session starts over this many seconds


class _MeasuredClient:
    """The client as the sessions see it: marks when each send was decided."""

    def __init__(self, client: ChatClient, report: SelfReport) -> None:
        self._client = client
        self._report = report

    async def chat(self, body: dict[str, Any], *, stream: bool) -> TurnOutput:
        self._report.sending()
        return await self._client.chat(body, stream=stream)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)


async def drive(
    client: ChatClient,
    scenario: Scenario,
    plans: list[SessionPlan],
    writer: TurnWriter,
    base: dict[str, Any],
    options: DriveOptions,
    progress: Progress | None = None,
    on_turn: Callable[[TurnRecord], None] | None = None,
    on_session_end: Callable[[int, str | None], None] | None = None,
    make_session: Callable[[SessionPlan, Shared], Session] | None = None,
    board: InflightBoard | None = None,
    limit: asyncio.Semaphore | None = None,
    transcripts: TranscriptLog | None = None,
) -> list[Session]:
    """Run every session of one variant to its end; return the sessions.

    The harness's self-report for this call is left in ``progress.harness_self``.
    ``make_session`` builds each session (default ``Session``): trace replay and raw mode.
    ``board``: the in-flight counts of the other workers driving the same variant
    (``harness.pool.parent``), so each record's ``inflight`` is the variant's total.
    ``limit``: the semaphore every send holds (default: ``options.concurrency`` permits); a
    worker's grows when another worker has permits it can no longer use.
    ``transcripts``: the log of the sessions' exact requests (None: none kept).
    """
    progress = progress or Progress()
    progress.sessions_total += len(plans)
    report = SelfReport()
    # a client offering ``observers`` reports when requests leave and waits for the pool
    observers: list[Any] | None = getattr(client, "observers", None)
    if observers is not None:
        observers.append(report)
    report.start()
    try:
        with _fewer_collections():
            return await _drive(
                client,
                scenario,
                plans,
                writer,
                base,
                options,
                progress,
                report,
                on_turn,
                on_session_end,
                make_session,
                board,
                limit or asyncio.Semaphore(options.concurrency),
                transcripts,
            )
    finally:
        if observers is not None:
            observers.remove(report)
        progress.harness_self = report.stop()
        if progress.harness_self["saturated"]:
            for warning in progress.harness_self["warnings"]:
                log.warning("harness self-report: %s", warning)


async def _drive(
    client: ChatClient,
    scenario: Scenario,
    plans: list[SessionPlan],
    writer: TurnWriter,
    base: dict[str, Any],
    options: DriveOptions,
    progress: Progress,
    report: SelfReport,
    on_turn: Callable[[TurnRecord], None] | None,
    on_session_end: Callable[[int, str | None], None] | None,
    make_session: Callable[[SessionPlan, Shared], Session] | None,
    board: InflightBoard | None,
    limit: asyncio.Semaphore,
    transcripts: TranscriptLog | None,
) -> list[Session]:
    def turn_done(rec: TurnRecord) -> None:
        report.note_turn()
        progress.on_turn(rec)
        if on_turn is not None:
            on_turn(rec)

    shared = Shared(
        client=cast(ChatClient, _MeasuredClient(client, report)),
        scenario=scenario,
        writer=writer,
        base=base,
        stream=options.stream,
        on_corruption=options.on_corruption,
        limit=limit,
        on_turn=turn_done,
        board=board,
        watch=ServerWatch(str(base.get("variant", "")), str(getattr(client, "request_url", "?"))),
        transcripts=transcripts,
    )
    # each session is built in its own task, when it starts: the first requests leave
    # while later sessions still build their first prompt (an 80k-token prompt takes ~10 ms)
    sessions: list[Session | None] = [None] * len(plans)

    async def one(i: int, plan: SessionPlan) -> None:
        if options.ramp_up_s > 0 and len(plans) > 1:
            await asyncio.sleep(options.ramp_up_s * i / len(plans))
        session = sessions[i] = (make_session or Session)(plan, shared)
        try:
            await session.run()
        finally:
            progress.sessions_done += 1
        if on_session_end is not None:  # only sessions that ran to their end
            on_session_end(session.plan.index, session.ended)

    tasks = [asyncio.ensure_future(one(i, plan)) for i, plan in enumerate(plans)]
    try:
        await asyncio.gather(*tasks)
    except BaseException:
        # a session found the variant cannot go on (a HarnessError: the endpoint refuses the
        # requests, the server stopped answering), or the run is stopping: the other sessions
        # stop now, their requests in flight recorded as cancelled
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise
    return [s for s in sessions if s is not None]
