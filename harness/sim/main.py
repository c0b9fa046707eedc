"""``harness sim``: run the embedded endpoint on a real socket until SIGTERM or SIGINT."""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import socket
import threading
from collections.abc import Callable, Generator
from dataclasses import fields
from pathlib import Path
from typing import Any

import uvicorn

from harness.argtypes import DefaultsHelpFormatter
from harness.argtypes import positive_float as _positive_float
from harness.argtypes import positive_int as _positive_int
from harness.argtypes import probability as _probability
from harness.errors import EXIT_OK, HarnessError, InfrastructureError, UsageError
from harness.portfile import write_port_file
from harness.sim.app import create_app
from harness.sim.config import (
    DEFAULT_MODEL,
    FAULT_KINDS,
    HICACHE,
    INDEX_K,
    REASONING,
    TOOL_PARSER,
    TOPK,
    SimConfig,
)
from harness.sim.speaker import DEFAULT_MODELS, spoken

log = logging.getLogger(__name__)


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be zero or more, got {text}")
    return value


def _count(text: str) -> int:
    value = int(text) if text.isdigit() else -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of requests")
    return value


def _port(text: str) -> int:
    value = int(text) if text.isdigit() else -1
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number (0 picks a free one)")
    return value


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="harness sim",
        description="An OpenAI-compatible endpoint that behaves like DeepSeek-V4 on SGLang "
        "(deepseekv4 tool-call parser), with the incident's fault model; --dialect makes its "
        "model write another tool-call dialect.",
        formatter_class=DefaultsHelpFormatter,
    )
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=_port, default=30000, help="0 binds a free port")
    p.add_argument("--port-file", type=Path, help="write the bound port here once listening")
    p.add_argument("--index-k", choices=INDEX_K, default="bf16", help="index-K cache precision")
    p.add_argument("--hicache", choices=HICACHE, default="on", help="hierarchical cache")
    p.add_argument("--topk", choices=TOPK, default="v2", help="top-k kernel (no effect)")
    p.add_argument("--speed", type=_positive_float, default=1.0, help="divides every delay")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--model",
        default=None,
        help=f"served model name (default: one that speaks --dialect; {DEFAULT_MODEL} for dsml-v4)",
    )
    p.add_argument(
        "--dialect",
        default="dsml-v4",
        metavar="NAME",
        help="the tool-call dialect the scripted model writes: "
        + ", ".join(spoken())
        + " (default: dsml-v4)",
    )
    p.add_argument(
        "--tool-parser",
        choices=TOOL_PARSER,
        default="on",
        help="on: the server parses the calls into tool_calls; off: it leaves the raw markup "
        "in content (a missing or failing server-side parser)",
    )
    p.add_argument(
        "--reasoning",
        choices=REASONING,
        default="off",
        help="a reasoning model: field (the server's reasoning parser returns reasoning_content), "
        "content (no parser: <think>...</think> in content), template (no parser, the block "
        "opened by the template: only </think> appears)",
    )
    p.add_argument(
        "--kv-capacity",
        type=_positive_int,
        default=50_000_000,
        help="KV pool capacity in tokens (the GPU tier; /server_info max_total_num_tokens)",
    )
    p.add_argument(
        "--hicache-ratio",
        type=_positive_float,
        default=2.0,
        help="host tier size as a multiple of --kv-capacity (with --hicache on)",
    )
    p.add_argument(
        "--calibrated-race",
        choices=("on", "off"),
        default="on",
        help="add the incident's calibrated race odds (on, the default) to the races of the "
        "modelled pool's load-backs; off: only load-backs from the host tier corrupt",
    )
    p.add_argument(
        "--chunk-tokens", type=_positive_int, default=4, help="output tokens per stream event"
    )
    p.add_argument(
        "--max-running",
        type=_positive_int,
        default=256,
        help="requests decoded at once; more wait in the queue",
    )
    p.add_argument(
        "--enable-deterministic-inference",
        action="store_true",
        help="as SGLang's flag: a request alone gives exactly what it gives under load, "
        "except where the race corrupts (it needs requests beside it)",
    )
    p.add_argument(
        "--kv-canary",
        choices=("off", "log"),
        default="off",
        help="as SGLang's: log a 'kv_canary violation' line when the race corrupts a response",
    )
    p.add_argument(
        "--scoring",
        choices=("on", "off"),
        default="on",
        help="off: no tokenize and no teacher-forced scores (404), as a server that cannot "
        "score a given text",
    )
    p.add_argument("--fault-scale", type=float, default=1.0, help=argparse.SUPPRESS)
    p.add_argument(
        "--fault-rate",
        type=_probability,
        default=None,
        metavar="P",
        help="corrupt each response with exactly this probability, whatever the load "
        "(replaces the incident's load-dependent odds; deterministic given --seed)",
    )
    p.add_argument("--force-fault", choices=FAULT_KINDS, default=None, help=argparse.SUPPRESS)
    faults = p.add_argument_group(
        "transport faults", "per-request probabilities, seeded like the corruption faults"
    )
    for kind, what in (
        ("error", "answer HTTP 500 or 503 with an OpenAI error body"),
        ("disconnect", "close the connection part-way through the response"),
        ("stall", "stop sending part-way through the response for --stall-seconds"),
        ("error-event", "send an SSE error event mid-stream (streamed requests only)"),
        ("bad-json", "send an invalid JSON body or SSE event"),
        (
            "unencodable",
            "fail the response as llama.cpp does when the generated bytes are no "
            "UTF-8 (an error event mid-stream, HTTP 500 otherwise): corruption the server reports",
        ),
    ):
        faults.add_argument(
            f"--{kind}-rate", type=_probability, default=0.0, metavar="P", help=what
        )
    faults.add_argument(
        "--stall-seconds",
        type=_positive_float,
        default=600.0,
        help="how long a stall lasts (the rest of the response follows)",
    )
    faults.add_argument(
        "--crash-after",
        type=_count,
        default=None,
        metavar="N",
        help="exit abruptly (no cleanup) when chat request N+1 arrives",
    )
    faults.add_argument(
        "--slow-start",
        type=_seconds,
        default=0.0,
        metavar="SECONDS",
        help="health endpoints answer 503 for this long after start",
    )
    p.add_argument(
        "--cache-report",
        choices=["on", "off"],
        default="on",
        help="usage.prompt_tokens_details.cached_tokens in answers (off: as SGLang without "
        "--enable-cache-report)",
    )
    p.add_argument(
        "--raw-bos",
        choices=["keep", "add"],
        default="keep",
        help="raw endpoints: add: tokenize as a server that puts its own BOS before a prompt "
        "(one token more when the prompt starts with one: a double BOS)",
    )
    p.add_argument(
        "--api-key-env",
        metavar="NAME",
        help="require the key in this environment variable as a bearer token (401 without)",
    )
    p.add_argument(
        "--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"]
    )
    return p


def config_from_args(args: argparse.Namespace) -> SimConfig:
    """The flags as a SimConfig: a flag named as a field is its value; the rest below."""
    given = vars(args)
    same = {f.name: given[f.name] for f in fields(SimConfig) if f.name in given}
    return SimConfig(**{
        **same,
        "deterministic": args.enable_deterministic_inference,
        "kv_canary": args.kv_canary == "log",
        "scoring": args.scoring == "on",
        "model": args.model or DEFAULT_MODELS.get(args.dialect, DEFAULT_MODEL),
        "calibrated_race": args.calibrated_race == "on",
        "cache_report": args.cache_report == "on",
        "raw_add_bos": args.raw_bos == "add",
        "api_key": _api_key(args.api_key_env),
    })  # fmt: skip


def _api_key(name: str | None) -> str | None:
    if name is None:
        return None
    key = os.environ.get(name)
    if not key:
        raise UsageError(f"--api-key-env {name}: the environment variable {name} is not set")
    return key


def bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket (port 0: a free one).

    Made with ``IPPROTO_TCP`` named: asyncio turns Nagle off (TCP_NODELAY) only on sockets
    whose protocol says TCP, and the accepted connections inherit it. With protocol 0 every
    answer on a kept-alive connection waited about 40 ms for the client's delayed ACK (the
    response's head and body are two writes), which made requests sent one at a time (the
    replay oracle's, the passkeys' alone) take 40 ms each whatever --speed said."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(2048)
    except OSError as exc:
        sock.close()
        raise InfrastructureError(f"cannot listen on {host}:{port}: {exc}") from None
    sock.set_inheritable(True)
    return sock


class SimServer(uvicorn.Server):
    """uvicorn.Server that reports when it listens and stops quietly on SIGTERM/SIGINT."""

    def __init__(self, config: uvicorn.Config, on_started: Callable[[], None] | None = None):
        super().__init__(config)
        self._on_started = on_started

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets=sockets)
        if self.started and self._on_started is not None:
            self._on_started()

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        handlers = {sig: signal.signal(sig, self._stop) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for sig, handler in handlers.items():
                signal.signal(sig, handler)

    def _stop(self, signum: int, frame: Any) -> None:
        log.info("signal %d: shutting down", signum)
        if self.should_exit and signum == signal.SIGINT:
            self.force_exit = True
        self.should_exit = True


def uvicorn_config(config: SimConfig, log_level: str = "warning") -> uvicorn.Config:
    return uvicorn.Config(
        create_app(config),
        log_level=log_level,
        access_log=log_level == "debug",
        lifespan="off",
        timeout_graceful_shutdown=3,
        backlog=2048,
        timeout_keep_alive=30,
    )


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        config = config_from_args(args)
        sock = bind(args.host, args.port)
    except HarnessError as exc:
        log.error("%s", exc)
        return exc.exit_code
    port = sock.getsockname()[1]

    def started() -> None:
        if args.port_file is not None:
            write_port_file(args.port_file, port)
        log.info("harness sim listening on http://%s:%d (%s)", args.host, port, config)

    server = SimServer(uvicorn_config(config, args.log_level), on_started=started)
    try:
        server.run(sockets=[sock])
    finally:
        sock.close()
    return EXIT_OK
