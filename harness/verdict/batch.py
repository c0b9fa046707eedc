"""``harness classify``: label saved model outputs (JSONL in, JSONL out) without a run.

Input, one JSON object per line::

    {"id": str, "text": str, "reasoning"?: str, "tool_calls"?: [{"name", "arguments"}],
     "tools"?: [OpenAI tool definitions], "dialect"?: "auto" or a registered dialect
     (harness.dialects.registry.names()), "source"?: "raw"|"server"}

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
from harness.verdict import Verdict, classify_turn
from harness.verdict.detector.text import THRESHOLD

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
        "tier": verdict.tier,
        "why": why(verdict),
        "threshold": THRESHOLD,
        "noncanonical": verdict.noncanonical,
        "tool_calls": verdict.tool_calls,
        "evidence": verdict.evidence,
    }


def why(verdict: Verdict) -> str:
    """One sentence: why the verdict is what it is, the text score beside its threshold."""
    ev = verdict.evidence
    score = ev.get("text_score")
    scored = f"text score {score} (threshold {THRESHOLD})" if score is not None else ""
    at = f" from character {ev['offset']}" if ev.get("offset") is not None else ""
    where = " in the reasoning" if ev.get("in_reasoning") or ev.get("in_content_reasoning") else ""
    if "loop_to_the_end" in ev:
        loop = ev["loop_to_the_end"]
        return (f"a loop to the end of the output{where}: {loop['span']!r} written "
                f"{loop['copies']} times back to back (a suspect: the model's own loops look "
                f"the same; an oracle decides)")  # fmt: skip
    if verdict.tier == "suspect":
        signals = {k: v for k, v in (ev.get("signals") or {}).items()
                   if k not in ("char_surprisal", "p_corrupted")}  # fmt: skip
        strongest = ", ".join(k for k, _ in sorted(signals.items(), key=lambda kv: -kv[1])[:3])
        kind = "a repetition loop" if verdict.label == "repetition" else "token salad"
        return (f"the text detector reads {kind}{where}{at}: {scored}"
                + (f"; strongest signals: {strongest}" if strongest else "")
                + " (a suspect: the judge confirms it or not in a run)")  # fmt: skip
    if verdict.corrupted or ev.get("reason"):
        return f"{ev.get('reason') or verdict.label}{at}"
    out = f"no sign of corruption: {scored}" if scored else "no sign of corruption"
    if ev.get("acquitted"):
        out += f"; the detector's reading acquitted on a second look: {ev['acquitted']}"
    if ev.get("reasoning_in_content"):
        out += f"; reasoning in the content ({ev['reasoning_in_content']}) judged apart"
    return out


def classify_stream(in_lines: Iterable[str], out: TextIO, dialect: str = "auto") -> ClassifyStats:
    """Classify every line of ``in_lines``, writing one JSON line per valid input line
    (``dialect`` for the lines without a ``"dialect"``)."""
    stats = ClassifyStats()
    for lineno, line in enumerate(in_lines, start=1):
        if not line.strip():
            continue
        stats.lines += 1
        try:
            rec = parse_line(line)
            rec.setdefault("dialect", dialect)
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


def classify_files(
    input_path: Path | None, output_path: Path | None, dialect: str = "auto"
) -> ClassifyStats:
    """The CLI entry: paths, or stdin/stdout when None (or "-"); ``dialect`` for the lines
    that do not name one."""
    if dialect not in registry.names():
        raise UsageError(f"--dialect {dialect!r}: use one of {', '.join(registry.names())}")
    with _open(input_path, "r", sys.stdin) as fin, _open(output_path, "w", sys.stdout) as fout:
        return classify_stream(fin, fout, dialect=dialect)
