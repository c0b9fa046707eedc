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
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, cast

from harness.client.chat import ChatClient
from harness.client.output import TurnOutput, server_failure
from harness.drive import judging
from harness.drive.answering import ServerWatch
from harness.drive.inflight import InflightBoard
from harness.drive.permits import Permits
from harness.drive.selfreport import SelfReport
from harness.drive.session import Session, SessionPlan, Shared
from harness.record.payload import HistoryEncoder
from harness.record.transcripts import TranscriptLog
from harness.record.turns import TurnRecord, TurnWriter
from harness.verdict.turn import SUSPECT
from harness.workload import tools
from harness.workload.dialect import AUTO, DialectLock
from harness.workload.scenario import Scenario

log = logging.getLogger(__name__)


def planned_turns(plan: SessionPlan) -> int:
    """Turns a session is expected to take: its tool steps and the answer, within its cap."""
    return max(1, min(plan.max_turns, plan.steps + 1))


@dataclass
class VariantCounts:
    """One variant's progress (its repeats together): what was planned, what is done.

    ``planned_turns`` starts as the sum of the sessions' plans; a session that ended counts
    for the rows it made, and a running one for at least the rows it has made so far, so the
    total only tightens as the run goes.
    """

    label: str
    sessions: int = 0
    sessions_done: int = 0
    turns: int = 0
    corrupted_turns: int = 0
    transport_errors: int = 0
    cancelled: int = 0
    corrupted_sessions: set[tuple[int, int]] = field(default_factory=set)
    #: sessions with a turn the text detector alone suspects (none of them corrupt so far):
    #: the after-load judge confirms or acquits them, so they are shown apart
    suspect_sessions: set[tuple[int, int]] = field(default_factory=set)
    started: float | None = None  # time.monotonic() of its first load
    finished: float | None = None
    _plan: dict[tuple[int, int], int] = field(default_factory=dict)
    _rows: dict[tuple[int, int], int] = field(default_factory=dict)
    _ended: set[tuple[int, int]] = field(default_factory=set)
    _time_s: float = 0.0  # load seconds of its finished runs (repeats, rounds)

    @property
    def planned_turns(self) -> int:
        return sum(
            self._rows.get(k, 0) if k in self._ended else max(n, self._rows.get(k, 0))
            for k, n in self._plan.items()
        )

    @property
    def first_planned_turns(self) -> int:
        """The turns planned at the start (what a stopped run did not get to)."""
        return sum(self._plan.values())

    @property
    def running(self) -> bool:
        return self.started is not None and self.finished is None

    def elapsed_s(self, now: float) -> float:
        live = (now - self.started) if self.running and self.started is not None else 0.0
        return self._time_s + live

    def eta_s(self, now: float) -> float | None:
        """Seconds left at the rate so far (None before the first turn)."""
        if not self.turns:
            return None
        left = max(0, self.planned_turns - self.turns)
        return left * self.elapsed_s(now) / self.turns

    @property
    def session_rate(self) -> float | None:
        """Corrupted sessions over the sessions that have sent a turn."""
        started = len(self._rows)
        return len(self.corrupted_sessions) / started if started else None


@dataclass
class Progress:
    """Counters the CLI renders; updated on the event loop, one turn at a time.

    The run names the variant it drives (``begin``/``end``); the turns counted meanwhile are
    that variant's, whichever process sent them.
    """

    sessions_total: int = 0
    sessions_done: int = 0
    turns: int = 0
    corrupted_turns: int = 0
    transport_errors: int = 0
    corrupted_sessions: set[tuple[int, int]] = field(default_factory=set)
    suspect_sessions: set[tuple[int, int]] = field(default_factory=set)  # as VariantCounts'
    harness_self: dict[str, Any] | None = None  # the last drive()'s self-report
    last_inflight: int | None = None  # the in-flight count of the last turn (one process)
    variants: dict[str, VariantCounts] = field(default_factory=dict)
    current: VariantCounts | None = None
    _repeat: int = 0

    def expect(self, label: str, plans: list[SessionPlan], repeat: int = 0) -> VariantCounts:
        """Plan ``plans`` for ``label`` (ahead of the run, so the display shows what is to come)."""
        v = self.variants.setdefault(label, VariantCounts(label))
        for p in plans:
            if (repeat, p.index) not in v._plan:
                v._plan[(repeat, p.index)] = planned_turns(p)
                v.sessions += 1
        return v

    def begin(self, label: str, repeat: int, plans: list[SessionPlan]) -> None:
        """The run starts driving ``plans`` of ``label``."""
        v = self.expect(label, plans, repeat)
        v.started, v.finished = time.monotonic(), None
        self.current, self._repeat = v, repeat
        self.last_inflight = None

    def end(self) -> None:
        v = self.current
        if v is not None and v.started is not None:
            v.finished = time.monotonic()
            v._time_s += v.finished - v.started
        self.current = None

    def on_turn(self, rec: TurnRecord) -> None:
        self.last_inflight = rec.get("inflight")
        corrupted = bool(rec.get("corrupted"))
        self.count(
            corrupted,
            # a send the server failed on its own output's bytes is corrupted, not transport
            server_failure(rec.get("transport_error")) and not corrupted,
            (rec.get("repeat", 0), rec["session"]),
            cancelled=str(rec.get("transport_error") or "").startswith("cancelled"),
            suspect=corrupted and rec.get("tier") == SUSPECT,
        )

    def count(
        self,
        corrupted: bool,
        transport_error: bool,
        key: tuple[int, int],
        cancelled: bool = False,
        suspect: bool = False,
    ) -> None:
        """One finished turn: its verdict and its (repeat, session). A turn cancelled because
        the run was stopped is no transport error; a ``suspect`` one (the text detector alone)
        is not counted corrupted until an oracle confirms it, after the load."""
        self.turns += 1
        v = self.current
        if v is not None:
            v.turns += 1
            v._rows[key] = v._rows.get(key, 0) + 1
        if suspect:
            self.suspect_sessions.add(key)
            if v is not None:
                v.suspect_sessions.add(key)
        elif corrupted:
            self.corrupted_turns += 1
            self.corrupted_sessions.add(key)
            if v is not None:
                v.corrupted_turns += 1
                v.corrupted_sessions.add(key)
        if cancelled:
            if v is not None:
                v.cancelled += 1
        elif transport_error:
            self.transport_errors += 1
            if v is not None:
                v.transport_errors += 1

    def session_ended(self, index: int) -> None:
        """A session of the current variant ran to its end (or was stopped)."""
        self.sessions_done += 1
        v = self.current
        if v is not None:
            key = (self._repeat, index)
            if key not in v._ended:
                v._ended.add(key)
                v.sessions_done += 1


#: sessions started per pass of the event loop (``_drive``): each pass of the start also runs
#: the follow-ups of the sessions started just before, so 8 a pass made passes of 10-17 ms
#: at 2,000 sessions (the loop's lag p99 20 ms), 2 a pass 3-5 ms (docs/performance.md)
START_PER_PASS = 2

# The cyclic garbage collector's thresholds while sessions run. At the default (700
# allocations) 2,000 sessions spent 10-25% of the run's CPU in collections; with 20,000
# about 5% (docs/performance.md).
GC_THRESHOLDS = (20_000, 10, 10)  # gen0 raised; gen1 and gen2 keep their cadence
#: and the youngest generation collected on a clock besides (``_collect_young``)
YOUNG_EVERY_S = 0.1
_gc_users = 0
_gc_saved: tuple[int, int, int] | None = None


@contextlib.contextmanager
def _fewer_collections() -> Iterator[None]:
    global _gc_users, _gc_saved
    if _gc_users == 0:
        _gc_saved = gc.get_threshold()
        raised = (max(now, ours) for now, ours in zip(_gc_saved, GC_THRESHOLDS, strict=True))
        gc.set_threshold(*raised)
        # what exists before the load (the modules, the scenario, the plans) is kept out of
        # the oldest generation's collections, which otherwise walk all of it on the loop
        # (20 ms at a time at 2,000 sessions: the loop's worst stalls)
        gc.freeze()
    _gc_users += 1
    try:
        yield
    finally:
        _gc_users -= 1
        if _gc_users == 0 and _gc_saved is not None:
            gc.set_threshold(*_gc_saved)
            gc.unfreeze()


async def _collect_young() -> None:
    """Collect the youngest generation every ``YOUNG_EVERY_S`` while sessions run. What
    triggers it by itself counts allocations less deallocations, so while sessions end and
    free their histories the young objects piled up between two collections (113,000 of
    them, a collection of 60 ms on the loop, at 2,000 sessions); on a clock there are never
    more than a tenth of a second's worth."""
    while True:
        await asyncio.sleep(YOUNG_EVERY_S)
        gc.collect(0)


@dataclass(frozen=True)
class DriveOptions:
    concurrency: int  # the permits when ``DriveHooks.permits`` gives none
    stream: bool = True
    on_corruption: str = "retry"
    ramp_up_s: float = 0.0  # spread session starts over this many seconds
    #: more sessions than requests in flight: each holds its permit from start to end (see
    #: ``_drive``); off for sessions that idle between turns (think time, a trace's pace)
    hold_slots: bool = True
    #: processes classifying the answers off the event loop (``harness.drive.judging``):
    #: None for as many as the usable cores, 0 to classify on the loop
    judges: int | None = None


@dataclass
class DriveHooks:
    """What one ``drive()`` reports to and builds with besides its writer (all optional)."""

    on_turn: Callable[[TurnRecord], None] | None = None
    on_session_end: Callable[[int, str | None], None] | None = None  # (run to its end)
    #: builds each session (default ``Session``): trace replay and raw mode
    make_session: Callable[[SessionPlan, Shared], Session] | None = None
    transcripts: TranscriptLog | None = None  # the sessions' exact requests (None: none kept)
    #: the in-flight counts of the other workers driving the same variant
    #: (``harness.pool.parent``), so each record's ``inflight`` is the variant's total
    board: InflightBoard | None = None
    #: the permits every send holds (default: ``options.concurrency`` of them); a worker's
    #: grow when another worker has permits it can no longer use
    permits: Permits | None = None


class _MeasuredClient:
    """The client as the sessions see it: marks when each send was decided."""

    def __init__(self, client: ChatClient, report: SelfReport) -> None:
        self._client = client
        self._report = report

    async def chat(
        self, body: dict[str, Any], *, stream: bool, history: HistoryEncoder | None = None
    ) -> TurnOutput:
        self._report.sending()
        return await self._client.chat(body, stream=stream, history=history)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)


def _warm(judge: judging.Judge, scenario: Scenario) -> None:
    """What the load would otherwise load on the event loop: the fake tools' corpora (built
    while the judging processes warm up), then the judging processes ready."""
    tools.warm((t.kind for t in scenario.tools), prose=scenario.workload == "chat")
    judge.wait_ready()


async def drive(
    client: ChatClient,
    scenario: Scenario,
    plans: list[SessionPlan],
    writer: TurnWriter,
    base: dict[str, Any],
    options: DriveOptions,
    progress: Progress | None = None,
    hooks: DriveHooks | None = None,
) -> list[Session]:
    """Run every session of one variant to its end; return the sessions.

    The harness's self-report for this call is left in ``progress.harness_self``.
    """
    progress = progress or Progress()
    hooks = hooks or DriveHooks()
    progress.sessions_total += len(plans)
    judge = judging.shared(options.judges)
    report = SelfReport()
    # a client offering ``observers`` reports when requests leave and waits for the pool
    observers: list[Any] | None = getattr(client, "observers", None)
    if observers is not None:
        observers.append(report)
    report.start()  # a drive() stopped while the judges warm up still reports
    attached = False
    try:
        # the judging processes warm up (imports, the detector's model) before the load and
        # its clock start, and so do the fake tools' corpora: no session waits for that
        await asyncio.to_thread(_warm, judge, scenario)
        judge.attach()
        attached = True
        report.restart()

        def turn_done(rec: TurnRecord) -> None:
            report.note_turn()
            progress.on_turn(rec)
            if hooks.on_turn is not None:
                hooks.on_turn(rec)

        shared = Shared(
            client=cast(ChatClient, _MeasuredClient(client, report)),
            scenario=scenario,
            writer=writer,
            base=base,
            stream=options.stream,
            on_corruption=options.on_corruption,
            on_turn=turn_done,
            board=hooks.board,
            watch=ServerWatch(
                str(base.get("variant", "")),
                str(getattr(client, "request_url", "?")),
                bool(getattr(client, "key_sent", False)),
            ),
            transcripts=hooks.transcripts,
            dialect_lock=DialectLock() if scenario.dialect == AUTO else None,
            judge=judge,
            on_judged=report.judged,
        )
        with _fewer_collections():
            young = asyncio.ensure_future(_collect_young())
            try:
                return await _drive(
                    shared,
                    plans,
                    options,
                    progress,
                    hooks,
                    hooks.permits or Permits(options.concurrency),
                )
            finally:
                young.cancel()
    finally:
        if attached:
            judge.detach()
        if observers is not None:
            observers.remove(report)
        progress.harness_self = report.stop()
        if progress.harness_self["saturated"]:
            for warning in progress.harness_self["warnings"]:
                log.warning("harness self-report: %s", warning)


async def _drive(
    shared: Shared,
    plans: list[SessionPlan],
    options: DriveOptions,
    progress: Progress,
    hooks: DriveHooks,
    permits: Permits,
) -> list[Session]:
    # More sessions than requests in flight: each session holds a permit from its start to
    # its end, so sessions start as others end (in plan order), memory follows the sessions
    # active, and sessions finish (and are recorded as finished) all along the run. Otherwise
    # every session starts at once and each send holds a permit: so it is too for sessions
    # that idle between turns (think time, a trace's recorded pace), whose idle contexts are
    # the load they are there to make.
    idle = any(plan.think_time_s[1] > 0 for plan in plans)
    hold = options.hold_slots and not idle and len(plans) > permits.count
    gate = permits.semaphore() if hold else None
    if gate is None:
        shared.limit = permits.semaphore()
    # each session is built in its own task, when it starts: the first requests leave
    # while later sessions still build their first prompt (an 80k-token prompt takes ~10 ms)
    sessions: list[Session | None] = [None] * len(plans)
    make_session = hooks.make_session or Session

    # sessions start a few per pass of the loop: building a session and its first request
    # takes a fraction of a millisecond, which 2,000 sessions starting in one pass made a
    # stall of most of a second (the loop's lag, every time stamp late by as much); their
    # tasks are made as they start too (4,000 tasks' first steps in one pass: 47 ms)
    async def one(i: int, plan: SessionPlan) -> None:
        if options.ramp_up_s > 0 and len(plans) > 1:
            await asyncio.sleep(options.ramp_up_s * i / len(plans))
        async with gate if gate is not None else contextlib.nullcontext():
            session = sessions[i] = make_session(plan, shared)
            try:
                await session.run()
            finally:
                progress.session_ended(plan.index)
                if gate is not None:
                    session.messages = []  # its history goes with its slot, and its bytes
                    session.encoded.clear()
        if hooks.on_session_end is not None:  # only sessions that ran to their end
            hooks.on_session_end(session.plan.index, session.ended)

    tasks: list[asyncio.Future[None]] = []
    failed = asyncio.Event()  # a session raised: stop starting the others

    def watch(task: asyncio.Future[None]) -> None:
        if not task.cancelled() and task.exception() is not None:
            failed.set()

    try:
        for k in range(0, len(plans), START_PER_PASS):
            if failed.is_set():
                break
            for i in range(k, min(k + START_PER_PASS, len(plans))):
                task = asyncio.ensure_future(one(i, plans[i]))
                task.add_done_callback(watch)
                tasks.append(task)
            await asyncio.sleep(0)  # the sessions just made run in the next pass, alone
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
