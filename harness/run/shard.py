"""One run spread over hosts: ``--shard I/K`` runs the I-th of K slices of every variant's
sessions, and ``harness merge`` (``harness.run.merge``) makes one run folder of the K.

The slices are whole fork families dealt in turn (``harness.pool.dealing.deal``), from the
plans the seed makes, so hosts given the same command agree on them without talking, and the A
and B arms of a shard replay the same scripts. A shard drives its share of the variant's
permits (``--concurrency``, in proportion to its sessions), so the K together keep the plan's
load. ``RunOptions.plan_id`` names the plan: shards of one run carry the same one, and the
merge refuses folders whose differ.

Time: latencies stay per process (monotonic); each shard records when it really started
against ``--start-at`` and its clock's offset from the server's ``Date`` header, so merged
timelines can be checked; the merge reports the largest offset.
"""

from __future__ import annotations

import asyncio
import email.utils
import time
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import httpx

from harness.client.door import get_models, server_client
from harness.drive.session import SessionPlan
from harness.errors import UsageError
from harness.pool.dealing import deal

#: The farthest ``--start-at`` may lie ahead: a typo in the date must not park a CI job.
MAX_WAIT_S = 24 * 3600


@dataclass(frozen=True)
class Shard:
    index: int  # 1-based
    count: int

    @property
    def label(self) -> str:
        return f"{self.index}/{self.count}"

    def to_dict(self) -> dict[str, int]:
        return {"index": self.index, "count": self.count}


def parse_shard(text: str) -> Shard:
    """``I/K`` with 1 <= I <= K."""
    index, sep, count = text.partition("/")
    try:
        shard = Shard(int(index), int(count))
    except ValueError:
        shard = None
    if not sep or shard is None or not 1 <= shard.index <= shard.count:
        raise UsageError(f"--shard {text!r}: expected I/K with 1 <= I <= K, e.g. 2/4")
    return shard


def parse_start_at(text: str, now: float | None = None) -> float:
    """``--start-at``: unix seconds, or an ISO 8601 time with its zone (``2026-12-02T02:00Z``)."""
    now = time.time() if now is None else now
    try:
        at = float(text)
    except ValueError:
        at = _iso_time(text)
    if at - now > MAX_WAIT_S:
        raise UsageError(
            f"--start-at {text!r} is {(at - now) / 3600:.0f} h ahead; at most "
            f"{MAX_WAIT_S // 3600} h"
        )
    return at


def _iso_time(text: str) -> float:
    try:
        parsed = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise UsageError(
            f"--start-at {text!r}: give unix seconds or an ISO 8601 time with its zone, "
            "e.g. 2026-12-02T02:00:00Z"
        ) from None
    if parsed.tzinfo is None:
        raise UsageError(
            f"--start-at {text!r}: the time needs its zone (Z or +HH:MM), so every host reads "
            "it alike"
        )
    return parsed.timestamp()


def slice_plans(plans: list[SessionPlan], shard: Shard) -> list[SessionPlan]:
    return deal(plans, shard.count)[shard.index - 1]


async def wait_until(at: float, announce: Any) -> float:
    """Sleep until wall time ``at``; returns how late the start was (negative: never)."""
    ahead = at - time.time()
    if ahead > 0:
        announce(f"waiting {ahead:.0f}s for --start-at")
        await asyncio.sleep(ahead)
    return time.time() - at


async def server_clock_offset(base_url: str, api_key: str | None = None) -> float | None:
    """The server's clock minus ours, from its ``Date`` header (1 s resolution), or None."""
    try:
        async with server_client(base_url, api_key=api_key) as http:
            before = time.time()
            resp = await get_models(http)
            after = time.time()
    except httpx.HTTPError:
        return None
    date = resp.headers.get("date")
    if not date:
        return None
    try:
        server = email.utils.parsedate_to_datetime(date).timestamp()
    except (TypeError, ValueError):
        return None
    # the header truncates to the second: its middle is the best guess
    return round(server + 0.5 - (before + after) / 2, 3)
