"""Reading records: summary, statistics, frames, gates, sequential tests."""

from __future__ import annotations
