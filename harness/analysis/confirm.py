"""What the after-load pass found: the confirmation split and the divergence under load.

``confirm.jsonl`` rows say of each corrupted send whether it was ``confirmed_under_load``
(clean when re-sent alone), ``reproduces_alone`` or ``undecided``; ``reference.jsonl`` holds
sessions re-run one at a time. ``divergence`` compares each loaded session with its lone run
turn by turn: while both sent the same request, a turn where both gave well-formed tool calls
that differ (name or arguments) is a divergence. ``harness.run.afterload`` writes these files.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from harness import labels as L
from harness.analysis import stats
from harness.record.rundir import CONFIRM_FILE, REFERENCE_FILE, TURNS_FILE
from harness.record.turns import read_rows

CONFIRMED_UNDER_LOAD = "confirmed_under_load"


REPRODUCES_ALONE = "reproduces_alone"


UNDECIDED = "undecided"


ROW_KEY = ("variant", "repeat", "session", "turn", "attempt")


def row_key(row: Mapping[str, Any]) -> tuple[Any, ...]:
    return tuple(row.get(k) for k in ROW_KEY)


def confirm_summary(rows: list[dict[str, Any]], classified_turns: int) -> dict[str, Any]:
    """The corruption rate split by what the lone re-send said."""
    counts = {s: sum(1 for r in rows if r.get("status") == s) for s in
              (CONFIRMED_UNDER_LOAD, REPRODUCES_ALONE, UNDECIDED)}  # fmt: skip
    out: dict[str, Any] = {"confirmed": len(rows), **counts}
    for status, name in ((CONFIRMED_UNDER_LOAD, "under_load"), (REPRODUCES_ALONE, "alone")):
        k = counts[status]
        lo, hi = stats.wilson(k, classified_turns) if classified_turns >= k else (0.0, 1.0)
        out[f"turn_rate_{name}"] = k / classified_turns if classified_turns else None
        out[f"turn_rate_{name}_ci"] = [lo, hi]
    return out


def _calls(row: Mapping[str, Any]) -> list[tuple[str, str]]:
    out = []
    for c in row.get("tool_calls") or []:
        args = c.get("arguments")
        if isinstance(args, str):
            with contextlib.suppress(json.JSONDecodeError):
                args = json.loads(args)
        out.append((str(c.get("name")), json.dumps(args, sort_keys=True)))
    return out


def _accepted(rows: Iterable[Mapping[str, Any]]) -> dict[int, Mapping[str, Any]]:
    """turn -> the last send of that turn (the one the session went on with)."""
    out: dict[int, Mapping[str, Any]] = {}
    for r in sorted(rows, key=lambda r: (r["turn"], r["attempt"])):
        out[int(r["turn"])] = r
    return out


def compare_session(
    loaded: Iterable[Mapping[str, Any]], lone: Iterable[Mapping[str, Any]]
) -> tuple[int, list[dict[str, Any]]]:
    """(turns compared, divergences) of one session run loaded and alone.

    Turns are walked in order while both runs sent the same request (every earlier turn gave
    the same output, and the prompt sizes agree); the walk stops at the first difference.
    """
    a, b = _accepted(loaded), _accepted(lone)
    compared, found = 0, []
    for turn in sorted(set(a) & set(b)):
        x, y = a[turn], b[turn]
        px, py = x.get("prompt_tokens"), y.get("prompt_tokens")
        if px is not None and py is not None and px != py:
            break
        both_ok = x.get("label") == y.get("label") == L.OK_TOOL_CALL
        if both_ok:
            compared += 1
            if _calls(x) != _calls(y):
                found.append({"turn": turn, "loaded": x.get("tool_calls"),
                              "alone": y.get("tool_calls")})  # fmt: skip
                break
        elif (x.get("label"), x.get("content"), _calls(x)) != (
            y.get("label"),
            y.get("content"),
            _calls(y),
        ):
            break
    return compared, found


def divergence_summary(
    turns: list[dict[str, Any]], reference: list[dict[str, Any]], variant: str
) -> dict[str, Any] | None:
    ref = [r for r in reference if r.get("variant") == variant]
    if not ref:
        return None

    def by_session(rows: list[dict[str, Any]]) -> dict[tuple[int, int], list[dict[str, Any]]]:
        out: dict[tuple[int, int], list[dict[str, Any]]] = {}
        for r in rows:
            if r.get("variant") == variant:
                out.setdefault((int(r.get("repeat", 0)), int(r["session"])), []).append(r)
        return out

    loaded, lone = by_session(turns), by_session(ref)
    compared = diverged = 0
    examples: list[dict[str, Any]] = []
    for key in sorted(set(loaded) & set(lone)):
        n, found = compare_session(loaded[key], lone[key])
        compared += n
        diverged += len(found)
        examples += [{"repeat": key[0], "session": key[1], **f} for f in found]
    lo, hi = stats.wilson(diverged, compared)
    return {
        "reference_sessions": len(lone),
        "compared_turns": compared,
        "diverged_turns": diverged,
        "divergence_rate": diverged / compared if compared else None,
        "divergence_ci": [lo, hi],
        "examples": examples[:3],
    }


def attach(summary: dict[str, Any], run_dir: Path) -> None:
    """Add ``confirm`` and ``divergence`` to each variant of ``summary`` when recorded."""
    confirm = read_rows(run_dir / CONFIRM_FILE)
    reference = read_rows(run_dir / REFERENCE_FILE)
    turns = read_rows(run_dir / TURNS_FILE) if reference else []
    for v in summary.get("variants", []):
        rows = [r for r in confirm if r.get("variant") == v["label"]]
        if rows:
            v["confirm"] = confirm_summary(rows, int(v.get("classified_turns") or 0))
        div = divergence_summary(turns, reference, v["label"]) if reference else None
        if div is not None:
            v["divergence"] = div
