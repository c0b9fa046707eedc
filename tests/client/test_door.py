"""The door: every request to a server that is not a session's turn goes through one client
shape, built in one place."""

from __future__ import annotations

import re
import socket
from collections.abc import Callable
from pathlib import Path

from harness.client.door import (
    LOOK_TIMEOUT_S,
    auth_headers,
    list_models,
    server_client,
    verify_context,
)

PACKAGE = Path(__file__).resolve().parents[2] / "harness"
#: What builds an HTTP client (or sends a request without one).
BUILDS = re.compile(
    r"httpx\.(?:Async)?Client\(|httpx\.(?:get|post|stream|request)\(|aiohttp\.ClientSession\("
    r"|aiohttp\.request\(|urlopen\(|http\.client\b|\brequests\.(?:get|post|Session)\("
)
#: Servers are not clients; a launcher polls the health of the server it started.
EXEMPT = {"sim", "servers"}


def test_only_the_client_package_builds_http_clients() -> None:
    found = [
        f"{path.relative_to(PACKAGE)}:{n}"
        for path in sorted(PACKAGE.rglob("*.py"))
        if path.relative_to(PACKAGE).parts[0] not in {"client", *EXEMPT}
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if BUILDS.search(line)
    ]
    assert found == []


def test_the_model_listing_is_asked_in_one_place() -> None:
    asked = [
        str(path.relative_to(PACKAGE))
        for path in sorted(PACKAGE.rglob("*.py"))
        if path.relative_to(PACKAGE).parts[0] not in EXEMPT
        and re.search(r"\.get\(\s*[\"']/v1/models", path.read_text(encoding="utf-8"))
    ]
    assert asked == []  # (door.get_models, by MODELS_PATH)


async def test_one_client_shape() -> None:
    async with server_client("http://127.0.0.1:1", api_key="k", timeout=3.0) as http:
        assert http.headers["authorization"] == "Bearer k"
        assert http.timeout.read == 3.0
        assert not http.trust_env  # no proxy, no certificates from the environment
    async with server_client("http://127.0.0.1:1") as http:
        assert "authorization" not in http.headers
        assert http.timeout.read == LOOK_TIMEOUT_S
    assert auth_headers(None) == {}
    assert auth_headers("") == {}
    assert verify_context() is verify_context()


async def test_the_model_list(make_sim: Callable[..., str]) -> None:
    cards = await list_models(make_sim(model="org/some-model"))
    assert cards is not None
    assert cards[0]["id"] == "org/some-model"
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    assert await list_models(f"http://127.0.0.1:{port}") is None
