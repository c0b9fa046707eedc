"""The requests one variant may have in flight: ``Permits``, made once per variant from
``--concurrency`` and split, never rewritten.

A run on K hosts (``--shard I/K``) gives each shard its share (``share``), in proportion to
its sessions; a shard over N worker processes gives each worker its part (``split``); a
worker's part grows when another worker can no longer use all of its own (``grow``,
``harness.pool.dealing.regrant``). Each ``drive()`` sends under its permits' one semaphore
(``Session.send``), made on first use on the loop that drives.
"""

from __future__ import annotations

import asyncio
from typing import Any


def split_limit(concurrency: int, sizes: list[int]) -> list[int]:
    """The concurrency limit over shards of these sizes: in proportion, at least 1 each,
    summing to ``concurrency`` (when it is at least the number of shards)."""
    total = sum(sizes)
    exact = [concurrency * s / total for s in sizes]
    limits = [max(1, int(x)) for x in exact]
    by_remainder = sorted(range(len(sizes)), key=lambda i: exact[i] - int(exact[i]), reverse=True)
    for i in by_remainder[: max(0, concurrency - sum(limits))]:
        limits[i] += 1
    return limits


class Permits:
    """``count`` requests in flight at most (picklable: the semaphore is made where used)."""

    def __init__(self, count: int) -> None:
        self.count = count
        self._semaphore: asyncio.Semaphore | None = None

    def __repr__(self) -> str:
        return f"Permits({self.count})"

    def __getstate__(self) -> dict[str, Any]:
        return {"count": self.count}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.count = state["count"]
        self._semaphore = None

    def split(self, sizes: list[int]) -> list[Permits]:
        """One part per shard of these sizes, in proportion, at least 1 each."""
        return [Permits(n) for n in split_limit(self.count, sizes)]

    def share(self, sizes: list[int], index: int) -> Permits:
        """The part of the ``index``-th of slices of these sizes (some may be empty: an
        empty one gets 1, the others split the rest in proportion)."""
        if not sizes[index]:
            return Permits(1)
        live = [i for i, n in enumerate(sizes) if n]
        parts = split_limit(max(self.count, len(live)), [sizes[i] for i in live])
        return Permits(parts[live.index(index)])

    def semaphore(self) -> asyncio.Semaphore:
        """The one semaphore every send of this part holds."""
        if self._semaphore is None:
            self._semaphore = asyncio.Semaphore(self.count)
        return self._semaphore

    def grow(self, n: int) -> None:
        """``n`` more permits (another worker's spare ones)."""
        self.count += n
        if self._semaphore is not None:
            for _ in range(n):
                self._semaphore.release()
