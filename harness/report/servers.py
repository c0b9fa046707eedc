"""The servers in the reports: the model, what each variant's server reported, the warnings,
and how the server metrics moved with the corruption rate.

``attach`` adds to ``summary.json``: ``model`` (one name, or the names when variants served
different ones), ``servers`` (``harness.analysis.variantcheck.summary_part``),
``server_warnings``, ``server_deaths`` (a variant's server that died under the load: how,
when, its last log lines; from outcomes.json) and ``metrics_vs_corruption`` (per variant,
per metric: Spearman's rho against the corruption rate over time). ``markdown``/``html``
render them; JUnit gets them from ``harness.analysis.gates.summary_properties``.
"""

from __future__ import annotations

import html as _html
from collections.abc import Mapping
from typing import Any

from harness.analysis import metrics_vs_corruption, variantcheck
from harness.analysis.summary import RunData
from harness.record.outcomes import death_line, server_deaths


def attach(summary: dict[str, Any], run: RunData) -> None:
    rows = variantcheck.load(run.run_dir)
    part = variantcheck.summary_part(rows)
    models = part["models"] or ([run.meta["model"]] if run.meta.get("model") else [])
    summary["model"] = models[0] if len(models) == 1 else (models or None)
    summary["servers"] = {k: v for k, v in part.items() if k != "warnings"}
    summary["server_warnings"] = part["warnings"]
    deaths = server_deaths(run.run_dir)
    if deaths:
        summary["server_deaths"] = deaths
    if run.metrics is not None and len(run.turns):
        frame = metrics_vs_corruption.binned(run.turns, run.metrics)
        corr = metrics_vs_corruption.correlations(frame)
        if corr:
            summary["metrics_vs_corruption"] = corr


def _settings(summary: Mapping[str, Any]) -> tuple[list[str], dict[str, dict[str, Any]]]:
    """The verify keys and what each variant's server (first repeat) said for them."""
    per = (summary.get("servers") or {}).get("variants") or {}
    keys: list[str] = []
    values: dict[str, dict[str, Any]] = {}
    for label, entry in per.items():
        first = (entry.get("repeats") or [{}])[0]
        said = first.get("settings") or {}
        values[label] = said
        keys += [k for k in said if k not in keys]
    return keys, values


def warning_lines(summary: Mapping[str, Any]) -> list[str]:
    """Markdown: the server crashes and warnings, for the top of the report."""
    crashed = [f"- **Server crash:** {death_line(d)} (a finding of its own: the turns it "
               "cut are not counted as transport failures of the server; its last log lines "
               "are under Servers)" for d in summary.get("server_deaths") or []]  # fmt: skip
    return crashed + [f"- **Warning:** {w}" for w in summary.get("server_warnings") or []]


def markdown(summary: Mapping[str, Any]) -> list[str]:
    per = (summary.get("servers") or {}).get("variants") or {}
    if not per and not summary.get("model"):
        return []
    model = summary.get("model")
    shown = ", ".join(model) if isinstance(model, list) else str(model)
    out = ["", "## Servers", "", f"Model: `{shown}`.", ""]
    keys, values = _settings(summary)
    out += ["| variant | server | reported by | " + " | ".join(keys) + " |",
            "|---|---|---|" + "---|" * len(keys)]  # fmt: skip
    for label, entry in per.items():
        first = (entry.get("repeats") or [{}])[0]
        sources = ", ".join(first.get("sources") or []) or "nothing"
        cells = [str(values.get(label, {}).get(k, "")) for k in keys]
        out.append(f"| {label} | {entry.get('kind') or '?'} | {sources} | " + " | ".join(cells)
                   + " |")  # fmt: skip
    for death in summary.get("server_deaths") or []:
        out += ["", f"**Crash:** {death_line(death)}. The last lines of its log "
                f"(`{death.get('log')}`):", "", "```", *(death.get("last_lines") or []),
                "```"]  # fmt: skip
    warnings = summary.get("server_warnings") or []
    out += ["", *(f"- **Warning:** {w}" for w in warnings)] if warnings else [
        "", "Every variant's server confirmed what the target file's verify rules ask, and no "
        "two variants that differ in one factor reported the same configuration."]  # fmt: skip
    corr = summary.get("metrics_vs_corruption") or {}
    if corr and not any(c.get("spearman") is not None for by in corr.values() for c in by.values()):
        out += ["", "Server metrics against the corruption rate: too few time bins where both "
                f"moved (at least {metrics_vs_corruption.MIN_BINS}; the server is scraped every "
                "few seconds: a longer run gives more)."]  # fmt: skip
    elif corr:
        names = list(dict.fromkeys(m for by in corr.values() for m in by))
        out += ["", "Server metrics against the turn corruption rate over time (Spearman's rho "
                "over time bins, p in brackets):", ""]  # fmt: skip
        out += ["| variant | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
        for label, by in corr.items():
            cells = []
            for name in names:
                c = by.get(name) or {}
                rho, p = c.get("spearman"), c.get("p_value")
                cells.append("n/a" if rho is None else f"{rho:+.2f} (p {p:.2g})")
            out.append(f"| {label} | " + " | ".join(cells) + " |")
    return out


def html(summary: Mapping[str, Any]) -> list[str]:
    """The same section as HTML (a heading, the warnings, the model)."""
    if not (summary.get("servers") or {}).get("variants") and not summary.get("model"):
        return []
    model = summary.get("model")
    shown = ", ".join(model) if isinstance(model, list) else str(model)
    parts = ["<h2>Servers</h2>", f"<p>Model: <code>{_html.escape(shown)}</code></p>"]
    for death in summary.get("server_deaths") or []:
        tail = _html.escape("\n".join(death.get("last_lines") or []))
        parts.append(f"<p><b>Crash:</b> {_html.escape(death_line(death))}.</p><pre>{tail}</pre>")
    for w in summary.get("server_warnings") or []:
        parts.append(f"<p><b>Warning:</b> {_html.escape(w)}</p>")
    return parts
