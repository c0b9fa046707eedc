"""Readiness and teardown shared by every target, and ``EndpointTarget`` (a server already up).

A server is ready once a readiness URL answers 200. Launched servers (see launch.py) run as
their own process group; ``stop_group`` signals the whole group, and every group still alive
at interpreter exit is killed, so nothing is left running whatever way the harness ends.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import logging
import os
import signal
import subprocess
import time
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx

from harness.errors import InfrastructureError, UsageError
from harness.tls import verify_context

log = logging.getLogger(__name__)

READINESS_PATHS = ("/health_generate", "/health", "/v1/models")

#: Every server process group this process started and has not stopped yet; killed at exit
#: so that nothing is left running whatever way the harness ends.
_LIVE: set[subprocess.Popen[bytes] | None] = set()


@atexit.register
def _stop_all() -> None:
    for proc in list(_LIVE):
        if proc is not None and proc.poll() is None:
            stop_group(proc, grace_s=3.0)


def normalize_endpoint(url: str) -> str:
    """``--endpoint`` as a base URL: ``HOST:PORT``, ``http://HOST:PORT``, ``.../v1`` (the form
    vLLM prints and OpenAI clients take) and ``.../v1/chat/completions`` all give
    ``http://HOST:PORT`` (the harness adds the API paths itself)."""
    text = url.strip()
    if "://" not in text:
        text = "http://" + text
    parts = urlsplit(text)
    if parts.scheme not in ("http", "https"):
        raise UsageError(f"--endpoint {url!r}: expected http://HOST:PORT (or HOST:PORT)")
    try:
        parts.port  # noqa: B018 - a port that is not a number raises here
    except ValueError:
        parts = parts._replace(netloc="")
    if not parts.hostname:
        raise UsageError(f"--endpoint {url!r}: expected http://HOST:PORT (or HOST:PORT)")
    path = parts.path.rstrip("/")
    for suffix in ("/chat/completions", "/v1"):
        if path.endswith(suffix):
            path = path[: -len(suffix)]
    return urlunsplit((parts.scheme, parts.netloc, path, "", ""))


async def wait_ready(
    base_url: str,
    *,
    timeout_s: float,
    paths: tuple[str, ...] = READINESS_PATHS,
    alive: Any = None,
    interval_s: float = 0.2,
    up_already: bool = False,
) -> str:
    """Poll the readiness paths until one answers 200; return it. ``alive()`` False fails fast.

    ``up_already`` (a server the harness did not start): when every path answers 404, or the
    answer is not HTTP, something else listens there; that is said at once rather than
    waited on (a server still starting answers 503, or does not listen yet)."""
    deadline = time.monotonic() + timeout_s
    last = "no answer"
    async with httpx.AsyncClient(
        base_url=base_url, timeout=5.0, trust_env=False, verify=verify_context()
    ) as http:
        while time.monotonic() < deadline:
            if alive is not None and not alive():
                raise InfrastructureError(f"server at {base_url} exited while starting ({last})")
            missing = 0
            for path in paths:
                try:
                    resp = await http.get(path)
                except httpx.RemoteProtocolError as exc:
                    if up_already:
                        raise InfrastructureError(
                            f"{base_url} is not an OpenAI-compatible server: it does not answer "
                            f"in HTTP ({exc}); check the --endpoint URL and port"
                        ) from None
                    last = f"{path}: {exc!r}"
                    break
                except httpx.HTTPError as exc:
                    cause = exc.__cause__ or exc.__context__
                    refused = isinstance(exc, httpx.ConnectError) or isinstance(
                        cause, ConnectionRefusedError
                    )
                    last = f"{path}: connection refused" if refused else f"{path}: {exc!r}"
                    break  # not listening yet: no point trying the other paths
                if resp.status_code == 200:
                    return path
                last = f"{path}: HTTP {resp.status_code}"
                if resp.status_code != 404:
                    break
                missing += 1
            if up_already and missing == len(paths):
                raise InfrastructureError(
                    f"{base_url} is not an OpenAI-compatible server: GET "
                    f"{', '.join(paths)} all answered HTTP 404 (an OpenAI server serves "
                    "/v1/models); check the --endpoint URL and port"
                )
            await asyncio.sleep(interval_s)
    raise InfrastructureError(f"server at {base_url} not ready after {timeout_s:.0f}s ({last})")


class EndpointTarget:
    """A server that is already up."""

    def __init__(self, base_url: str, ready_timeout_s: float = 10.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.ready_timeout_s = ready_timeout_s

    async def start(self) -> str:
        await wait_ready(self.base_url, timeout_s=self.ready_timeout_s, up_already=True)
        return self.base_url

    async def stop(self) -> None:
        return None

    def describe(self) -> dict[str, Any]:
        return {"mode": "endpoint", "url": self.base_url}


def stop_group(proc: subprocess.Popen[bytes], grace_s: float = 10.0) -> None:
    """SIGTERM the process group, then SIGKILL it after ``grace_s``."""
    try:
        pgid = os.getpgid(proc.pid)
    except ProcessLookupError:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGTERM)
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)
        proc.wait(timeout=5)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)  # stragglers of the group


async def served_model(base_url: str, api_key: str | None = None) -> str:
    """The first model id in the server's /v1/models ("default" when it lists none)."""
    headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        async with httpx.AsyncClient(
            base_url=base_url,
            timeout=10.0,
            trust_env=False,
            verify=verify_context(),
            headers=headers,
        ) as http:
            data = (await http.get("/v1/models")).json().get("data") or []
        return str(data[0]["id"])
    except (httpx.HTTPError, ValueError, KeyError, IndexError, AttributeError):
        return "default"


#: Where servers say their version: SGLang's /server_info ("version"), vLLM's /version,
#: llama.cpp's /props ("build_info").
VERSION_PATHS = (("/server_info", "version"), ("/version", "version"), ("/props", "build_info"))


async def server_version(base_url: str, api_key: str | None = None) -> str | None:
    """The version the server reports about itself, or None when it does not say."""
    headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
    async with httpx.AsyncClient(
        base_url=base_url, timeout=3.0, trust_env=False, verify=verify_context(), headers=headers
    ) as http:
        for path, key in VERSION_PATHS:
            try:
                resp = await http.get(path)
                value = resp.json().get(key) if resp.status_code == 200 else None
            except (httpx.HTTPError, ValueError, AttributeError):
                continue
            if isinstance(value, str | int | float) and str(value):
                return str(value)[:80]
    return None


async def watch(target: object, task: asyncio.Task[Any], interval_s: float = 0.5) -> str | None:
    """Cancel ``task`` if the target's server process dies; say why."""
    alive = getattr(target, "alive", None)
    if alive is None:
        return None
    while not task.done():
        if not alive():
            task.cancel()
            return "the server process died during the run"
        await asyncio.sleep(interval_s)
    return None
