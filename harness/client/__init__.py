"""The only HTTP client code: chat and raw requests, SSE, turn outputs."""

from __future__ import annotations
