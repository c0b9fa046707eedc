"""The markdown of report.md's tables: a table's head, a section that opens with one."""

from __future__ import annotations


def table_head(*columns: str) -> list[str]:
    """A markdown table's header row and the separator row under it."""
    return ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]


def section(title: str, text: str, *columns: str) -> list[str]:
    """A section of the report (after a blank line): its heading, a paragraph, and the head
    of its table."""
    return ["", f"## {title}", "", text, "", *table_head(*columns)]
