"""report.html: one self-contained page (plots inlined as data URIs).

Every string that comes from the run (model output, labels, variant names, evidence) goes
through ``html.escape``: the model's output is untrusted text.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from html import escape
from pathlib import Path
from typing import Any

from harness.analysis import coverage, onset
from harness.analysis.summary import fmt_diff, fmt_p, fmt_pct
from harness.report.facts import cancelled_markdown, evidence_lines, has_calls
from harness.report.servers import html as servers_html
from harness.report.webfont import FONT_FACE

#: the font stacks: system fonts first (CJK ones by name), then the page's own font for
#: U+FF5C (harness.report.webfont), then the generic family
CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI","Noto Sans","Noto Sans CJK SC",
 "Noto Sans SC","Source Han Sans SC","PingFang SC","Hiragino Sans GB","Microsoft YaHei",
 "WenQuanYi Micro Hei","Noto Sans Symbols 2","harness-bar",sans-serif;
 max-width:1100px;margin:2em auto;padding:0 1em;color:#222}
pre,code{font-family:ui-monospace,"DejaVu Sans Mono","Noto Sans Mono","Noto Sans Mono CJK SC",
 "Sarasa Mono SC","Source Han Mono","Noto Sans CJK SC","Microsoft YaHei","harness-bar",
 monospace}
h1{font-size:1.5em} h2{border-bottom:1px solid #ddd;padding-bottom:.2em;margin-top:1.6em}
table{border-collapse:collapse;font-size:.92em} td,th{border:1px solid #ccc;padding:.3em .6em}
th{background:#f3f3f3} td.num{text-align:right;font-variant-numeric:tabular-nums}
.verdict{font-size:1.1em;background:#fff6e5;border-left:4px solid #e8a33d;padding:.7em 1em}
.verdict.clean{background:#eef8f0;border-color:#4c9f70}
pre.excerpt{white-space:pre-wrap;word-break:break-word;background:#f7f7f7;padding:.8em;
 border:1px solid #e2e2e2;font-size:.88em}
mark.bad{background:#f8c9cf;color:#7a0010;outline:1px solid #d1495b;outline-offset:1px}
.meta{color:#666;font-size:.9em} img{max-width:100%;border:1px solid #eee;margin:.5em 0}
"""


METHOD = (
    "Intervals are {:.0%} Wilson intervals for sessions, exact (Clopper-Pearson) ones for "
    "turns at their effective sample size (the turns over their design effect: turns are "
    "clustered in sessions); p-values are two-sided Fisher exact tests against the baseline "
    "(for turns, on the counts over each variant's design effect), Holm-corrected per unit "
    "(sessions, turns)."
)


def comparison_line(c: Mapping[str, Any]) -> str:
    """One bullet per comparison: the verdict when not already the headline, and the hint."""
    hint = str(c.get("hint", ""))
    if c.get("significant"):
        return f"{c['b']}: {hint}."
    return f"{c['verdict']}; {hint}."


def _note(lines: list[str]) -> str:
    text = " ".join(line for line in lines if line)
    return f"<p class='meta'>{_e(text)}</p>" if text else ""


def _e(value: Any) -> str:
    return escape(str(value), quote=True)


def _img(path: Path, alt: str) -> str:
    data = base64.b64encode(path.read_bytes()).decode("ascii")
    return f'<img alt="{_e(alt)}" src="data:image/png;base64,{data}">'


def _table(head: list[str], rows: list[list[tuple[str, bool]]]) -> str:
    """rows of (already-escaped html, numeric?) cells."""
    th = "".join(f"<th>{_e(h)}</th>" for h in head)
    body = "".join(
        "<tr>"
        + "".join(f'<td class="num">{c}</td>' if num else f"<td>{c}</td>" for c, num in r)
        + "</tr>"
        for r in rows
    )
    return f"<table><thead><tr>{th}</tr></thead><tbody>{body}</tbody></table>"


def _variants(summary: Mapping[str, Any]) -> str:
    rows = []
    for v in summary["variants"]:
        s_lo, s_hi = v["session_corruption_ci"]
        t_lo, t_hi = v["turn_corruption_ci"]
        rows.append([
            (_e(v["label"]), False), (_e(v["sessions"]), True), (_e(v["corrupted_sessions"]), True),
            (f"{fmt_pct(v['session_corruption_rate'])} [{fmt_pct(s_lo)}, {fmt_pct(s_hi)}]", True),
            (_e(v["classified_turns"]), True), (_e(v["corrupted_turns"]), True),
            (f"{fmt_pct(v['turn_corruption_rate'])} [{fmt_pct(t_lo)}, {fmt_pct(t_hi)}]", True),
            (_e(v["transport_errors"]), True),
            (_e(", ".join(f"{k}: {n}" for k, n in v["labels"].items())), False),
        ])  # fmt: skip
    head = ["variant", "sessions", "corrupted", "session rate [95% CI]", "turns", "corrupted",
            "turn rate [95% CI]", "transport errors", "labels"]  # fmt: skip
    return _table(head, rows)


def _comparisons(summary: Mapping[str, Any]) -> str:
    rows = []
    for c in summary["comparisons"]:
        d, lo, hi = fmt_diff(c["diff"], *c["diff_ci"])
        rows.append([
            (_e(c["b"]), False), (_e(c["unit"]), False), (fmt_pct(c["rate_b"]), True),
            (fmt_pct(c["rate_a"]), True),
            (f"{d} [{lo}, {hi}]", True),
            (fmt_p(c["p_value"]), True), (fmt_p(c["p_holm"]), True), (_e(c.get("hint", "")), False),
        ])  # fmt: skip
    head = ["variant", "unit", "rate", "baseline rate", "difference, points [95% CI]", "p",
            "p (Holm)", "sample size"]  # fmt: skip
    return _table(head, rows)


def _example(ex: Mapping[str, Any]) -> str:
    e = ex["excerpt"]
    where = (
        f"flagged from character {e['offset']}" if e["offset"] is not None else "no offset given"
    )
    if ex.get("in_reasoning"):
        where += " of the reasoning"
    meta = (f"repeat {ex['repeat']}, session {ex['session']}, turn {ex['turn']}, attempt "
            f"{ex['attempt']}, {ex['prompt_tokens']} prompt tokens; {where}")  # fmt: skip
    text = ("…" if e["cut_before"] else "") + _e(e["pre"])
    if e["offset"] is not None:
        text += f'<mark class="bad">{_e(e["span"])}</mark>'
    text += _e(e["post"]) + ("…" if e["cut_after"] else "")
    extra = ""
    if has_calls(ex["tool_calls"]):
        extra += f"<div class='meta'>tool_calls: <code>{_e(ex['tool_calls'])}</code></div>"
    lines = evidence_lines(ex["evidence"])
    if lines:
        items = "".join(f"<li>{_e(line)}</li>" for line in lines)
        extra += f"<ul class='meta evidence'>{items}</ul>"
    return (f"<h4>{_e(ex['label'])}</h4><div class='meta'>{_e(meta)}</div>"
            f'<pre class="excerpt">{text}</pre>{extra}')  # fmt: skip


def render_html(
    summary: Mapping[str, Any],
    plot_paths: Mapping[str, Path],
    examples: Mapping[str, list[dict[str, Any]]],
    opening: str = "",
    shared: str = "",
) -> str:
    """The page. ``opening`` (what was run) and ``shared`` (the sections after the
    comparisons) are the HTML of report.md's same sections (harness.report.facts)."""
    clean = not any(c.get("significant") for c in summary["comparisons"]) and not any(
        v["corrupted_sessions"] for v in summary["variants"]
    )
    sess = [c for c in summary["comparisons"] if c["unit"] == "session"]
    parts = [
        "<!doctype html><html lang='en'><head><meta charset='utf-8'>",
        f"<title>Corruption report: {_e(summary['run_id'])}</title>",
        f"<style>{FONT_FACE}{CSS}</style></head><body>",
        f"<h1>Corruption report: run {_e(summary['run_id'])}</h1>",
        opening,
        "<h2>Verdict</h2>",
        f"<div class='verdict{' clean' if clean else ''}'>{_e(summary['verdict'])}</div>",
        *(f"<p class='meta'>{_e(line[0].upper() + line[1:])}.</p>"
          for line in coverage.dialect_lines(summary)),
        *(f"<p><b>Warning:</b> {_e(w)}</p>" for w in summary.get("warnings", ())),
        "<ul>" + "".join(f"<li>{_e(comparison_line(c))}</li>" for c in sess) + "</ul>",
        f"<p class='meta'>Baseline: <code>{_e(summary['baseline'])}</code>. "
        f"{_e(METHOD.format(summary['confidence']))}</p>",
        "<h2>Variants</h2>", _variants(summary),
        _note(cancelled_markdown(summary["variants"])),
    ]  # fmt: skip
    if summary["comparisons"]:
        parts += ["<h2>Comparisons with the baseline</h2>", _comparisons(summary)]
        onsets = [line for c in summary["comparisons"] if (line := onset.sentence(c))]
        parts += ["<ul>" + "".join(f"<li>{_e(line)}.</li>" for line in onsets) + "</ul>"] * bool(
            onsets
        )
    parts.append(shared)
    parts += servers_html(summary)
    if plot_paths:
        parts.append("<h2>Plots</h2>")
        parts += [_img(p, name) for name, p in plot_paths.items() if p.is_file()]
    parts.append("<h2>Worst examples</h2>")
    if not any(examples.values()):
        parts.append("<p>No corrupted turns.</p>")
    for variant, rows in examples.items():
        parts.append(f"<h3>{_e(variant)}</h3>")
        parts += [_example(ex) for ex in rows]
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"
