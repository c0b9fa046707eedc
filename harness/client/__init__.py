"""The only HTTP client code: chat and raw requests, SSE, turn outputs; its defaults."""

from __future__ import annotations

DEFAULT_REQUEST_TIMEOUT = 120.0  # seconds without a byte before a request fails as a timeout
CONNECTION_HEADROOM = 8  # pooled connections beyond the requests in flight


def connections_for(in_flight: int) -> int:
    """The connection pool for ``in_flight`` requests at most, with the headroom."""
    return in_flight + CONNECTION_HEADROOM
