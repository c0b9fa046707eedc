"""Building the report: summary.json, report.md/html, plots."""

from __future__ import annotations
