"""Where to send it: target files, the Target protocol and its modes, launching, metrics."""

from __future__ import annotations
