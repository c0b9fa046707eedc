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
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx

from harness.client.door import (
    LOOK_TIMEOUT_S,
    MODELS_PATH,
    POLL_TIMEOUT_S,
    VERSION_TIMEOUT_S,
    get_models,
    key_advice,
    list_models,
    server_client,
)
from harness.errors import InfrastructureError, UsageError
from harness.target.spec import ENDPOINT_READY, ReadySpec

log = logging.getLogger(__name__)

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


#: Statuses of a server that answers but fails, whatever the wait (not 502/503/504: a proxy
#: or a server still starting answers those).
FAILING = frozenset({500, 501})


def seen(resp: httpx.Response) -> str:
    """What came back, as a person checks it: the status, the content type, the first bytes."""
    ctype = resp.headers.get("content-type", "no content type").split(";")[0].strip()
    head = resp.content[:60].decode("utf-8", "replace").strip()
    return (
        f"HTTP {resp.status_code}, {ctype}, starting {head!r}"
        if head
        else (f"HTTP {resp.status_code}, {ctype}, empty")
    )


def _html(resp: httpx.Response) -> bool:
    ctype = resp.headers.get("content-type", "").lower()
    return "html" in ctype or resp.content[:200].lstrip().startswith(b"<")


def _error_text(resp: httpx.Response) -> str:
    """The server's error message (OpenAI's ``{"error": {"message": ...}}``), else its body."""
    try:
        doc = resp.json()
        err = doc.get("error") if isinstance(doc, dict) else None
        msg = err.get("message") if isinstance(err, dict) else err
        if isinstance(msg, str) and msg:
            return msg[:300]
        if isinstance(doc, dict) and isinstance(doc.get("message"), str):
            return str(doc["message"])[:300]
    except ValueError:
        pass
    return resp.content[:300].decode("utf-8", "replace").strip() or "(empty body)"


def not_openai(base_url: str, path: str, resp: httpx.Response) -> UsageError:
    return UsageError(
        f"{base_url} is not an OpenAI-compatible API: GET {path} answered {seen(resp)} "
        "(a web page, such as a proxy's login page or a web UI); check the --endpoint URL"
    )


#: The hint that ends a closed port's message (the flag works for every kind of target).
WAIT_LONGER = "to wait for a server that is still starting, give --ready-timeout SECONDS"


async def _pause(seconds: float, alive: Callable[[], bool] | None) -> None:
    """Sleep ``seconds``, cut short the moment ``alive()`` says the server process died."""
    until = time.monotonic() + seconds
    while (left := until - time.monotonic()) > 0:
        if alive is not None and not alive():
            return
        await asyncio.sleep(min(left, 0.05))


async def wait_ready(
    base_url: str,
    ready: ReadySpec,
    *,
    alive: Callable[[], bool] | None = None,
    up_already: bool = False,
    api_key: str | None = None,
) -> str:
    """Poll the readiness paths until one answers 200; return it. ``alive()`` False (a server
    the harness started has died) fails at once, between polls as well.

    ``up_already`` (a server the harness did not start): an answer that no wait can change is
    said at once rather than waited on: every path 404, or an answer that is not HTTP
    (something else listens there), a web page (HTML), 401/403 (a key is needed: exit 2), 500
    or 501 on every path (the server is up and failing: its error said). A server still
    starting answers 503, waited on; a closed port (connection refused) for
    ``ready.refused_s`` is said with a hint (is the server up? how to wait longer)."""
    deadline = time.monotonic() + ready.timeout_s
    refused_for = min(ready.refused_s, ready.timeout_s)
    paths = ready.paths
    last = "no answer"
    refused_since: float | None = None
    async with server_client(base_url, api_key=api_key, timeout=POLL_TIMEOUT_S) as http:
        while time.monotonic() < deadline:
            if alive is not None and not alive():
                raise InfrastructureError(f"server at {base_url} exited while starting ({last})")
            missing = 0
            failing: list[tuple[str, httpx.Response]] = []
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
                    if refused and refused_since is None:
                        refused_since = time.monotonic()
                    elif not refused:
                        refused_since = None
                    break  # not listening yet: no point trying the other paths
                refused_since = None
                if up_already and resp.status_code == 200 and _html(resp):
                    raise not_openai(base_url, path, resp)
                if resp.status_code == 200:
                    return path
                last = f"{path}: HTTP {resp.status_code}"
                if up_already and resp.status_code in (401, 403):
                    raise UsageError(
                        f"{base_url} answered GET {path} with HTTP {resp.status_code} "
                        f"({_error_text(resp)}): {key_advice(resp.status_code, bool(api_key))}"
                    )
                if up_already and resp.status_code in FAILING:
                    failing.append((path, resp))
                    continue
                if resp.status_code != 404:
                    break
                missing += 1
            if up_already and missing == len(paths):
                raise InfrastructureError(
                    f"{base_url} is not an OpenAI-compatible server: GET "
                    f"{', '.join(paths)} all answered HTTP 404 (an OpenAI server serves "
                    "/v1/models); check the --endpoint URL and port"
                )
            if up_already and failing and len(failing) + missing == len(paths):
                path, resp = failing[0]
                raise InfrastructureError(
                    f"{base_url} is up but failing: GET {path} answered HTTP "
                    f"{resp.status_code}: {_error_text(resp)} (every readiness path answered "
                    "an error; the server's log says why)"
                )
            now = time.monotonic()
            if up_already and refused_since is not None and now - refused_since >= refused_for:
                break
            await _pause(min(ready.interval_s, max(deadline - now, 0.0)), alive)
    if alive is not None and not alive():
        raise InfrastructureError(f"server at {base_url} exited while starting ({last})")
    if up_already and refused_since is not None:
        raise InfrastructureError(
            f"nothing answers at {base_url} (connection refused for {refused_for:g}s): is "
            "the server up on that port? "
            f"({WAIT_LONGER})"
        )
    raise InfrastructureError(
        f"server at {base_url} not ready after {ready.timeout_s:.0f}s ({last})"
    )


async def check_api(base_url: str, api_key: str | None = None) -> None:
    """A server the harness did not start, once ready: does ``/v1/models`` answer as an
    OpenAI API does? A web page or a 401/403 there is said at once (exit 2); other answers
    are left to the run (some servers do not list models)."""
    async with server_client(base_url, api_key=api_key, timeout=LOOK_TIMEOUT_S) as http:
        try:
            resp = await get_models(http)
        except httpx.HTTPError:
            return
    if resp.status_code in (401, 403):
        raise UsageError(
            f"{base_url} answered GET /v1/models with HTTP {resp.status_code} "
            f"({_error_text(resp)}): {key_advice(resp.status_code, bool(api_key))}"
        )
    if resp.status_code == 200:
        if _html(resp):
            raise not_openai(base_url, MODELS_PATH, resp)
        try:
            doc = resp.json()
        except ValueError:
            doc = None
        if not isinstance(doc, dict) or not isinstance(doc.get("data"), list):
            raise UsageError(
                f"{base_url} is not an OpenAI-compatible API: GET /v1/models answered "
                f"{seen(resp)}, not a model list; check the --endpoint URL"
            )


class EndpointTarget:
    """A server that is already up (``--endpoint``, an endpoint-mode target file): readiness
    with every check of a server the harness did not start, then ``check_api``."""

    def __init__(
        self, base_url: str, ready: ReadySpec = ENDPOINT_READY, api_key: str | None = None
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.ready = ready
        self.api_key = api_key

    async def start(self) -> str:
        await wait_ready(self.base_url, self.ready, up_already=True, api_key=self.api_key)
        await check_api(self.base_url, self.api_key)
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


async def served_model(base_url: str, api_key: str | None = None) -> str | None:
    """The first model id in the server's /v1/models (None when it lists none, or could not
    be read)."""
    cards = await list_models(base_url, api_key=api_key)
    try:
        return str(cards[0]["id"]) if cards else None
    except (KeyError, IndexError, TypeError):
        return None


#: Where servers say their version: SGLang's /server_info ("version"), vLLM's /version,
#: llama.cpp's /props ("build_info").
VERSION_PATHS = (("/server_info", "version"), ("/version", "version"), ("/props", "build_info"))


async def server_version(base_url: str, api_key: str | None = None) -> str | None:
    """The version the server reports about itself, or None when it does not say."""
    async with server_client(base_url, api_key=api_key, timeout=VERSION_TIMEOUT_S) as http:
        for path, key in VERSION_PATHS:
            try:
                resp = await http.get(path)
                value = resp.json().get(key) if resp.status_code == 200 else None
            except (httpx.HTTPError, ValueError, AttributeError):
                continue
            if isinstance(value, str | int | float) and str(value):
                return str(value)[:80]
    return None


def died_message(death: Mapping[str, Any] | None) -> str:
    """The message of a server that died: "... during the run (killed by SIGSEGV)"."""
    text = "the server process died during the run"
    if not death:
        return text
    how = (
        f"killed by {death['signal']}"
        if death.get("signal")
        else f"exit code {death.get('exit_code')}"
    )
    return f"{text} ({how})"


async def watch(target: object, task: asyncio.Task[Any], interval_s: float = 0.5) -> str | None:
    """Cancel ``task`` if the target's server process dies; say why."""
    alive = getattr(target, "alive", None)
    if alive is None:
        return None
    while not task.done():
        if not alive():
            task.cancel()
            return died_message(getattr(target, "death", lambda: None)())
        await asyncio.sleep(interval_s)
    return None
