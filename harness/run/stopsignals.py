"""The signals that stop a run the way Ctrl-C does.

SIGTERM is what ``timeout``, a CI job's cancellation and Kubernetes send; SIGHUP is a closed
terminal or a dropped ssh session. Left to their defaults they end the process at once: no
turn in flight recorded, the launched servers left running with parent 1, no report. Caught
here, they cancel the run's main task instead, which is the path Ctrl-C takes (asyncio turns
SIGINT into the same cancellation): the turns in flight are recorded as cancelled, every
server's process group is stopped (SIGTERM, the grace period, then SIGKILL), and the report
is written from what was done. The exit code is 128 + the signal's number (130 for SIGINT,
143 for SIGTERM, 129 for SIGHUP), as a shell reports a process its signal ended.

A signal that comes while the run is stopping is ignored: the stop is under way, and the
sender's own deadline (``timeout -k``, Kubernetes' grace period) ends in SIGKILL anyway.
"""

from __future__ import annotations

import asyncio
import signal
from types import FrameType, TracebackType
from typing import Any

#: The signals caught here (SIGINT is asyncio's, which cancels the main task the same way).
CAUGHT = (signal.SIGTERM, signal.SIGHUP)


def exit_code(signum: int) -> int:
    return 128 + signum


def name(signum: int) -> str:
    return signal.Signals(signum).name


class StopSignals:
    """While entered, SIGTERM and SIGHUP cancel the task given to ``attach`` (or, before it
    runs, are remembered and cancel it as soon as it is attached)."""

    def __init__(self) -> None:
        self.received: int | None = None
        self._task: asyncio.Task[Any] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._saved: dict[int, Any] = {}

    def __enter__(self) -> StopSignals:
        for sig in CAUGHT:
            self._saved[sig] = signal.signal(sig, self._on_signal)
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        for sig, handler in self._saved.items():
            signal.signal(sig, handler)
        self._saved.clear()

    def attach(self, task: asyncio.Task[Any]) -> None:
        """The run's main task: a stop signal cancels it."""
        self._task = task
        self._loop = task.get_loop()
        if self.received is not None:
            task.cancel()

    def detach(self) -> None:
        self._task = self._loop = None

    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        if self.received is not None:
            return  # already stopping
        self.received = signum
        if self._loop is not None and self._task is not None and not self._task.done():
            # (a Python signal handler runs between two bytecodes of the main thread: the
            # cancel is handed to the loop rather than done in the middle of its work)
            self._loop.call_soon_threadsafe(self._task.cancel)
