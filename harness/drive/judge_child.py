"""One judging process (``python -m harness.drive.judge_child``): batches of answers in on
stdin, their verdicts out on stdout, one frame each (``harness.drive.judging``)."""

from __future__ import annotations

import contextlib
import os
import pickle
import signal
import sys
from typing import Any

from harness.drive.judging import JUDGE_NICENESS, READY, frame, judge_batch, warm


def main() -> int:
    # Ctrl-C and a closed terminal reach the whole process group: the parent stops us by
    # closing our input, after it has what it asked for
    for sig in (signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    # the event loop that times the requests comes first: on a core this process shares
    # with it, the loop, woken by a socket, preempts the judging at once instead of waiting
    # out a time slice of the scheduler's (tens of ms of lag); idle, it leaves the core here
    with contextlib.suppress(OSError, AttributeError):  # os.nice: not on every platform
        os.nice(JUDGE_NICENESS)
    inp = sys.stdin.buffer
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # stray prints must not corrupt the frames
    warm()
    out.write(READY)
    out.flush()
    tools: dict[int, list[dict[str, Any]]] = {}  # each tool list once, kept (by key)
    while True:
        header = inp.read(4)
        if len(header) < 4:
            return 0
        data = inp.read(int.from_bytes(header, "big"))
        new, asks = pickle.loads(data)
        tools.update(new)
        out.write(frame(judge_batch(tools, asks)))
        out.flush()


if __name__ == "__main__":
    sys.exit(main())
