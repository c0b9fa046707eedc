"""Driving sessions: one session, trace and raw sessions, the driver, self-report."""

from __future__ import annotations
