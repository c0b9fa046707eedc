"""One variant's load, and the one interface that drives it.

``Load`` is what is driven (the client's settings, the scenario, the plans, the fields of
every record, the driving options, how the sessions are built, and the variant's
``Permits``); ``Sinks`` is where its results go (the turn writer, the progress counts, the
transcripts, who hears of each session's end). A ``LoadDriver`` drives it: ``LocalDriver``
on this event loop (``drive()``), ``harness.pool.parent.WorkerDriver`` over worker processes.
A driver is made for one variant, started early (its processes start while the server
starts), run once, and closed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from harness.client.spec import ClientSpec
from harness.drive import judging
from harness.drive.driver import DriveHooks, DriveOptions, Progress, drive
from harness.drive.inflight import InflightBoard
from harness.drive.permits import Permits
from harness.drive.session import SessionPlan
from harness.drive.trace_session import SessionSource, sessions_for
from harness.record.transcripts import TranscriptLog
from harness.record.turns import TurnRecord, TurnWriter
from harness.workload.scenario import Scenario


@dataclass(frozen=True)
class Load:
    """What one variant's load is, whoever drives it."""

    client: ClientSpec
    scenario: Scenario
    plans: tuple[SessionPlan, ...]
    base: dict[str, Any]  # the fields every record of the variant carries
    options: DriveOptions
    source: SessionSource
    permits: Permits  # the variant's requests in flight (its shard's share)


@dataclass
class Sinks:
    """Where a load's results go."""

    writer: TurnWriter
    progress: Progress
    transcripts: TranscriptLog | None = None
    on_session_end: Callable[[int, str | None], None] | None = None
    on_turn: Callable[[TurnRecord], None] | None = None


class LoadDriver(Protocol):
    async def start(self) -> None:
        """Get ready (processes start and import): called while the server starts."""

    async def run(self, load: Load, sinks: Sinks) -> dict[int, str | None]:
        """Every session of ``load`` to its end: how each that ran to its end ended. The
        self-report is left in ``sinks.progress.harness_self`` (also when cancelled)."""
        ...

    async def close(self) -> None:
        """Release what ``start`` took (safe after ``run``, or without it)."""


class LocalDriver:
    """The sessions on this event loop, with this process's client."""

    def __init__(self, judges: int | None = None, board: InflightBoard | None = None) -> None:
        self.judges = judges
        self.board = board  # in a worker: the other workers' in-flight counts

    async def start(self) -> None:
        judging.shared(self.judges)  # the judging processes warm up while the server starts

    async def run(self, load: Load, sinks: Sinks) -> dict[int, str | None]:
        client = load.client.chat_client()
        try:
            _, make = sessions_for(load.source, load.scenario, list(load.plans))
            hooks = DriveHooks(
                on_turn=sinks.on_turn,
                on_session_end=sinks.on_session_end,
                make_session=make,
                transcripts=sinks.transcripts,
                board=self.board,
                permits=load.permits,
            )
            sessions = await drive(
                load.client.sessions_client(client, load.scenario.dialect),
                load.scenario,
                list(load.plans),
                sinks.writer,
                load.base,
                load.options,
                sinks.progress,
                hooks,
            )
        finally:
            await client.aclose()
        return {s.plan.index: s.ended for s in sessions}

    async def close(self) -> None:
        return None
