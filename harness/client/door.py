"""The door: every HTTP request to a server that is not a session's turn.

Readiness, the model listing, the server's facts and version, its metrics, cache flushes,
warm-ups, probes, teacher-forced scoring and the clock offset of a shard all go through
``server_client``, the one place that says how the harness talks to a server outside a
session (the sessions' turns go through ``ChatClient``, which follows the same rules):

* TLS: certifi's CA bundle, not ``SSL_CERT_FILE``; the context is made once per process
  (``verify_context``: httpx would parse the bundle again for every client, 16 ms each,
  and a run makes about ten before its first request);
* proxies: none from the environment (``trust_env=False``): a probe reaches the server the
  way the turns do, and a ``Date`` header read for the clock offset is the server's own;
* auth: the API key as a bearer token (``auth_headers``); what to do when it is refused
  (``key_advice``, the one wording of it);
* timeouts: the caller names one of the budgets below.

The model listing (``/v1/models``) is asked here only: ``get_models`` on an open client,
``list_models`` for its cards alone.
"""

from __future__ import annotations

import ssl
from functools import cache
from typing import Any

import httpx

#: One short look at a server: its model list, its facts, the scoring shape, a probe.
LOOK_TIMEOUT_S = 10.0
#: One readiness poll (the wait as a whole has its own deadline).
POLL_TIMEOUT_S = 5.0
#: The version a server reports about itself (asked of three paths in turn).
VERSION_TIMEOUT_S = 3.0
#: A tiny generation (a probe, a scoring request): the server may be loading or busy.
GENERATE_TIMEOUT_S = 120.0
#: A cache flush (SGLang waits for the requests in flight).
FLUSH_TIMEOUT_S = 60.0
#: The warm-up requests (first requests compile graphs).
WARM_UP_TIMEOUT_S = 300.0

#: httpx's default connection pool (for a client not given ``max_connections``).
_LIMITS = httpx.Limits(max_connections=100, max_keepalive_connections=20)
#: The OpenAI model listing.
MODELS_PATH = "/v1/models"


@cache
def verify_context() -> ssl.SSLContext:
    """What every client of the harness verifies servers with, made once per process."""
    return httpx.create_ssl_context(trust_env=False)


def auth_headers(api_key: str | None) -> dict[str, str]:
    """The API key as a bearer token (nothing without one)."""
    return {"authorization": f"Bearer {api_key}"} if api_key else {}


#: The advice for a 401 or 403 (readiness, the model list, a session's first request), with
#: and without a key sent: one wording wherever it is said.
KEY_ADVICE = (
    "the server wants an API key: put it in OPENAI_API_KEY (or in the variable --api-key-env names)"
)
KEY_REFUSED = (
    "the API key sent was refused: check the key in OPENAI_API_KEY (or in the variable "
    "--api-key-env names)"
)
KEY_FORBIDDEN = "the API key is not allowed to use this endpoint or model"


def key_advice(status: int, key_sent: bool) -> str:
    """What to do about a 401 or 403."""
    if status == 403:
        return KEY_FORBIDDEN
    return KEY_REFUSED if key_sent else KEY_ADVICE


def server_client(
    base_url: str = "",
    *,
    api_key: str | None = None,
    timeout: float = LOOK_TIMEOUT_S,
    max_connections: int | None = None,
) -> httpx.AsyncClient:
    """A client for requests to ``base_url`` that are not a session's turn (use it as
    ``async with``): the project's certificates, no proxy from the environment, the key."""
    return httpx.AsyncClient(
        base_url=base_url,
        timeout=timeout,
        limits=httpx.Limits(max_connections=max_connections) if max_connections else _LIMITS,
        trust_env=False,
        verify=verify_context(),
        headers=auth_headers(api_key),
    )


async def get_models(http: httpx.AsyncClient) -> httpx.Response:
    """The server's answer to ``GET /v1/models`` (whatever it is)."""
    return await http.get(MODELS_PATH)


async def list_models(base_url: str, *, api_key: str | None = None) -> list[Any] | None:
    """The ``data`` list of the server's model listing, or None when none could be read
    (no answer, not JSON, no list)."""
    try:
        async with server_client(base_url, api_key=api_key) as http:
            doc = (await get_models(http)).json()
    except (httpx.HTTPError, ValueError):
        return None
    data = doc.get("data") if isinstance(doc, dict) else None
    return data if isinstance(data, list) else None
