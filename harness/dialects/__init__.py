"""Tool-call markup dialects. Each dialect parses raw model text into calls."""

from __future__ import annotations

from harness.dialects.base import ParseResult, ToolCall

__all__ = ["ParseResult", "ToolCall"]
