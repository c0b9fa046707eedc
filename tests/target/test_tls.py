"""The HTTP clients of a run's first contact with a server share one TLS context."""

from __future__ import annotations

import ssl
from collections.abc import Callable

import pytest

from harness.client.door import verify_context
from harness.target.readiness import served_model, server_version, wait_ready
from harness.target.serverfacts import read_config
from harness.target.spec import ReadySpec
from harness.workload.dialect import model_names


async def test_first_contact_makes_no_tls_context_of_its_own(
    make_sim: Callable[..., str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Readiness, the served model, its names, the server's version and configuration:
    each makes an httpx client, and none builds a TLS context (certifi's bundle parsed
    again: 16 ms a client) beyond the shared one."""
    url = make_sim(index_k="fp8")
    shared = verify_context()
    made: list[object] = []
    real = ssl.create_default_context

    def counting(*args: object, **kwargs: object) -> ssl.SSLContext:
        made.append(args)
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(ssl, "create_default_context", counting)
    await wait_ready(url, ReadySpec(timeout_s=30))
    model = await served_model(url)
    assert model
    assert await model_names(url, model)
    await server_version(url)
    await read_config(url)
    assert made == []
    assert verify_context() is shared
