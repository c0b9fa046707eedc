"""What a loop that only sends, receives and time-stamps would cost: the floor of a design.

    python benchmarks/transport_floor.py                    # 300 sessions x 12 turns, 2 repeats
    python benchmarks/transport_floor.py --shape raw --repeats 3

The growing-context workload of ``perf_workload.py`` (its request bodies, recorded from one
``harness run``), replayed by four clients that do nothing with the answers, each on core 0
against a fresh ``null_endpoint.py`` on core 1:

- ``aiohttp``: the bare client of ``perf_workload.py`` (its session, the harness's transport
  settings), keeping each answer and one time stamp a read, as the protocol client does;
- ``protocol``: a bare ``asyncio.Protocol`` per connection, the request's head and body in one
  write, the response's head and chunked framing cut in ``data_received``, one time stamp a
  read;
- ``aiohttp+handoff`` and ``protocol+handoff``: the same, with every answer (its bytes and its
  per-read stamps) handed to another process over a socket, and the session's next request
  body coming back from it, as in a design where the stream's decoding, the verdict, the
  tools, the history and the record all live outside the loop's process (the other process
  here only reads the answer and sends the next recorded body back).

Each row: the endpoint's rate in the steady state (10th to 90th percentile arrival), the
loop process's CPU per request there (sampled from ``/proc``), and both as ratios to the
``aiohttp`` client's run in the same repeat. The handing-off process runs on core 0 too; its
CPU is not the loop's and is shown apart.

What the floor leaves out: the protocol client does plain HTTP/1.1 only (no TLS, no proxy, no
compression, no timeouts, no limits on what it reads, no retry of a request a kept-alive
connection dropped); each of those is what a transport the harness shipped would also need.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import perf_workload as pw  # noqa: E402

KINDS = ("aiohttp", "protocol", "aiohttp+handoff", "protocol+handoff")
FRAME = struct.Struct("!II")  # a request slot's id, the payload's size


class _Conn(asyncio.Protocol):
    """One kept-alive HTTP/1.1 connection: one request at a time, the answer's body and one
    (offset, time) stamp a read."""

    def __init__(self) -> None:
        self.transport: Any = None
        self._buf = b""
        self._in_body = False
        self._length = -1
        self._done: asyncio.Future[tuple[bytes, list[tuple[int, float]]]] | None = None
        self._parts: list[bytes] = []
        self._stamps: list[tuple[int, float]] = []
        self._got = 0

    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def send(self, data: bytes) -> asyncio.Future[tuple[bytes, list[tuple[int, float]]]]:
        self._done = asyncio.get_running_loop().create_future()
        self._in_body, self._parts, self._stamps, self._got = False, [], [], 0
        self.transport.write(data)
        return self._done

    def _finish(self, body: bytes) -> None:
        self._buf = b""
        done, self._done = self._done, None
        assert done is not None
        done.set_result((body, self._stamps))

    def data_received(self, data: bytes) -> None:
        self._stamps.append((self._got, time.perf_counter()))
        self._got += len(data)
        buf = self._buf + data if self._buf else data
        at = 0
        if not self._in_body:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                self._buf = buf
                return
            self._in_body, at = True, end + 4
            head = buf[:end].lower()
            k = head.find(b"content-length:")
            self._length = -1
            if k >= 0:
                stop = head.find(b"\r\n", k)
                self._length = int(head[k + 15 : stop if stop > 0 else end])
        if self._length >= 0:  # a whole JSON body
            if len(buf) - at < self._length:
                self._buf = buf[at:]
                return
            self._finish(buf[at : at + self._length])
            return
        while True:  # chunked: size line, data, CRLF
            eol = buf.find(b"\r\n", at)
            if eol < 0:
                break
            size = int(buf[at:eol], 16)
            if eol + 4 + size > len(buf):
                break
            if size == 0:
                self._finish(b"".join(self._parts))
                return
            self._parts.append(buf[eol + 2 : eol + 2 + size])
            at = eol + 4 + size
        self._buf = buf[at:]


class Bodies:
    """The next request body: from the recorded list, or (``handoff``) from another process,
    to which each answer goes first."""

    def __init__(self, path: Path, handoff: bool) -> None:
        self.handoff = handoff
        self._bodies = iter(pw.read_bodies(path)) if not handoff else iter(())
        self._waiting: dict[int, asyncio.Future[bytes | None]] = {}
        self._ids = 0
        if handoff:  # the other process starts before the loop does
            self._mine, theirs = socket.socketpair()
            fd = theirs.fileno()
            cmd = [sys.executable, __file__, "--feeder", str(fd), "--bodies", str(path)]
            self._child = subprocess.Popen(cmd, pass_fds=[fd])
            theirs.close()

    async def start(self) -> None:
        if not self.handoff:
            return
        self._reader, self._writer = await asyncio.open_connection(sock=self._mine)
        self._task = asyncio.ensure_future(self._read())

    async def _read(self) -> None:
        while True:
            try:
                ident, size = FRAME.unpack(await self._reader.readexactly(FRAME.size))
            except asyncio.IncompleteReadError:
                return
            body = await self._reader.readexactly(size) if size else None
            self._waiting.pop(ident).set_result(body)

    async def next(self, answer: tuple[bytes, list[tuple[int, float]]] | None) -> bytes | None:
        if not self.handoff:
            return next(self._bodies, None)
        self._ids += 1
        done = asyncio.get_running_loop().create_future()
        self._waiting[self._ids] = done
        msg = b""
        if answer is not None:
            data, stamps = answer
            flat = [x for stamp in stamps for x in stamp]
            msg = struct.pack(f"!I{len(flat)}d", len(stamps), *flat) + data
        self._writer.write(FRAME.pack(self._ids, len(msg)) + msg)
        return await done

    async def close(self) -> None:
        if self.handoff:
            self._writer.close()
            await self._writer.wait_closed()
            await asyncio.to_thread(self._child.wait)


def feeder(fd: int, path: Path) -> None:
    """The other process of a handoff: reads each answer, sends the next recorded body."""
    bodies = iter(pw.read_bodies(path))
    sock = socket.socket(fileno=fd)
    stream = sock.makefile("rwb", buffering=1 << 20)
    while True:
        head = stream.read(FRAME.size)
        if len(head) < FRAME.size:
            return
        ident, size = FRAME.unpack(head)
        if size:
            stream.read(size)  # the answer: decoded, judged and recorded here, in the design
        body = next(bodies, None)
        stream.write(FRAME.pack(ident, len(body or b"")) + (body or b""))
        stream.flush()


async def replay(kind: str, url: str, bodies: Bodies, concurrency: int) -> int:
    await bodies.start()
    if kind.startswith("protocol"):
        done = await _replay_protocol(url, bodies, concurrency)
    else:
        done = await _replay_aiohttp(url, bodies, concurrency)
    await bodies.close()
    return done


async def _replay_protocol(url: str, bodies: Bodies, concurrency: int) -> int:
    host, port = url.split("//", 1)[1].rsplit(":", 1)
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nhost: {host}:{port}\r\n"
        "content-type: application/json\r\naccept-encoding: identity\r\ncontent-length: "
    ).encode()
    loop = asyncio.get_running_loop()
    done = 0

    async def one() -> None:
        nonlocal done
        _, conn = await loop.create_connection(_Conn, host, int(port))
        body = await bodies.next(None)
        while body is not None:
            answer = await conn.send(b"".join((head, b"%d\r\n\r\n" % len(body), body)))
            done += 1
            body = await bodies.next(answer)
        conn.transport.close()

    await asyncio.gather(*(one() for _ in range(concurrency)))
    return done


async def _replay_aiohttp(url: str, bodies: Bodies, concurrency: int) -> int:
    done = 0
    async with pw.bare_session(concurrency) as session:

        async def one() -> None:
            nonlocal done
            body = await bodies.next(None)
            while body is not None:
                parts: list[bytes] = []
                stamps: list[tuple[int, float]] = []
                got = 0
                async with session.post(
                    url + "/v1/chat/completions", data=body, headers=pw.BARE_HEADERS
                ) as resp:
                    async for chunk in resp.content.iter_any():
                        stamps.append((got, time.perf_counter()))
                        got += len(chunk)
                        parts.append(chunk)
                done += 1
                body = await bodies.next((b"".join(parts), stamps))

        await asyncio.gather(*(one() for _ in range(concurrency)))
    return done


def run_kind(kind: str, path: Path, args: argparse.Namespace) -> dict[str, Any]:
    proc, url = pw.start_endpoint(shape=args.shape)
    try:
        cmd = ["taskset", "-c", pw.CLIENT_CORE, sys.executable, __file__, "--client", kind]
        cmd += ["--bodies", str(path), "--url", url, "--concurrency", str(args.concurrency)]
        done, sampler = pw.run_sampled(cmd)
        if done.returncode != 0:
            raise SystemExit(f"the {kind} client failed:\n{done.stderr[-3000:]}")
        arrivals = pw.stats(url)["arrivals"]
    finally:
        pw.stop(proc)
    loop_ms = sampler.steady_ms(arrivals, loop_only=True)
    return {
        "client": kind,
        "requests": len(arrivals),
        "rate": pw.steady_rate(arrivals),
        "loop_cpu_ms": loop_ms,
        "other_cpu_ms": sampler.steady_ms(arrivals) - loop_ms,
    }


def _ratio(a: float, b: float) -> float:
    """a / b; nan where b is 0 (a run too short for the 20 ms CPU samples)."""
    return a / b if b else float("nan")


def table(rows: list[dict[str, Any]], repeats: int) -> str:
    lines = [
        "| client (core 0) | requests/s | / aiohttp | loop CPU ms a request | aiohttp / it "
        "| the other process's CPU ms |",
        "|---|---:|---|---:|---|---:|",
    ]
    width = len(KINDS)
    for i, kind in enumerate(KINDS):
        mine = [rows[r * width + i] for r in range(repeats)]
        base = [rows[r * width] for r in range(repeats)]
        rate = [_ratio(m["rate"], b["rate"]) for m, b in zip(mine, base, strict=True)]
        cpu = [_ratio(b["loop_cpu_ms"], m["loop_cpu_ms"]) for m, b in zip(mine, base, strict=True)]

        def med(xs: list[float]) -> float:
            return statistics.median(xs)

        lines.append(
            f"| {kind} | {med([m['rate'] for m in mine]):,.0f} | {med(rate):.2f} "
            f"({min(rate):.2f}-{max(rate):.2f}) | {med([m['loop_cpu_ms'] for m in mine]):.3f} "
            f"| {med(cpu):.2f} ({min(cpu):.2f}-{max(cpu):.2f}) "
            f"| {med([m['other_cpu_ms'] for m in mine]):.3f} |"
        )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sessions", type=int, default=300)
    ap.add_argument("--concurrency", type=int, default=300)
    ap.add_argument("--turns", type=int, default=12)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--shape", choices=("raw", "parsed"), default="parsed")
    ap.add_argument("--bodies", type=Path, help="recorded bodies to reuse (else recorded now)")
    ap.add_argument("--client", choices=KINDS, help=argparse.SUPPRESS)  # one client, itself
    ap.add_argument("--url", help=argparse.SUPPRESS)
    ap.add_argument("--feeder", type=int, help=argparse.SUPPRESS)  # the handoff's process
    args = ap.parse_args()
    if args.feeder is not None:
        feeder(args.feeder, args.bodies)
        return
    if args.client:
        bodies = Bodies(args.bodies, args.client.endswith("+handoff"))
        sent = asyncio.run(replay(args.client, args.url, bodies, args.concurrency))
        print(json.dumps({"requests": sent}))
        return
    path = args.bodies or Path(tempfile.mkdtemp(prefix="floor-bodies-")) / "bodies.bin"
    if not path.exists():
        args.judges = args.judge_cores = None
        first = pw.run_harness(args, path)
        print(f"recorded {first['requests']} requests", file=sys.stderr)
    rows = []
    try:
        for _ in range(args.repeats):
            for kind in KINDS:
                row = run_kind(kind, path, args)
                rows.append(row)
                print(
                    f"{kind:>17}: {row['rate']:6.0f} requests/s, loop "
                    f"{row['loop_cpu_ms']:.3f} ms a request",
                    file=sys.stderr,
                )
    finally:
        if args.bodies is None:
            shutil.rmtree(path.parent, ignore_errors=True)
    print(table(rows, args.repeats))


if __name__ == "__main__":
    main()
