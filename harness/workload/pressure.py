"""The cache-pressure planner: size the sessions' context growth to a stated KV pressure.

A cache race only fires when the cache is under pressure: the server loads a prefix back
from host memory only after its GPU pool evicted it. A scenario states the pressure it wants
as ``pressure``: the total live context of all sessions (each session's latest prompt plus
answer, summed, whether it is running or thinking) at its peak, as a multiple of the server's
KV capacity (tokens). The capacity comes from the scenario (``kv_capacity``) or from the
server (SGLang's ``/server_info`` ``max_total_num_tokens``; the simulator serves it).

Sessions grow linearly from ``start_context`` over ``steps`` turns, so the live total peaks
when they reach ``max_context``: the planner sets ``max_context = pressure * capacity /
sessions`` (and says so when that is below the start, or above ``MAX_CONTEXT_LIMIT``).
The pool is over capacity from the point where the live total crosses the capacity; think
time keeps idle sessions' context live, so with it the pool has to evict idle sessions and
load them back when they return, as it does with agents running tools.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any

from harness.errors import ConfigError
from harness.workload.scenario import Scenario

log = logging.getLogger(__name__)

#: Longest context the planner gives a session (tokens); more pressure needs more sessions.
MAX_CONTEXT_LIMIT = 1_000_000
SERVER_INFO_PATHS = ("/server_info", "/get_server_info")
CAPACITY_KEYS = ("max_total_num_tokens", "max_total_tokens", "kv_capacity")


@dataclass(frozen=True)
class PressurePlan:
    """How the sessions of one variant are sized to hold ``pressure`` on ``capacity`` tokens."""

    pressure: float
    capacity: int
    capacity_source: str  # "scenario" or "server"
    sessions: int
    start_context: int
    max_context: int
    steps: int
    think_time_s: tuple[float, float]

    @property
    def peak_live_tokens(self) -> int:
        return self.sessions * self.max_context

    @property
    def crossing_turn(self) -> float | None:
        """The turn at which the live total reaches the capacity (None: it never does)."""
        over = self.capacity / self.sessions
        if over >= self.max_context:
            return None
        if over <= self.start_context:
            return 0.0
        return self.steps * (over - self.start_context) / (self.max_context - self.start_context)

    def describe(self) -> str:
        lo, hi = self.think_time_s
        cross = self.crossing_turn
        when = "never" if cross is None else f"from about turn {cross:.0f}"
        think = f", thinking {lo:g}-{hi:g}s between turns" if hi > 0 else ""
        return (
            f"pressure {self.pressure:g} on {self.capacity:,} KV tokens ({self.capacity_source}): "
            f"{self.sessions} sessions growing {self.start_context:,} -> {self.max_context:,} "
            f"tokens over {self.steps} turns{think}; over capacity {when}"
        )


def plan_pressure(
    scenario: Scenario, capacity: int, sessions: int, source: str = "scenario"
) -> PressurePlan:
    """Size ``max_context`` so ``sessions`` sessions peak at ``pressure x capacity`` tokens."""
    if scenario.pressure is None:
        raise ConfigError(f"{scenario.source}: no 'pressure' to plan for")
    if capacity < 1 or sessions < 1:
        raise ConfigError(f"cannot plan pressure for {sessions} sessions on {capacity} tokens")
    target = scenario.pressure * capacity
    max_context = math.ceil(target / sessions)
    floor = scenario.start_context + 1000
    if max_context < floor:
        need = max(1, math.floor(target / floor))
        raise ConfigError(
            f"{scenario.source}: pressure {scenario.pressure:g} on {capacity:,} tokens spread over "
            f"{sessions} sessions leaves {max_context:,} tokens each, under the start context "
            f"({scenario.start_context:,}); use at most {need} sessions or a higher pressure"
        )
    if max_context > MAX_CONTEXT_LIMIT:
        need = math.ceil(target / MAX_CONTEXT_LIMIT)
        raise ConfigError(
            f"{scenario.source}: pressure {scenario.pressure:g} on {capacity:,} tokens needs "
            f"{max_context:,} tokens per session with {sessions} sessions; use at least {need} "
            "sessions"
        )
    return PressurePlan(
        pressure=scenario.pressure,
        capacity=capacity,
        capacity_source=source,
        sessions=sessions,
        start_context=scenario.start_context,
        max_context=max_context,
        steps=scenario.steps,
        think_time_s=scenario.think_time_s,
    )


def capacity_from_info(info: Any) -> int | None:
    """The KV capacity in tokens from a ``/server_info`` body (None when it does not say)."""
    if not isinstance(info, dict):
        return None
    for key in CAPACITY_KEYS:
        value = info.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    # some SGLang versions nest the scheduler's numbers
    for nested in ("internal_states", "scheduler_info"):
        inner = info.get(nested)
        if isinstance(inner, list) and inner:
            inner = inner[0]
        found = capacity_from_info(inner) if isinstance(inner, dict) else None
        if found:
            return found
    return None


async def server_capacity(client: Any) -> int | None:
    """Ask the server for its KV capacity (``client.get(path)``: a ChatClient); None if unknown."""
    for path in SERVER_INFO_PATHS:
        try:
            resp = await client.get(path)
        except Exception as exc:  # noqa: BLE001 - any failure just means "unknown"
            log.info("kv capacity: %s failed: %s", path, exc)
            continue
        if getattr(resp, "status_code", None) != 200:
            continue
        try:
            found = capacity_from_info(resp.json())
        except ValueError:
            continue
        if found:
            return found
    return None
