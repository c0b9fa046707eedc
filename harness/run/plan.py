"""The run plan: in which order variants run, and the ``--dry-run`` text that shows it.

Repeats are interleaved (A B A B ..., not A A B B) so that drift over the hours of a run --
a warming machine, a neighbour's load, a filling disk -- spreads over every variant instead of
masquerading as the effect of one. ``scheme="abba"`` reverses every other round (A B B A ...),
which also cancels a linear drift in the mean.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from pathlib import Path

from harness.analysis import stats
from harness.errors import UsageError
from harness.target.launch import make_target
from harness.target.spec import TargetSpec
from harness.workload.matrix import Variant

SCHEMES = ("abab", "abba")


def run_order(
    variants: Sequence[Variant], repeats: int, *, scheme: str = "abab"
) -> list[tuple[Variant, int]]:
    """Every variant ``repeats`` times as (variant, repeat index), rounds interleaved."""
    if repeats < 1:
        raise UsageError(f"--repeats must be 1 or more (got {repeats})")
    if scheme not in SCHEMES:
        raise UsageError(f"order scheme must be one of {', '.join(SCHEMES)} (got {scheme!r})")
    order: list[tuple[Variant, int]] = []
    for r in range(repeats):
        round_ = list(variants)
        if scheme == "abba" and r % 2 == 1:
            round_.reverse()
        order.extend((v, r) for v in round_)
    return order


def round_orders(
    order: Sequence[tuple[Variant, int]], looks: int
) -> list[list[tuple[Variant, int]]]:
    """``--until-significant``: the order of each of ``looks`` rounds. Every other round runs
    the order backwards (A B | B A | A B), so the block that ends a round also starts the
    next: its server stays up in between (the decision between rounds reads the turns on
    disk), and a run of R rounds starts R - 1 servers fewer. Reversing cancels a linear drift
    as ``abba`` does."""
    return [list(order) if k % 2 == 0 else list(reversed(order)) for k in range(looks)]


def server_starts(rounds: Sequence[Sequence[tuple[Variant, int]]]) -> int:
    """Servers started over the rounds: one per block, but none for a block that goes on
    from the end of the round before."""
    starts = 0
    previous: tuple[Variant, int] | None = None
    for blocks in rounds:
        for i, block in enumerate(blocks):
            if not (i == 0 and block == previous):
                starts += 1
        previous = blocks[-1] if blocks else None
    return starts


def format_plan(
    spec: TargetSpec,
    order: Sequence[tuple[Variant, int]],
    run_dir: Path,
    *,
    extra_args: Sequence[str] = (),
    looks: int = 1,
) -> str:
    """What a run would do, without starting anything: target, variants, order, commands.
    ``looks``: the rounds ``--until-significant`` may take (the worst case is all of them)."""
    variants: list[Variant] = []
    for v, _ in order:
        if v not in variants:
            variants.append(v)
    repeats = max((r for _, r in order), default=-1) + 1
    lines = [
        f"target: {spec.name} ({spec.mode} mode) from {spec.path}",
    ]
    if spec.description:
        lines.append(f"  {spec.description}")
    lines.append(f"run folder: {run_dir}")
    lines.append(f"variants ({len(variants)}), {repeats} repeat(s) each, {len(order)} blocks:")
    for v in variants:
        lines.append(f"  - {v.label}")
    lines.append("order: " + " -> ".join(f"{v.label}#{r + 1}" for v, r in order))
    ready = spec.ready
    lines.append(
        f"readiness: first of {', '.join(ready.paths)} answering 200, every "
        f"{ready.interval_s:g}s, at most {ready.timeout_s:g}s"
    )
    rounds = round_orders(order, looks)
    starts = server_starts(rounds)
    if looks > 1:
        lines.append(
            f"--until-significant: up to {looks} rounds of {len(order)} blocks, every other one "
            f"in reverse ({' | '.join(' -> '.join(v.label for v, _ in r) for r in rounds[:3])}"
            f"{' | ...' if looks > 3 else ''}); the server of the block that ends a round stays "
            "up into the next"
        )
    if spec.mode in ("launch", "hook"):
        worst = starts * ready.timeout_s
        what = "server starts" if spec.mode == "launch" else "hook reconfigurations"
        lines.append(
            f"{starts} {what} at most; start-up alone may take up to {_duration(worst)} "
            f"(ready timeout x {starts})"
        )
    lines.append(
        f"between variants: warm-up {'on' if spec.warm_up else 'off'}, "
        f"flush_cache {'on' if spec.flush_cache else 'off'}, "
        f"metrics {'scraped from /metrics' if spec.metrics else 'off'}"
    )
    for v in variants:
        d = make_target(spec, v, run_dir, extra_args=extra_args).describe()
        lines.append(f"[{v.label}]")
        if "command" in d:
            lines.append(f"  command: {shlex.join(d['command'])}")
            if d.get("cwd"):
                lines.append(f"  cwd: {d['cwd']}")
        if "before" in d:
            lines.append("  before hook:" + _block(d["before"]))
            lines.append("  after hook:" + _block(d["after"]))
        env = d.get("env") or {}
        if env:
            lines.append(
                "  env added: " + " ".join(f"{k}={shlex.quote(val)}" for k, val in env.items())
            )
        lines.append(f"  url: {d['url']}")
        if "log" in d:
            lines.append(f"  log: {d['log']}")
    return "\n".join(lines) + "\n"


def _duration(seconds: float) -> str:
    if seconds >= 3600:
        return f"{seconds / 3600:.1f} h"
    if seconds >= 60:
        return f"{seconds / 60:.0f} min"
    return f"{seconds:.0f} s"


def _block(command: str | None) -> str:
    if not command:
        return " (none)"
    body = command.strip("\n").splitlines()
    if len(body) == 1:
        return " " + body[0]
    return "\n" + "\n".join("    | " + line for line in body)


def rare_event_lines(
    turns_per_session: float,
    sessions: int,
    rate: float,
    baseline: float,
    *,
    alpha: float = 0.05,
    false_alarm: float = 0.0,
    looks: int = 1,
    design_effect: float | None = None,
) -> list[str]:
    """``--dry-run``: the turns and sessions a variant needs to tell ``rate`` from
    ``baseline`` (``analysis.stats.turns_needed``) at 80% power, against the sessions asked.
    ``design_effect``: the turn design effect an earlier run of the workload reported
    (summary.json's ``turn_design_effect``), turned into the intra-session correlation it
    implies; None takes the turns of a session as independent (a design effect of 1).
    ``looks``: ``--until-significant``'s rounds, each testing at alpha / looks (as its loop
    does: ``analysis.sequential``), ``sessions`` then the budget."""
    power = 0.8
    deff = 1.0 if design_effect is None else design_effect
    icc = min(1.0, (deff - 1.0) / (turns_per_session - 1.0)) if turns_per_session > 1 else 0.0
    level = alpha / max(1, looks)
    need = stats.turns_needed(
        rate,
        baseline,
        alpha=level,
        power=power,
        turns_per_session=turns_per_session,
        icc=icc,
        false_alarm=false_alarm,
    )
    have = sessions * turns_per_session
    at = f"two-sided alpha {alpha:g}" if looks <= 1 else f"alpha {alpha:g} / {looks} looks"
    lines = [
        f"to tell a turn corruption rate of {rate:.2%} from {baseline:.2%} "
        f"({power:.0%} power, {at}): {need['turns']:,} turns a variant, "
        f"{need['sessions']:,} sessions of about {turns_per_session:g} turns "
        f"(design effect {need['design_effect']:g}"
        + (
            ", turns taken as independent: give an earlier run's turn design effect as "
            "--detect RATE:BASELINE:DEFF"
            if design_effect is None
            else f" as given, an intra-session correlation of {icc:.3g}"
        )
        + f"; false alarms {false_alarm:.3%} of clean turns)",
        f"  this run{' at most' if looks > 1 else ''}: {sessions:,} sessions, about "
        f"{have:,.0f} turns a variant"
        + (
            ""
            if have >= need["turns"]
            else " (too few: --sessions or --until-significant)"
            if looks <= 1
            else " (too few: a larger --max-sessions)"
        ),
    ]
    return lines
