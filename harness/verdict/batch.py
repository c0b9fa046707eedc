"""``harness classify``: label saved model outputs (JSONL in, JSONL out) without a run.

Input, one JSON object per line::

    {"id": str, "text": str, "reasoning"?: str, "tool_calls"?: [{"name", "arguments"}],
     "tools"?: [OpenAI tool definitions], "dialect"?: "auto"|"dsml"|"dsml-v32"|"dsml-v4"|
     "hermes"|"none", "source"?: "raw"|"server"}

``source: "raw"`` (the default): ``text`` is the raw model output and the calls are
extracted from it. ``"server"``: ``text`` is a server's ``content`` next to its
``tool_calls``. Output, one line per valid input line, in input order::

    {"id", "label", "corrupted", "noncanonical", "tool_calls", "evidence"}

A malformed line is reported (``ClassifyStats.errors``, naming its line number) and skipped;
the other lines are still classified.
"""

from __future__ import annotations

import json
import logging
import sys
from collections import Counter
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO, cast

from harness.dialects import registry
from harness.errors import HarnessError, UsageError
from harness.verdict import classify_turn

log = logging.getLogger(__name__)

SOURCES = ("raw", "server")
_FIELDS = {"id", "text", "reasoning", "tool_calls", "tools", "dialect", "source", "context"}


@dataclass
class ClassifyStats:
    lines: int = 0  # non-blank input lines
    classified: int = 0
    corrupted: int = 0
    labels: Counter[str] = field(default_factory=Counter)
    errors: list[str] = field(default_factory=list)


class LineError(UsageError):
    """One input line that cannot be classified; the message says what to fix."""


def _check_calls(value: Any) -> list[dict[str, Any]]:
    if not isinstance(value, list):
        raise LineError('"tool_calls" must be a list of {"name", "arguments"} objects')
    for i, call in enumerate(value):
        if not isinstance(call, dict):
            raise LineError(f'"tool_calls"[{i}] must be an object')
        fn = call.get("function", call)
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise LineError(f'"tool_calls"[{i}] needs a string "name"')
    return value


def parse_line(line: str) -> dict[str, Any]:
    """Decode and validate one input line (raises LineError saying what is wrong)."""
    try:
        rec = json.loads(line)
    except json.JSONDecodeError as exc:
        raise LineError(f"not valid JSON ({exc.msg} at column {exc.colno})") from None
    if not isinstance(rec, dict):
        raise LineError("each line must be a JSON object")
    if not isinstance(rec.get("id"), str | int) or isinstance(rec.get("id"), bool):
        raise LineError('missing "id" (a string)')
    if not isinstance(rec.get("text"), str):
        raise LineError('missing "text" (a string: the model output or the server content)')
    unknown = set(rec) - _FIELDS
    if unknown:
        raise LineError(f"unknown fields {sorted(unknown)}: expected {sorted(_FIELDS)}")
    if not isinstance(rec.get("reasoning", ""), str):
        raise LineError('"reasoning" must be a string')
    if "tool_calls" in rec and rec["tool_calls"] is not None:
        _check_calls(rec["tool_calls"])
    tools = rec.get("tools")
    if tools is not None and not (
        isinstance(tools, list) and all(isinstance(t, dict) for t in tools)
    ):
        raise LineError('"tools" must be a list of tool definitions')
    dialect = rec.get("dialect", "auto")
    if dialect not in registry.names():
        raise LineError(f'"dialect" must be one of {", ".join(registry.names())}, not {dialect!r}')
    if rec.get("source", "raw") not in SOURCES:
        raise LineError(f'"source" must be "raw" or "server", not {rec.get("source")!r}')
    return rec


def classify_record(rec: dict[str, Any]) -> dict[str, Any]:
    """The output record for one validated input record."""
    source = rec.get("source", "raw")
    verdict = classify_turn(
        rec["text"],
        reasoning=rec.get("reasoning") or "",
        tool_calls=rec.get("tool_calls") if source == "server" else None,
        tools=rec.get("tools"),
        dialect=rec.get("dialect", "auto"),
        source=source,
        context=rec.get("context"),
    )
    return {
        "id": rec["id"],
        "label": verdict.label,
        "corrupted": verdict.corrupted,
        "noncanonical": verdict.noncanonical,
        "tool_calls": verdict.tool_calls,
        "evidence": verdict.evidence,
    }


def classify_stream(in_lines: Iterable[str], out: TextIO) -> ClassifyStats:
    """Classify every line of ``in_lines``, writing one JSON line per valid input line."""
    stats = ClassifyStats()
    for lineno, line in enumerate(in_lines, start=1):
        if not line.strip():
            continue
        stats.lines += 1
        try:
            rec = parse_line(line)
            result = classify_record(rec)
        except HarnessError as exc:
            msg = f"line {lineno}: {exc}"
            log.warning("%s", msg)
            stats.errors.append(msg)
            continue
        except Exception:  # a classifier bug must not lose the other lines
            log.exception("line %d: internal error while classifying", lineno)
            stats.errors.append(f"line {lineno}: internal error while classifying (see the log)")
            continue
        out.write(json.dumps(result, ensure_ascii=False, default=str) + "\n")
        stats.classified += 1
        stats.corrupted += bool(result["corrupted"])
        stats.labels[result["label"]] += 1
    return stats


@contextmanager
def _open(path: Path | None, mode: str, default: TextIO) -> Iterator[TextIO]:
    if path is None or str(path) == "-":
        yield default
        return
    try:
        fh = cast(TextIO, open(path, mode, encoding="utf-8"))  # noqa: SIM115 - closed below
    except OSError as exc:
        raise UsageError(f"cannot open {path}: {exc.strerror}") from None
    with fh:
        yield fh


def classify_files(input_path: Path | None, output_path: Path | None) -> ClassifyStats:
    """The CLI entry: paths, or stdin/stdout when None (or "-")."""
    with _open(input_path, "r", sys.stdin) as fin, _open(output_path, "w", sys.stdout) as fout:
        return classify_stream(fin, fout)
