"""What to send: scenario files, the matrix, pressure planning, traces, the fake tools."""

from __future__ import annotations
