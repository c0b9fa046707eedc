"""The TLS context every HTTP client of the harness verifies servers with, made once.

httpx builds a context for each client it makes (certifi's CA bundle read and parsed: 16 ms),
and a run makes about ten before its first request (readiness, the served model, the
server's configuration, its version, its cache statistics). They all ask for the same one
(``trust_env=False``: certifi's bundle, no ``SSL_CERT_FILE``), so it is made at first use and
shared.
"""

from __future__ import annotations

import ssl
from functools import cache

import httpx


@cache
def verify_context() -> ssl.SSLContext:
    """What ``httpx.AsyncClient(trust_env=False)`` verifies with, made once per process."""
    return httpx.create_ssl_context(trust_env=False)
