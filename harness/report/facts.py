"""The report's sections that report.md and report.html share: what was run, the
simulator's own accuracy, and the Markdown of the other shared sections rendered as HTML.

The sections are written once, as Markdown; the HTML page renders that same Markdown with
markdown-it (raw HTML off, so nothing in it from the run, a variant name or a model's
output, becomes markup), so both files always carry the same sections.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from harness.analysis.summary import fmt_pct
from harness.record.rundir import OUTCOMES_FILE
from harness.report.tables import section


def run_facts(meta: Mapping[str, Any], run_dir: Path) -> dict[str, Any]:
    """summary.json's ``run``: what was run, from run.json and outcomes.json."""
    outcomes: list[dict[str, Any]] = []
    with contextlib.suppress(OSError, json.JSONDecodeError):
        loaded = json.loads((run_dir / OUTCOMES_FILE).read_text(encoding="utf-8"))
        outcomes = [o for o in loaded if isinstance(o, dict)] if isinstance(loaded, list) else []
    args = meta.get("args") if isinstance(meta.get("args"), Mapping) else {}
    assert isinstance(args, Mapping)
    servers: dict[str, str] = {}
    models: list[str] = []
    for o in outcomes:
        if o.get("server_version"):
            servers.setdefault(str(o.get("label")), str(o["server_version"]))
        if o.get("model") and o["model"] not in models:
            models.append(str(o["model"]))
    duration = meta.get("duration_s")
    if duration is None and outcomes:
        duration = round(sum(float(o.get("wall_s") or 0.0) for o in outcomes), 1)
    facts: dict[str, Any] = {
        "command": meta.get("command"),
        "harness_version": meta.get("harness_version"),
        "model": meta.get("model") or (", ".join(models) if models else None),
        "dialect": _dialect(meta),
        "scenario": meta.get("scenario"),
        "target": _target(meta, args),
        "sessions": meta.get("sessions"),
        "concurrency": meta.get("concurrency"),
        "workers": meta.get("workers"),
        "repeats": meta.get("repeats"),
        "seed": meta.get("seed"),
        "stream": meta.get("stream"),
        "demo": bool(args.get("demo")) or None,
        "started_at": meta.get("started_at"),
        "finished_at": meta.get("finished_at"),
        "duration_s": duration,
        "servers": servers or None,
    }
    return {k: v for k, v in facts.items() if v is not None}


def _target(meta: Mapping[str, Any], args: Mapping[str, Any]) -> str | None:
    """The target as the command line gave it (the default target file by its name)."""
    given = args.get("target") or meta.get("endpoint") or args.get("endpoint")
    if given:
        return str(given)
    return f"{Path(str(meta['target'])).name} (the default)" if meta.get("target") else None


def _cell(value: Any) -> str:
    """Text for a table cell or a list item: pipes escaped, one line."""
    return str(value).replace("|", "\\|").replace("\n", " ")


def _code(value: Any) -> str:
    """A code span (any backticks inside kept by a longer fence)."""
    text = str(value).replace("\n", " ")
    ticks = "``" if "`" in text else "`"
    pad = " " if ticks == "``" else ""
    return f"{ticks}{pad}{text}{pad}{ticks}"


def _dialect(meta: Mapping[str, Any]) -> str | None:
    """The dialect the variants settled on (``auto`` decides per variant), else the asked one."""
    chosen = meta.get("dialects")
    names = []
    if isinstance(chosen, dict):
        for row in chosen.values():
            name = row.get("dialect") if isinstance(row, dict) else None
            if name and name not in names:
                names.append(str(name))
    if names:
        return ", ".join(names)
    asked = meta.get("dialect")
    return str(asked) if asked is not None else None


def run_markdown(summary: Mapping[str, Any]) -> list[str]:
    """ "What was run": the command line, the version, model, dialect, scenario, seed, duration,
    the servers' versions where they said."""
    facts = summary.get("run") or {}
    if not facts:
        return []
    rows: list[tuple[str, str]] = []
    if facts.get("command"):
        rows.append(("command", _code(facts["command"])))
    named = (("harness_version", "harness version"), ("model", "model"),
             ("dialect", "dialect"), ("scenario", "scenario"), ("target", "target"),
             ("seed", "seed"))  # fmt: skip
    for key, name in named:
        if facts.get(key) is not None:
            rows.append((name, _code(facts[key]) if key != "seed" else _cell(facts[key])))
    load = []
    if facts.get("sessions") is not None:
        load.append(f"{facts['sessions']} sessions per variant")
    if facts.get("concurrency") is not None:
        load.append(f"{facts['concurrency']} requests in flight at most")
    if facts.get("workers") is not None:
        n = facts["workers"]
        load.append(f"{n} worker process{'es' if n != 1 else ''}")
    if (facts.get("repeats") or 1) > 1:
        load.append(f"each variant {facts['repeats']} times")
    if facts.get("stream") is False:
        load.append("not streamed")
    if load:
        rows.append(("load", ", ".join(load)))
    when = facts.get("started_at")
    if when:
        took = facts.get("duration_s")
        rows.append(("started", f"{when}" + (f", {took:.0f} s" if took is not None else "")))
    for variant, version in (facts.get("servers") or {}).items():
        rows.append((f"server of {_cell(variant)}", _code(version)))
    out = ["", "## What was run", ""]
    out += [f"- **{name}**: {value}" for name, value in rows]
    if facts.get("demo"):
        out += ["", "The demo multiplies the simulator's fault odds: its rates show the effect, "
                "not the incident's size."]  # fmt: skip
    return out


def cancelled_markdown(variants: Sequence[Mapping[str, Any]]) -> list[str]:
    """A note under the variants table when the run was stopped with turns in flight."""
    n = sum(int(v.get("cancelled_turns") or 0) for v in variants)
    if not n:
        return []
    return ["", f"{n} turn{'s' if n != 1 else ''} in flight when the run was stopped "
            f"{'are' if n != 1 else 'is'} recorded as cancelled: not judged, not counted as "
            "transport errors."]  # fmt: skip


def sim_accuracy_markdown(variants: Sequence[Mapping[str, Any]]) -> list[str]:
    """How the harness's labels agreed with what the simulator says it injected (only when
    the target was the simulator, which tells in each response's ``x-sim-injected``)."""
    known = [v for v in variants if "sim_injected_turns" in v]
    if not known:
        return []
    out = section("The simulator's own accuracy",
                  "The simulator says in each response what it injected; the classifier never "
                  "reads it. Recall: injected corruptions the harness flagged; precision: "
                  "flagged turns the simulator had corrupted.",
                  "variant", "injected", "flagged", "recall", "precision",
                  "false alarms")  # fmt: skip
    for v in known:
        injected = int(v.get("sim_injected_turns") or 0)
        out.append(
            f"| {_cell(v['label'])} | {injected} | {v.get('corrupted_turns', 0)} | "
            f"{fmt_pct(v.get('sim_recall'))} | {fmt_pct(v.get('sim_precision'))} | "
            f"{v.get('sim_false_alarms', 0)} |"
        )
    return out


def markdown_html(lines: Sequence[str]) -> str:
    """The Markdown of shared sections as HTML (raw HTML in it stays text)."""
    from markdown_it import MarkdownIt

    md = MarkdownIt("commonmark", {"html": False}).enable("table")
    return str(md.render("\n".join(lines)))


def _shown(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.3g}"
    if isinstance(value, list | tuple):
        return ", ".join(_shown(v) for v in value[:8]) + (", …" if len(value) > 8 else "")
    if isinstance(value, Mapping):
        return "; ".join(f"{k} {_shown(v)}" for k, v in list(value.items())[:8])
    return str(value)


def evidence_lines(evidence: Any, width: int = 160) -> list[str]:
    """A turn's evidence as a person reads it: why first (its reason), then one fact a line
    (``offset: 12``, ``signals: a 0.91; b 0.2``), each cut at ``width`` characters."""
    if not isinstance(evidence, Mapping) or not evidence:
        return []
    out = []
    if evidence.get("reason"):
        out.append(f"why: {evidence['reason']}")
    for key, value in evidence.items():
        if key != "reason" and value not in (None, "", [], {}):
            out.append(f"{str(key).replace('_', ' ')}: {_shown(value)}")
    return [line if len(line) <= width else line[: width - 1] + "…" for line in out]


def has_calls(tool_calls: Any) -> bool:
    """A row's tool calls are there (a list with something in it, not a missing value)."""
    return isinstance(tool_calls, list | tuple) and len(tool_calls) > 0
