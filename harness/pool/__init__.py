"""Worker processes: the parent, the child, dealing sessions to them."""

from __future__ import annotations
