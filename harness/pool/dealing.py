"""How one variant's sessions and its concurrency are spread over worker processes.

``auto_workers`` is ``--workers auto``; ``shard`` deals whole fork families to the workers;
the variant's ``Permits`` (``harness.drive.permits``) are split between them; ``regrant`` moves
the permits a worker can no longer use to the workers whose sessions wait for one
(``harness.pool.parent`` applies them).
"""

from __future__ import annotations

import os

from harness.drive.permits import split_limit as split_limit  # (where the tests look)
from harness.drive.session import SessionPlan

AUTO_MIN_CONCURRENCY = 256  # below this, "auto" drives a variant in one process
AUTO_PER_WORKER = 128  # "auto" gives each worker at least this many requests in flight


def auto_workers(concurrency: int, cores: int | None = None) -> int:
    """``--workers auto``: one process below ``AUTO_MIN_CONCURRENCY`` requests in flight;
    from there one per usable core, each with at least ``AUTO_PER_WORKER`` in flight.

    Measured (docs/performance.md): at 80 in flight a second process gained nothing, against
    the simulator on the same 2 cores or a paced endpoint, for its start-up and its memory;
    at 500 and 2,000 in flight one event loop is saturated and lags by 0.2-1.3 s in its
    bursts, and a second process cuts the lag by 40-50% and raises the rate by 60-75%.
    """
    if cores is None:
        usable = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else ()
        cores = len(usable) or os.cpu_count() or 1
    if concurrency < AUTO_MIN_CONCURRENCY:
        return 1
    return max(1, min(cores, concurrency // AUTO_PER_WORKER))


def family(plan: SessionPlan) -> int:
    """The session a plan's fork family is rooted at."""
    return plan.parent if plan.parent is not None else plan.index


def deal(plans: list[SessionPlan], count: int) -> list[list[SessionPlan]]:
    """Whole fork families dealt in turn to ``count`` slices (some empty when there are fewer
    families); the plans keep their order within a slice. The same plans always give the same
    slices: hosts given the same seed agree on them without talking."""
    roots: dict[int, int] = {}
    for plan in plans:
        roots.setdefault(family(plan), len(roots))
    slices: list[list[SessionPlan]] = [[] for _ in range(max(1, count))]
    for plan in plans:
        slices[roots[family(plan)] % len(slices)].append(plan)
    return slices


def shard(plans: list[SessionPlan], workers: int) -> list[list[SessionPlan]]:
    """Whole fork families dealt in turn to at most ``workers`` shards (none empty); the
    plans keep their order within a shard."""
    families = len({family(p) for p in plans})
    return [s for s in deal(plans, max(1, min(workers, families))) if s]


def regrant(limits: list[int], remaining: list[int]) -> tuple[list[int], list[int]]:
    """Move the permits that workers can no longer use to the workers whose sessions wait for
    one: ``(new limits, grants)``.

    A worker with fewer sessions left than its limit cannot use the rest (a session has one
    request in flight at most, and its sessions only end): its limit falls to its sessions
    left, and the difference goes to the workers with more sessions left than their limit,
    in proportion to how many wait there, never more than wait. The limits never sum to more
    than before, so the variant never has more in flight than its concurrency.
    """
    kept = [min(lim, left) for lim, left in zip(limits, remaining, strict=True)]
    need = [max(0, left - lim) for lim, left in zip(limits, remaining, strict=True)]
    give = min(sum(limits) - sum(kept), sum(need))
    grants = [0] * len(limits)
    if give > 0:
        exact = [give * n / sum(need) for n in need]
        grants = [int(x) for x in exact]
        by_remainder = sorted(range(len(need)), key=lambda i: exact[i] - grants[i], reverse=True)
        for i in by_remainder[: give - sum(grants)]:
            grants[i] += 1
    return [k + g for k, g in zip(kept, grants, strict=True)], grants


def effective_workers(workers: int, plans: list[SessionPlan], concurrency: int) -> int:
    """How many workers a variant really gets: no more than its families or its limit."""
    return max(1, min(workers, len({family(p) for p in plans}), concurrency))
