"""Executing a run: the variants, the after-load pass, replay, the plan."""

from __future__ import annotations
