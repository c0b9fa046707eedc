"""Many sessions at once: concurrency, the in-flight count, deadlines, progress counts."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from harness.client import ChatClient
from harness.config import Scenario
from harness.records import TurnRecord, TurnWriter
from harness.session import Session, SessionPlan, Shared

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

    def on_turn(self, rec: TurnRecord) -> None:
        self.turns += 1
        if rec.get("corrupted"):
            self.corrupted_turns += 1
            self.corrupted_sessions.add((rec.get("repeat", 0), rec["session"]))
        if rec.get("transport_error"):
            self.transport_errors += 1


@dataclass(frozen=True)
class DriveOptions:
    concurrency: int
    stream: bool = True
    on_corruption: str = "retry"
    ramp_up_s: float = 0.0  # spread session starts over this many seconds


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
) -> list[Session]:
    """Run every session of one variant to its end; return the sessions."""
    progress = progress or Progress()
    progress.sessions_total += len(plans)

    def turn_done(rec: TurnRecord) -> None:
        progress.on_turn(rec)
        if on_turn is not None:
            on_turn(rec)

    shared = Shared(
        client=client,
        scenario=scenario,
        writer=writer,
        base=base,
        stream=options.stream,
        on_corruption=options.on_corruption,
        limit=asyncio.Semaphore(options.concurrency),
        on_turn=turn_done,
    )
    sessions = [Session(plan, shared) for plan in plans]

    async def one(i: int, session: Session) -> None:
        if options.ramp_up_s > 0 and len(sessions) > 1:
            await asyncio.sleep(options.ramp_up_s * i / len(sessions))
        try:
            await session.run()
        finally:
            progress.sessions_done += 1
        if on_session_end is not None:  # only sessions that ran to their end
            on_session_end(session.plan.index, session.ended)

    await asyncio.gather(*(one(i, s) for i, s in enumerate(sessions)))
    return sessions
