"""What ``harness run`` shows while it runs: one line per variant, in turns.

On a terminal, a live display (rich) with a line per variant: turns done of planned, the ETA,
corrupted sessions and their rate so far (sessions the text detector alone suspects shown apart:
the judge confirms or acquits them after the load), transport errors, sessions done, and a bar;
log records and announcements are printed above it, never over it. A narrow terminal drops whole
fields (the bar first, then a count of cancelled turns, a zero count of transport errors, the
sessions done, the ETA), never cuts a number. Without a terminal (CI), the same line for the
variant being driven every ``interval`` seconds, and once more when a variant finishes, so a CI
log shows the run moving.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    from rich.console import Console, ConsoleOptions, RenderResult

    from harness.drive.driver import Progress, VariantCounts

T = TypeVar("T")
REFRESH_S = 0.5
MIN_BAR = 8


def _clock(seconds: float) -> str:
    s = int(round(seconds))
    h, rest = divmod(s, 3600)
    return f"{h}:{rest // 60:02d}:{rest % 60:02d}" if h else f"{rest // 60}:{rest % 60:02d}"


def fields(v: VariantCounts, now: float) -> list[tuple[int, str]]:
    """(priority, text) of a variant's line, in display order; the lower the priority, the
    later the field is dropped."""
    # stopped (Ctrl-C, a signal, the run timeout: its turns in flight cancelled): the turns
    # done of what was planned at the start, never "done"
    stopped = v.cancelled > 0 and v.finished is not None and not v.running
    planned = v.first_planned_turns if stopped else v.planned_turns
    out = [(0, f"{v.turns:,}/{planned:,} turns")]
    if v.running:
        eta = v.eta_s(now)
        out.append((3, "ETA " + ("?" if eta is None else _clock(eta))))
    elif stopped:
        out.append((3, f"stopped after {_clock(v.elapsed_s(now))}"))
    elif v.finished is not None:
        out.append((3, f"done in {_clock(v.elapsed_s(now))}"))
    else:
        out.append((3, "waiting"))
    rate = v.session_rate
    bad = len(v.corrupted_sessions)
    share = f" ({100 * rate:.1f}%)" if rate is not None else ""
    out.append((1, f"{bad} corrupt session{'s' if bad != 1 else ''}{share}"))
    # sessions whose only flags are the text detector's: the judge decides after the load
    pending = len(v.suspect_sessions - v.corrupted_sessions)
    if pending:
        out.append((2, f"{pending} more suspect"))
    # none so far says less than the ETA; some say more
    out.append((2 if v.transport_errors else 5, f"{v.transport_errors} transport err"))
    if v.cancelled:
        out.append((6, f"{v.cancelled} cancelled"))
    out.append((4, f"{v.sessions_done}/{v.sessions} sessions done"))
    return out


def variant_line(v: VariantCounts, now: float, width: int | None = None, name_w: int = 0) -> str:
    """The variant's line within ``width`` columns (None: no limit and no bar)."""
    parts = fields(v, now)
    name = v.label.ljust(name_w)

    def text(keep: list[tuple[int, str]], bar: str = "") -> str:
        return "  ".join([name, *([bar] if bar else []), " · ".join(t for _, t in keep)])

    if width is None:
        return text(parts)
    keep = list(parts)
    while len(text(keep)) > width and len(keep) > 1:
        drop = max(p for p, _ in keep)
        keep = [f for f in keep if f[0] != drop]
    over = len(text(keep)) - width
    if over > 0:  # even the turns alone do not fit: the name gives way, not the number
        name = name.rstrip()[: max(1, len(name.rstrip()) - over - 1)] + "…"
    room = width - len(text(keep)) - 2
    if room >= MIN_BAR and len(keep) == len(parts):  # the bar is the first to go
        bar_w = min(room, 40)
        frac = min(1.0, v.turns / v.planned_turns) if v.planned_turns else 0.0
        full = int(round(frac * bar_w))
        return text(keep, "━" * full + "╺" * (bar_w - full))
    return text(keep)


def run_line(progress: Progress, now: float, width: int | None = None) -> str:
    """The whole run in one line (shown above the variants when there are several); within
    ``width``, the load time goes first, then the ETA."""
    vs = list(progress.variants.values())
    done = sum(v.turns for v in vs)
    planned = sum(v.planned_turns for v in vs)
    elapsed = sum(v.elapsed_s(now) for v in vs)
    left = (planned - done) * elapsed / done if done else None
    eta = "?" if left is None else _clock(max(0.0, left))
    parts = [f"run: {done:,}/{planned:,} turns", f"{_clock(elapsed)} of load", f"ETA {eta}"]
    for drop in (1, 1):  # the load time gives way first, then the ETA
        if width is None or len(parts) == 1 or len(" · ".join(parts)) <= width:
            break
        parts.pop(min(drop, len(parts) - 1))
    return " · ".join(parts)


class ProgressView:
    """The rich renderable of the live display: it lays its lines out for the width it gets."""

    def __init__(self, progress: Progress) -> None:
        self.progress = progress

    def lines(self, width: int) -> list[str]:
        now = time.monotonic()
        vs = list(self.progress.variants.values())
        name_w = min(max((len(v.label) for v in vs), default=0), max(8, width // 3))
        out = [run_line(self.progress, now, width)] if len(vs) > 1 else []
        out += [variant_line(v, now, width, name_w) for v in vs]
        return [line[:width] if len(line) > width else line for line in out]

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        from rich.text import Text

        for line in self.lines(options.max_width):
            yield Text(line, no_wrap=True, overflow="crop")


class ConsoleLogHandler(logging.Handler):
    """Log records printed through the live display's console (above the display)."""

    def __init__(self, console: Console) -> None:
        super().__init__()
        self.console = console

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.console.print(self.format(record), markup=False, highlight=False)
        except Exception:  # noqa: BLE001 - logging must never raise
            self.handleError(record)


@contextlib.contextmanager
def logs_through(console: Console) -> Iterator[None]:
    """Route the root logger's output through ``console`` while the display is up."""
    root = logging.getLogger()
    saved = list(root.handlers)
    fmt = saved[0].formatter if saved else None
    handler = ConsoleLogHandler(console)
    handler.setFormatter(fmt or logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    for h in saved:
        root.removeHandler(h)
    root.addHandler(handler)
    try:
        yield
    finally:
        root.removeHandler(handler)
        for h in saved:
            root.addHandler(h)


async def live(
    progress: Progress, work: Callable[[Callable[[str], None]], Awaitable[T]], console: Console
) -> T:
    """Run ``work(announce)`` under the live display."""
    from rich.live import Live

    view = ProgressView(progress)
    with (
        Live(view, console=console, refresh_per_second=1 / REFRESH_S, transient=False) as display,
        logs_through(display.console),
    ):
        return await work(lambda m: display.console.print(m, highlight=False, markup=False))


async def plain(
    progress: Progress,
    work: Callable[[Callable[[str], None]], Awaitable[T]],
    write: Callable[[str], None],
    interval_s: float,
) -> T:
    """Run ``work(announce)``, writing the running variant's line every ``interval_s``."""
    told: dict[str, float | None] = {}  # label -> the finish time its last line showed
    last = time.monotonic()

    def tick(final: bool = False) -> None:
        nonlocal last
        now = time.monotonic()
        due = now - last >= interval_s
        for v in progress.variants.values():
            if v.finished is not None and not v.running:
                if told.get(v.label, -1.0) != v.finished:  # finished since its last line
                    write("progress " + variant_line(v, now))
                    told[v.label] = v.finished
            elif v.running and due and not final:
                write("progress " + variant_line(v, now))
                told[v.label] = None
        if due:
            last = now

    async def ticker() -> None:
        while True:
            await asyncio.sleep(min(REFRESH_S, interval_s))
            tick()

    def announce(message: str) -> None:
        tick()  # a variant that just finished has its line before the next announcement
        write(message)

    task = asyncio.create_task(ticker())
    try:
        return await work(announce)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        tick(final=True)
