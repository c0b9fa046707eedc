"""Judging off the timing path: the turns' verdicts in a pool of processes.

The event loop that sends the requests, reads the streams and stamps their times must not
also classify the answers: ``classify_turn`` costs 0.1-1.5 ms a turn (more for long answers),
and its first call loads the detector's model (about 0.2 s), during which no stream is read
and no request leaves. A ``Judge`` sends each answer to a process pool instead, in batches
(every answer that arrived in one pass of the event loop, split over the processes), and
hands the ``Verdict`` back to the session that waits for it: the session needs it before its
next request (a corrupted turn is sent again or ends the session; the calls it runs are the
verdict's), nothing else waits.

The processes are started and warmed (imports, the detector's model, the regular expressions
compiled, one turn classified) when the judge starts, before any load. ``classify_turn`` is
called with the same arguments as on the loop, so the verdicts are the same. ``processes=0``
classifies on the loop as before (a long answer in a thread). A pool that breaks (a process
killed) falls back to that too, with a warning.
"""

from __future__ import annotations

import asyncio
import atexit
import collections
import contextlib
import json
import logging
import os
import pickle
import subprocess
import sys
import threading
import traceback
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from harness import labels as L
from harness.verdict import Verdict, classify_turn

log = logging.getLogger(__name__)

#: answers up to this many characters are classified on the event loop when there is no
#: pool, longer ones in a thread (a 32k-character answer takes the classifier about 50 ms)
INLINE_CLASSIFY_CHARS = 32_000
#: at most this many turns in one batch sent to a process
BATCH_MAX = 64
#: verdicts handed to their sessions per pass of the event loop (``Judge._release``)
RELEASE_PER_PASS = 8
#: the pipes' buffer to and from each process (the default is 64 KB; a turn's context alone
#: is up to 8 KB)
PIPE_BYTES = 1 << 20


@dataclass(frozen=True)
class Ask:
    """One answer to classify: ``classify_turn``'s arguments (``tools`` by identity: a
    batch carries each distinct tool list once)."""

    content: str
    reasoning: str
    tool_calls: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    finish_reason: str | None
    dialect: str
    source: str
    context: str | None

    def wire(self, tools: int) -> tuple[Any, ...]:
        """This ask as a pool process receives it: its fields in order, a plain tuple (a
        dataclass pickles through ``copyreg`` and ``__reduce_ex__``, and a copy of it
        without its tools costs ``dataclasses.replace``), with ``tools`` the key of its tool
        list (-1: none)."""
        return (
            self.content,
            self.reasoning,
            self.tool_calls,
            tools,
            self.finish_reason,
            self.dialect,
            self.source,
            self.context,
        )

    @classmethod
    def from_wire(cls, row: Sequence[Any], tool_lists: Mapping[int, list[dict[str, Any]]]) -> Ask:
        """The ask of ``wire``, its tool list found by its key."""
        content, reasoning, tool_calls, key, finish_reason, dialect, source, context = row
        tools = tool_lists[key] if key >= 0 else None
        return cls(content, reasoning, tool_calls, tools, finish_reason, dialect, source, context)

    def size(self) -> int:
        n = len(self.content) + len(self.reasoning)
        return n + sum(len(str(c.get("arguments") or "")) for c in self.tool_calls)

    def classify(self) -> Verdict:
        return classify_turn(
            self.content,
            reasoning=self.reasoning,
            tool_calls=self.tool_calls,
            tools=self.tools,
            finish_reason=self.finish_reason,
            dialect=self.dialect,
            source=self.source,
            context=self.context,
        )


@dataclass(frozen=True)
class Failed:
    """The classifier raised on one answer (in a pool process): what to record and log."""

    kind: str
    message: str
    trace: str


_SAMPLE = Ask(
    content="Let me read the file first.",
    reasoning="The user wants the tests fixed; I will look at the failing module.",
    tool_calls=[{"name": "read_file", "arguments": '{"path": "src/app.py"}'}],
    tools=None,
    finish_reason="tool_calls",
    dialect="auto",
    source="server",
    context="def main():\n    return 0\n",
)


def warm() -> None:
    """Everything a first ``classify_turn`` loads: imports, the model, compiled patterns."""
    _SAMPLE.classify()
    replace(_SAMPLE, content="I am done.", tool_calls=[]).classify()


def judge_batch(
    tool_lists: Mapping[int, list[dict[str, Any]]], asks: Sequence[Sequence[Any]]
) -> list[Verdict | Failed]:
    """Classify a batch (in a pool process): each ask as ``Ask.wire`` sent it, its tool list
    by key (-1: none)."""
    out: list[Verdict | Failed] = []
    for row in asks:
        try:
            out.append(Ask.from_wire(row, tool_lists).classify())
        except Exception as exc:  # noqa: BLE001 - this answer's failure, not the batch's
            out.append(Failed(type(exc).__name__, str(exc), traceback.format_exc()))
    return out


def usable_cores() -> int:
    usable = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else ()
    return len(usable) or os.cpu_count() or 1


def auto_processes(drivers: int = 1) -> int:
    """``--judges auto``: the usable cores shared by the processes that drive sessions."""
    return max(1, usable_cores() // max(1, drivers))


READY = b"judge ready\n"
#: added to a judging process's niceness: the scheduler runs the event loop that sends and
#: times the requests before it (``judge_child``)
JUDGE_NICENESS = 10
_HEADER = 4  # a frame: its length (big-endian), then a pickle


def frame(obj: Any) -> bytes:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    return len(data).to_bytes(_HEADER, "big") + data


class _Process:
    """One judging process: its pipes, what is still to be written, the batches it owes."""

    def __init__(self, popen: subprocess.Popen[bytes]) -> None:
        self.popen = popen
        assert popen.stdin is not None
        assert popen.stdout is not None
        self.wfd = popen.stdin.fileno()
        self.rfd = popen.stdout.fileno()
        for fd in (self.wfd, self.rfd):  # a batch in one write, not 64 KB and a wake-up
            with contextlib.suppress(ImportError, OSError, AttributeError):  # Linux only
                import fcntl  # not on every platform

                fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, PIPE_BYTES)
        self.unsent = bytearray()
        self.received = bytearray()
        self.owed: collections.deque[list[tuple[Ask, asyncio.Future[Verdict | Failed]]]] = (
            collections.deque()
        )
        self.ready = False
        self.tools_sent: set[int] = set()


class Judge:
    """Classifies answers for the sessions of an event loop (one per process: ``shared``).

    The processes (``python -m harness.drive.judge_child``) talk over plain pipes that the
    event loop itself watches (``add_reader``): no helper thread waits for the GIL between a
    verdict and the session that needs it.
    """

    def __init__(self, processes: int) -> None:
        self.processes = max(0, processes)
        self._procs: list[_Process] = []
        self._pending: list[tuple[Ask, asyncio.Future[Verdict | Failed]]] = []
        self._verdicts: collections.deque[
            tuple[asyncio.Future[Verdict | Failed], Verdict | Failed]
        ] = collections.deque()  # back from the processes, not yet handed over
        self._releasing = False
        self._flushing = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._users = 0
        self._lock = threading.Lock()
        self._tool_keys: dict[str, int] = {}  # a tool list's JSON -> its number
        self._tool_ids: dict[int, tuple[int, list[dict[str, Any]]]] = {}
        self.judged = 0
        self.batches = 0
        self.broken = False

    @property
    def pooled(self) -> bool:
        return self.processes > 0 and not self.broken

    def pids(self) -> list[int]:
        return [p.popen.pid for p in self._procs]

    def start(self) -> None:
        """Start the processes (they import and warm up while the caller goes on); without
        a pool, warm this process (before the load it would stall)."""
        with self._lock:
            if self.processes == 0:
                warm()
                return
            if self._procs:
                return
            env = dict(os.environ)
            root = str(Path(__file__).resolve().parents[2])
            env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
            for _ in range(self.processes):
                popen = subprocess.Popen(
                    [sys.executable, "-m", "harness.drive.judge_child"],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    env=env,
                    bufsize=0,
                )
                self._procs.append(_Process(popen))

    def wait_ready(self) -> None:
        """Block until every process has warmed up (call it in a thread from a loop)."""
        self.start()
        with self._lock:
            for proc in self._procs:
                if proc.ready:
                    continue
                got = b""
                while len(got) < len(READY):
                    more = os.read(proc.rfd, len(READY) - len(got))
                    if not more:
                        break
                    got += more
                if got != READY:
                    self._fall_back(RuntimeError("a judging process did not start"))
                    return
                proc.ready = True
                os.set_blocking(proc.wfd, False)
                os.set_blocking(proc.rfd, False)

    def attach(self) -> None:
        """Watch the pipes on the running loop (after ``wait_ready``); ``detach`` undoes it."""
        loop = asyncio.get_running_loop()
        if self._users and self._loop is not loop:
            raise RuntimeError("the judge already serves another event loop")
        self._users += 1
        if self._users > 1 or not self.pooled:
            return
        self._loop = loop
        for proc in self._procs:
            loop.add_reader(proc.rfd, self._readable, proc)
            if proc.unsent:
                loop.add_writer(proc.wfd, self._writable, proc)

    def detach(self) -> None:
        self._users = max(0, self._users - 1)
        if self._users or self._loop is None:
            return
        for proc in self._procs:
            with contextlib.suppress(Exception):
                self._loop.remove_reader(proc.rfd)
                self._loop.remove_writer(proc.wfd)
        self._loop = None
        self._release()  # what is still held back goes at once (no pass of this loop to come)

    async def classify(self, ask: Ask) -> Verdict | Failed:
        """The verdict of one answer (or what the classifier raised)."""
        if not self.pooled or self._loop is not asyncio.get_running_loop():
            return await self._inline(ask)
        fut: asyncio.Future[Verdict | Failed] = self._loop.create_future()
        self._pending.append((ask, fut))
        if not self._flushing:
            self._flushing = True
            self._loop.call_soon(self._flush)
        return await fut

    async def _inline(self, ask: Ask) -> Verdict | Failed:
        try:
            if ask.size() <= INLINE_CLASSIFY_CHARS:
                return ask.classify()
            return await asyncio.to_thread(ask.classify)
        except Exception as exc:  # noqa: BLE001 - this answer's failure, not the run's
            return Failed(type(exc).__name__, str(exc), traceback.format_exc())

    def _flush(self) -> None:
        """Send what arrived in this pass of the loop: spread over the processes (the least
        busy first), at most ``BATCH_MAX`` a batch."""
        self._flushing = False
        pending, self._pending = self._pending, []
        pending = [(a, f) for a, f in pending if not f.done()]  # cancelled meanwhile
        if not pending:
            return
        if not self.pooled:
            for ask, fut in pending:
                self._redo(ask, fut)
            return
        size = min(BATCH_MAX, -(-len(pending) // len(self._procs)))
        for i in range(0, len(pending), size):
            part = pending[i : i + size]
            proc = min(self._procs, key=lambda p: len(p.owed))
            new: dict[int, list[dict[str, Any]]] = {}
            asks: list[tuple[Any, ...]] = []
            for ask, _ in part:
                if ask.tools is None:
                    asks.append(ask.wire(-1))
                    continue
                key = self._tools_key(ask.tools)
                if key not in proc.tools_sent:
                    proc.tools_sent.add(key)
                    new[key] = ask.tools
                asks.append(ask.wire(key))
            proc.owed.append(part)
            self.batches += 1
            self._write(proc, frame((new, asks)))

    def _tools_key(self, tools: list[dict[str, Any]]) -> int:
        """A tool list's number, the same for lists of the same content (every session
        builds its own): each process is sent it once and keeps it, so its schemas'
        validators are found by identity there, however many sessions a run has."""
        seen = self._tool_ids.get(id(tools))
        if seen is not None and seen[1] is tools:
            return seen[0]
        text = json.dumps(tools, sort_keys=True, default=str)  # once per list object
        key = self._tool_keys.setdefault(text, len(self._tool_keys))
        if len(self._tool_ids) >= 4096:  # the lists of sessions long ended
            self._tool_ids.clear()
        self._tool_ids[id(tools)] = (key, tools)  # kept: the id is not reused meanwhile
        return key

    def _write(self, proc: _Process, data: bytes) -> None:
        if not proc.unsent:
            try:
                sent = os.write(proc.wfd, data)
            except BlockingIOError:
                sent = 0
            except OSError as exc:
                self._died(proc, exc)
                return
            data = data[sent:]
            if not data:
                return
            assert self._loop is not None
            self._loop.add_writer(proc.wfd, self._writable, proc)
        proc.unsent += data

    def _writable(self, proc: _Process) -> None:
        try:
            sent = os.write(proc.wfd, proc.unsent)
        except BlockingIOError:
            return
        except OSError as exc:
            self._died(proc, exc)
            return
        del proc.unsent[:sent]
        if not proc.unsent and self._loop is not None:
            self._loop.remove_writer(proc.wfd)

    def _readable(self, proc: _Process) -> None:
        try:
            data = os.read(proc.rfd, 1 << 20)
        except BlockingIOError:
            return
        except OSError as exc:
            self._died(proc, exc)
            return
        if not data:
            self._died(proc, EOFError("the judging process closed its output"))
            return
        buf = proc.received
        buf += data
        while len(buf) >= _HEADER:
            n = int.from_bytes(buf[:_HEADER], "big")
            if len(buf) < _HEADER + n:
                break
            results: list[Verdict | Failed] = pickle.loads(buf[_HEADER : _HEADER + n])
            del buf[: _HEADER + n]
            part = proc.owed.popleft()
            self.judged += len(results)
            self._verdicts.extend(zip((fut for _, fut in part), results, strict=True))
        if self._verdicts and not self._releasing:
            self._release()

    def _release(self) -> None:
        """Hand ``RELEASE_PER_PASS`` verdicts to their sessions, the rest in the next passes:
        each session goes on at once to its tools, its record and its next request, and a
        batch of 64 of them in one pass held the loop (and every time stamp) for tens of ms."""
        verdicts, loop = self._verdicts, self._loop
        for _ in range(min(RELEASE_PER_PASS if loop else len(verdicts), len(verdicts))):
            fut, result = verdicts.popleft()
            if not fut.done():
                fut.set_result(result)
        self._releasing = bool(verdicts)
        if loop is not None and verdicts:
            loop.call_soon(self._release)

    def _died(self, proc: _Process, exc: BaseException) -> None:
        """A process is gone: what it owed is judged here, and so is everything after."""
        self._fall_back(exc)
        self.detach_all()
        for procs in self._procs:
            while procs.owed:
                for ask, fut in procs.owed.popleft():
                    self._redo(ask, fut)

    def detach_all(self) -> None:
        if self._loop is None:
            return
        for proc in self._procs:
            with contextlib.suppress(Exception):
                self._loop.remove_reader(proc.rfd)
                self._loop.remove_writer(proc.wfd)

    def _redo(self, ask: Ask, fut: asyncio.Future[Verdict | Failed]) -> None:
        async def again() -> None:
            result = await self._inline(ask)
            if not fut.done():
                fut.set_result(result)

        task = asyncio.ensure_future(again())
        fut.add_done_callback(lambda f: task.cancel() if f.cancelled() else None)

    def _fall_back(self, exc: BaseException) -> None:
        if not self.broken:
            log.warning(
                "the judging processes stopped (%s: %s): the answers are classified on the "
                "event loop from now on, which delays the harness's own sends",
                type(exc).__name__,
                exc,
            )
        self.broken = True

    def close(self, wait: bool = False) -> None:
        """Stop the processes: their input closes, and they exit."""
        self.detach_all()
        self._loop = None
        for proc in self._procs:
            with contextlib.suppress(OSError):
                assert proc.popen.stdin is not None
                proc.popen.stdin.close()
            if wait:
                try:
                    proc.popen.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    proc.popen.kill()
                    proc.popen.wait()
            with contextlib.suppress(OSError):
                assert proc.popen.stdout is not None
                proc.popen.stdout.close()
        self._procs = []


_shared: Judge | None = None
_shared_lock = threading.Lock()


def shared(processes: int | None = None) -> Judge:
    """This process's judge, started on first use with ``processes`` (None: ``auto``); a
    later call asking for another size replaces it."""
    global _shared
    want = auto_processes() if processes is None else processes
    with _shared_lock:
        if _shared is not None and (_shared.processes == want and not _shared.broken):
            return _shared
        if _shared is not None:
            _shared.close()
        _shared = Judge(want)
        _shared.start()
        return _shared


@atexit.register
def _close_shared() -> None:
    """Stop the shared pool while the interpreter is whole (not in its teardown)."""
    global _shared
    with _shared_lock:
        if _shared is not None:
            _shared.close(wait=True)
            _shared = None


def failed_verdict(failed: Failed, session: int, turn: int) -> Verdict:
    """The verdict of an answer the classifier raised on, as ``harness_error`` makes it."""
    log.error(
        "session %d turn %d: the harness failed classifying the answer\n%s",
        session,
        turn,
        failed.trace,
    )
    reason = f"classifying the answer: {failed.kind}: {failed.message}"[:500]
    return Verdict(L.HARNESS_ERROR, False, evidence={"reason": reason})


__all__ = [
    "Ask",
    "Failed",
    "Judge",
    "auto_processes",
    "failed_verdict",
    "judge_batch",
    "shared",
]
