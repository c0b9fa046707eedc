"""Bring one variant's server up from a target file: launch, endpoint map or hooks.

All three classes have the shape of ``readiness.EndpointTarget``: ``await start()`` returns
the base URL once a readiness path answers 200, ``await stop()`` is idempotent and never
raises, ``describe()`` says what would be done (for ``--dry-run``) without doing it.

A launched server runs as its own process group (``start_new_session``) with its output in
``<run_dir>/servers/<variant>.log``; the whole group is killed at the end, on error, on
Ctrl-C (cancellation) and, as a last resort, at interpreter exit (``readiness._LIVE``).
Factor levels never reach a shell: in launch mode they select argv entries of the file, in
hook mode they are passed to the hook commands as environment variables only.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO, Any, Protocol

from harness.errors import InfrastructureError
from harness.record.rundir import RunDir
from harness.target.readiness import _LIVE, EndpointTarget, stop_group, wait_ready
from harness.target.spec import ReadySpec, TargetSpec, shown_values, substitute
from harness.workload.matrix import Variant

log = logging.getLogger(__name__)

LOG_TAIL_LINES = 20


class Target(Protocol):
    async def start(self) -> str: ...
    async def stop(self) -> None: ...
    def describe(self) -> dict[str, Any]: ...


_UNSAFE = re.compile(r"[^A-Za-z0-9_.:+-]")


def safe_label(variant: Variant) -> str:
    """A file name for a variant, never a path: the harness's own labels hold only
    [A-Za-z0-9_.:+-] and ``=`` ``,``; anything else (a label read from a crafted run folder:
    ``../``, ``/``) becomes ``_``, and a leading dot is kept from naming ``..``."""
    name = _UNSAFE.sub("_", variant.label.replace("=", "-").replace(",", "_"))
    return "_" + name if name.startswith(".") else name


#: lines of a dead server's log kept with the finding (what it said last)
DEATH_TAIL_LINES = 12


def log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    """The last ``lines`` lines of a log file (bounded read), or '' if there is none."""
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - 64 * 1024))
            data = fh.read()
    except OSError:
        return ""
    text = data.decode("utf-8", errors="replace")
    return "\n".join(text.splitlines()[-lines:])


def last_words(path: Path, lines: int = DEATH_TAIL_LINES) -> list[str]:
    """What a dead server said last: the lines of its log before a crash report (Python's
    ``Fatal Python error: Segmentation fault`` and the thread stacks after it say where
    Python was, not what the engine did), then that line; else its last ``lines`` lines."""
    tail = log_tail(path, 4000).splitlines()
    fatal = [i for i, line in enumerate(tail) if line.startswith("Fatal Python error")]
    if not fatal:
        return tail[-lines:]
    i = fatal[-1]
    return [*tail[max(0, i - lines + 1) : i], tail[i]]


def free_port(host: str = "127.0.0.1") -> int:
    """A port nobody listens on right now (the OS picks it)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def connect_host(host: str) -> str:
    if host in ("", "0.0.0.0"):
        return "127.0.0.1"
    if host == "::":
        return "[::1]"
    return f"[{host}]" if ":" in host else host


def masked(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` for display: values of secret-looking names replaced by ``***``."""
    return shown_values(env)


def variant_env(variant: Variant) -> dict[str, str]:
    """The hook environment that carries a variant: HARNESS_VARIANT, HARNESS_FACTOR_<NAME>."""
    env = {"HARNESS_VARIANT": variant.label}
    for name, level in variant.factors:
        env[f"HARNESS_FACTOR_{name.upper()}"] = level
    return env


def level_additions(spec: TargetSpec, variant: Variant) -> tuple[list[str], dict[str, str]]:
    """The argv and environment the variant's levels add (in factor order)."""
    spec.check_variant(variant)
    args: list[str] = []
    env: dict[str, str] = {}
    for name, level in variant.factors:
        entry = spec.level_spec(name, level)
        assert entry is not None  # check_variant said so
        args.extend(entry.args)
        env.update(entry.env)
    return args, env


def _ready_said(ready: ReadySpec) -> dict[str, Any]:
    """The readiness check as ``describe`` says it."""
    return {"paths": list(ready.paths), "timeout_s": ready.timeout_s}


async def _ready(base_url: str, ready: ReadySpec, alive: Callable[[], bool] | None) -> None:
    """Wait until the server the harness started (or reconfigured) answers one of the
    target file's readiness paths; ``alive()`` False ends the wait at once."""
    await wait_ready(base_url, ready, alive=alive)


class LaunchTarget:
    """The target file's command, started per variant on a free loopback port."""

    def __init__(
        self,
        spec: TargetSpec,
        variant: Variant,
        run_dir: Path,
        *,
        extra_args: Sequence[str] = (),
        repeat: int = 0,
    ) -> None:
        if spec.launch is None:
            raise ValueError("LaunchTarget needs a launch-mode target")
        self.spec = spec
        self.launch = spec.launch
        self.variant = variant
        self.repeat = repeat
        self.log_path = RunDir(run_dir).server_log(f"{safe_label(variant)}.log")
        self.level_args, self.level_env = level_additions(spec, variant)
        self.extra_args = list(extra_args)
        self.proc: subprocess.Popen[bytes] | None = None
        self.base_url = ""
        self._log: IO[bytes] | None = None
        self._stopped = False

    def argv(self, port: int | str, *, reveal: bool = True) -> list[str]:
        """The command; ``reveal=False``: as written or printed (secret-looking variables
        masked, ``{env:NAME}`` left unread)."""
        values = self._values(port, reveal)
        return [
            substitute(a, values, reveal=reveal) for a in (*self.launch.command, *self.level_args)
        ] + self.extra_args

    def added_env(self, port: int | str = "<port>", *, reveal: bool = True) -> dict[str, str]:
        values = self._values(port, reveal)
        merged = {**self.launch.env, **self.level_env}
        return {k: substitute(v, values, reveal=reveal) for k, v in merged.items()}

    def _values(self, port: int | str, reveal: bool = True) -> dict[str, str]:
        return {
            **(self.spec.vars if reveal else shown_values(self.spec.vars)),
            "model": self.spec.model,
            "port": str(port),
            "host": self.launch.host,
            "python": sys.executable,
        }

    def describe(self) -> dict[str, Any]:
        host = connect_host(self.launch.host)
        return {
            "mode": "launch",
            "variant": self.variant.label,
            "command": self.argv("<port>", reveal=False),
            "env": masked(self.added_env(reveal=False)),
            "cwd": str(self.launch.cwd) if self.launch.cwd else None,
            "url": f"http://{host}:<port>",
            "ready": _ready_said(self.spec.ready),
            "log": str(self.log_path),
        }

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def death(self) -> dict[str, Any] | None:
        """How the server process ended when nobody stopped it (None while it runs, or when
        the harness stopped it): its exit code, the signal that killed it, the last lines
        of its log (what it said)."""
        code = self.proc.poll() if self.proc is not None else None
        if code is None or self._stopped:
            return None
        killed = None
        if code < 0:
            with contextlib.suppress(ValueError):
                killed = signal.Signals(-code).name
        return {
            "exit_code": code,
            "signal": killed,
            "log": str(self.log_path),
            "last_lines": last_words(self.log_path),
        }

    async def start(self) -> str:
        port = free_port(
            self.launch.host if self.launch.host not in ("", "0.0.0.0") else "127.0.0.1"
        )
        argv = self.argv(port)
        env = {**os.environ, **self.added_env(port)}
        self.base_url = f"http://{connect_host(self.launch.host)}:{port}"
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        shown = shlex.join(self.argv(port, reveal=False))
        self._log = self._open_log(shown)
        self._stopped = False
        log.info("variant %s: starting %s", self.variant.label, shown)
        try:
            self.proc = subprocess.Popen(  # noqa: ASYNC220 - fork only, no wait
                argv,
                stdout=self._log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                cwd=self.launch.cwd,
                start_new_session=True,
            )
        except OSError as exc:
            self._close_log()
            raise InfrastructureError(
                f"{self.spec.path}: could not start {argv[0]!r} for variant "
                f"{self.variant.label}: {exc}"
            ) from None
        _LIVE.add(self.proc)
        try:
            await _ready(self.base_url, self.spec.ready, alive=self.alive)
        except InfrastructureError as exc:
            code = self.proc.poll()
            await self.stop()
            why = f"exited with code {code}" if code is not None else str(exc)
            raise InfrastructureError(
                f"server for variant {self.variant.label} did not become ready: {why}; "
                f"log {self.log_path}, last lines:\n{log_tail(self.log_path)}"
            ) from None
        except BaseException:
            await self.stop()
            raise
        if not self.alive():  # something else answered on the port and ours is gone
            code = self.proc.poll()
            await self.stop()
            raise InfrastructureError(
                f"server for variant {self.variant.label} exited with code {code} although "
                f"{self.base_url} answered (port taken by another process?); log "
                f"{self.log_path}, last lines:\n{log_tail(self.log_path)}"
            )
        log.info("variant %s: ready at %s", self.variant.label, self.base_url)
        return self.base_url

    def _open_log(self, shown: str) -> IO[bytes]:
        fh = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        header = f"=== {stamp} repeat {self.repeat}: {shown}\n"
        fh.write(header.encode())
        fh.flush()
        return fh

    def _close_log(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None

    async def stop(self) -> None:
        proc = self.proc
        if proc is not None and not self._stopped:
            self._stopped = True
            if proc.poll() is None:
                grace = self.launch.stop_grace_s
                try:
                    await asyncio.shield(asyncio.to_thread(stop_group, proc, grace))
                except asyncio.CancelledError:
                    stop_group(proc, min(grace, 3.0))  # Ctrl-C during stop: finish it now
                    raise
            else:  # the leader is gone; its group may not be
                _kill_group(proc.pid)
            _LIVE.discard(proc)
        self._close_log()


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


class EndpointMapTarget(EndpointTarget):
    """A server that is already up, chosen by the variant from the ``[endpoints]`` table:
    the checks of ``--endpoint`` (a web page, a key wanted, a server failing everywhere, a
    closed port), the file's readiness paths and timeout."""

    def __init__(self, spec: TargetSpec, variant: Variant, api_key: str | None = None) -> None:
        super().__init__(spec.endpoint_for(variant), spec.ready, api_key)
        self.spec = spec
        self.variant = variant

    def describe(self) -> dict[str, Any]:
        return {
            "mode": "endpoint",
            "variant": self.variant.label,
            "url": self.base_url,
            "ready": _ready_said(self.spec.ready),
        }


class HookTarget:
    """Shell hooks reconfigure a deployment before/after a variant; levels arrive as env only."""

    def __init__(
        self, spec: TargetSpec, variant: Variant, run_dir: Path, *, repeat: int = 0
    ) -> None:
        if spec.hook is None or spec.base_url is None:
            raise ValueError("HookTarget needs a hook-mode target")
        self.spec = spec
        self.hook = spec.hook
        self.variant = variant
        self.repeat = repeat
        self.run_dir = run_dir
        self.base_url = spec.base_url
        self.log_path = RunDir(run_dir).server_log(f"{safe_label(variant)}.hook.log")
        _, self.level_env = level_additions(spec, variant)
        self._before_done = False
        self._stopped = False

    def hook_env(self, phase: str, *, reveal: bool = True) -> dict[str, str]:
        """What the hooks see added to the environment (levels only here, never in argv);
        ``reveal=False``: as printed (secrets masked, ``{env:NAME}`` unread)."""
        own = self.spec.vars if reveal else shown_values(self.spec.vars)
        values = {**own, "model": self.spec.model, "python": sys.executable}
        configured = {**self.hook.env, **self.level_env}
        return {
            **{k: substitute(v, values, reveal=reveal) for k, v in configured.items()},
            **variant_env(self.variant),
            "HARNESS_PHASE": phase,
            "HARNESS_REPEAT": str(self.repeat),
            "HARNESS_BASE_URL": self.base_url,
            "HARNESS_RUN_DIR": str(self.run_dir),
        }

    def describe(self) -> dict[str, Any]:
        return {
            "mode": "hook",
            "variant": self.variant.label,
            "before": self.hook.before,
            "after": self.hook.after,
            "env": masked(self.hook_env("before|after", reveal=False)),
            "url": self.base_url,
            "ready": _ready_said(self.spec.ready),
            "log": str(self.log_path),
        }

    async def start(self) -> str:
        self._stopped = False
        self._before_done = True  # 'after' runs even if 'before' failed half-way
        if self.hook.before:
            await self._run_hook("before", self.hook.before)
        await _ready(self.base_url, self.spec.ready, None)
        return self.base_url

    async def stop(self) -> None:
        """Run the 'after' hook once if 'before' ran; a failure is logged, never raised."""
        if self._stopped or not self._before_done:
            return
        self._stopped = True
        if self.hook.after:
            try:
                await self._run_hook("after", self.hook.after)
            except InfrastructureError as exc:
                log.error("%s", exc)

    async def _run_hook(self, phase: str, command: str) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, **self.hook_env(phase)}
        with open(self.log_path, "ab") as fh:  # noqa: ASYNC230 - a header line
            fh.write(f"=== {phase} (repeat {self.repeat}): {command}\n".encode())
            fh.flush()
            proc = subprocess.Popen(  # noqa: ASYNC220 - fork only, waited in a thread
                ["/bin/sh", "-c", command],  # the command text is the file's, never a level
                stdout=fh,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                cwd=self.spec.path.parent,
                start_new_session=True,
            )
        _LIVE.add(proc)
        try:
            code = await asyncio.wait_for(asyncio.to_thread(_wait, proc), self.hook.timeout_s)
        except TimeoutError:
            await asyncio.to_thread(stop_group, proc, 5.0)
            raise InfrastructureError(
                f"{self.spec.path}: {phase} hook for variant {self.variant.label} did not finish "
                f"in {self.hook.timeout_s:.0f}s; log {self.log_path}:\n{log_tail(self.log_path)}"
            ) from None
        except BaseException:
            stop_group(proc, 3.0)
            raise
        finally:
            _LIVE.discard(proc)
        if code != 0:
            raise InfrastructureError(
                f"{self.spec.path}: {phase} hook for variant {self.variant.label} exited with "
                f"code {code}; log {self.log_path}, last lines:\n{log_tail(self.log_path)}"
            )


def _wait(proc: subprocess.Popen[bytes]) -> int:
    return proc.wait()


def make_target(
    spec: TargetSpec,
    variant: Variant,
    run_dir: Path,
    *,
    extra_args: Sequence[str] = (),
    repeat: int = 0,
    api_key: str | None = None,
) -> LaunchTarget | HookTarget | EndpointMapTarget:
    """The target for one variant (no side effects until ``start()``); ``api_key`` is sent
    to a server already up (endpoint mode) from its readiness on."""
    if spec.mode == "launch":
        return LaunchTarget(spec, variant, run_dir, extra_args=extra_args, repeat=repeat)
    if spec.mode == "hook":
        return HookTarget(spec, variant, run_dir, repeat=repeat)
    return EndpointMapTarget(spec, variant, api_key)


def check_variants(spec: TargetSpec, variants: Sequence[Variant]) -> None:
    """Fail before anything starts if a variant uses a level the file does not define."""
    for v in variants:
        spec.check_variant(v)


def describe_env(env: Mapping[str, str]) -> str:
    return " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
