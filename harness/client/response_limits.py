"""The bounds of one response: how much of it is read, and for how long (docs/faults.md).

Past a bound the request stops there: ``too_large`` (``--max-answer-bytes``,
``--max-line-bytes``) or ``timeout`` (``--total-timeout``), the text that arrived kept.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Limits:
    """What one response may take: its body's bytes (decompressed), one line's bytes, the
    whole request's seconds (None: the larger of 4 x the read timeout and 600 s)."""

    max_answer_bytes: int = 16 << 20
    max_line_bytes: int = 4 << 20
    total_timeout_s: float | None = None
