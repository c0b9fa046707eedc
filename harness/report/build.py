"""Reports of a run: summary.json, plots, report.md, report.html; the terminal table; compare.

Everything is rebuilt from turns.jsonl, so a run that crashed half-way can still be reported.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import textwrap
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from harness.analysis import (
    canary_deviations,
    confirm,
    coverage,
    frames,
    judge,
    onset,
    oracles,
    stats,
    tiers,
)
from harness.analysis import load as analysis_load
from harness.analysis import summary as analysis
from harness.analysis.summary import Summary, fmt_diff, fmt_p, fmt_pct
from harness.errors import UsageError
from harness.record.rundir import (
    PLOTS_DIR,
    REPORT_HTML,
    REPORT_MD,
    SELF_REPORT_FILE,
    SUMMARY_FILE,
    TIDY_FILE,
    TURNS_FILE,
)
from harness.report import facts as report_facts
from harness.report import html as report_html
from harness.report import plots, replays
from harness.report import servers as report_servers
from harness.report.confirm import markdown as confirm_markdown
from harness.report.html import METHOD, comparison_line
from harness.report.oracles import markdown as oracles_markdown
from harness.report.oracles import plot_passkeys
from harness.report.teacher_forced import markdown as canary_markdown
from harness.report.teacher_forced import plot_canary

log = logging.getLogger(__name__)

EXAMPLES_PER_VARIANT = 3
BEFORE, AFTER = 160, 240


#: C0 controls but tab and newline, DEL, C1 controls: in model output they would let the
#: text retitle, clear or recolour the terminal of whoever runs ``cat report.md``
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def printable(text: str) -> str:
    """``text`` with every control character but tab and newline shown as ``\\xNN``."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


def rate_ci(rate: float | None, ci: list[float]) -> str:
    return f"{fmt_pct(rate)} [{fmt_pct(ci[0])}, {fmt_pct(ci[1])}]"


# ---- worst examples ------------------------------------------------------------------------


def excerpt(content: str, evidence: Mapping[str, Any] | None) -> dict[str, Any]:
    """Split content around the corruption start: {"pre", "span", "post", "offset", "cut_*"}."""
    ev = evidence or {}
    offset = ev.get("offset")
    if not isinstance(offset, int) or not 0 <= offset <= len(content):
        return {"pre": content[: BEFORE + AFTER], "span": "", "post": "", "offset": None,
                "cut_before": False, "cut_after": len(content) > BEFORE + AFTER}  # fmt: skip
    end = ev.get("end")
    if not isinstance(end, int) and isinstance(ev.get("length"), int):
        end = offset + ev["length"]
    span_end = min(len(content), end if isinstance(end, int) and end > offset else offset + AFTER)
    start = max(0, offset - BEFORE)
    stop = min(len(content), span_end + 40)
    return {
        "pre": content[start:offset], "span": content[offset:span_end],
        "post": content[span_end:stop], "offset": offset,
        "cut_before": start > 0, "cut_after": stop < len(content),
    }  # fmt: skip


def worst_examples(
    df: pd.DataFrame, per_variant: int = EXAMPLES_PER_VARIANT
) -> dict[str, list[dict[str, Any]]]:
    """A few corrupted turns per variant: one per distinct label first, highest text score and
    longest first."""
    out: dict[str, list[dict[str, Any]]] = {}
    bad = df[df["is_corrupted"]]
    for variant, g in bad.groupby("variant", sort=False):
        score = g["evidence"].apply(
            lambda e: float(e.get("text_score") or 0) if isinstance(e, Mapping) else 0.0
        )
        g = g.assign(_score=score, _len=g["content"].str.len())
        g = g.sort_values(["_score", "_len", "turn"], ascending=[False, False, True])
        picked = list(g.drop_duplicates("label").index)
        picked += [i for i in g.index if i not in picked]
        rows = []
        for idx in picked[:per_variant]:
            r = df.loc[idx]
            ev = r["evidence"] if isinstance(r["evidence"], Mapping) else {}
            # the offset points into the reasoning when the verdict says so
            reasoning = r.get("reasoning")
            in_reasoning = bool(ev.get("in_reasoning")) and isinstance(reasoning, str)
            text = reasoning if in_reasoning else r["content"]
            calls = r.get("tool_calls")
            rows.append({
                "label": r["label"], "repeat": int(r["repeat"]), "session": int(r["session"]),
                "turn": int(r["turn"]), "attempt": int(r["attempt"]),
                "prompt_tokens": None if pd.isna(r["prompt_tokens"]) else int(r["prompt_tokens"]),
                "excerpt": excerpt(text, ev), "in_reasoning": in_reasoning,
                "tool_calls": json.dumps(calls, ensure_ascii=False)[:600] if calls else "",
                "evidence": {k: v for k, v in ev.items() if k not in ("offset",)},
            })  # fmt: skip
        out[str(variant)] = rows
    return out


# ---- text renderings -----------------------------------------------------------------------

TABLE_COLS = ("variant", "sessions", "corrupt", "session rate [95% CI]", "turns", "corrupt",
              "turn rate [95% CI]", "transport err")  # fmt: skip


def table_rows(summary: Summary) -> list[list[str]]:
    return [
        [v["label"], str(v["sessions"]), str(v["corrupted_sessions"]),
         rate_ci(v["session_corruption_rate"], v["session_corruption_ci"]),
         str(v["classified_turns"]), str(v["corrupted_turns"]),
         rate_ci(v["turn_corruption_rate"], v["turn_corruption_ci"]), str(v["transport_errors"])]
        for v in summary["variants"]
    ]  # fmt: skip


#: The terminal's table: narrow enough for 80 columns (report.md has the full one).
TERMINAL_COLS = ("variant", "sessions", "corrupt", "rate [95% CI]", "turns", "turn rate",
                 "transport")  # fmt: skip
DEMO_NOTE = "demo: the simulator's fault odds are x6, so rates show the effect, not its size"


def short_rate_ci(rate: float | None, ci: list[float]) -> str:
    """``3.2% [1.1–8.9]``: the rate and its interval in the rate's unit, short."""
    if rate is None:
        return "n/a"
    return f"{fmt_pct(rate)} [{100 * ci[0]:.1f}–{100 * ci[1]:.1f}]"


def format_table(summary: Summary) -> str:
    """Plain-text per-variant table for the terminal (first line: the verdict), within 80
    columns for the demo's labels: the session rate with its interval, the turn rate alone
    (report.md has both intervals and the corrupted turns)."""
    rows = [list(TERMINAL_COLS)]
    rows += [
        [v["label"], str(v["sessions"]), str(v["corrupted_sessions"]),
         short_rate_ci(v["session_corruption_rate"], v["session_corruption_ci"]),
         str(v["classified_turns"]), fmt_pct(v["turn_corruption_rate"]),
         str(v["transport_errors"])]
        for v in summary["variants"]
    ]  # fmt: skip
    widths = [max(len(r[i]) for r in rows) for i in range(len(TERMINAL_COLS))]
    lines = [
        "  ".join(
            c.ljust(w) if i == 0 else c.rjust(w)
            for i, (c, w) in enumerate(zip(r, widths, strict=True))
        ).rstrip()
        for r in rows
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    said = [*coverage.dialect_lines(summary)]
    said += [f"warning: {w}" for w in summary.get("warnings", ())]
    if (summary.get("run") or {}).get("demo"):
        said.append(DEMO_NOTE)
    after = textwrap.wrap(tiers.headline_line(summary), 80) if summary.get("headline") else []
    return "\n".join([f"verdict: {summary['verdict']}", *said, *lines, *after])


def _capital(line: str) -> str:
    return line[:1].upper() + line[1:]


def _fence(text: str) -> str:
    longest = max((len(m) for m in re.findall(r"`+", text)), default=0)
    return "`" * max(3, longest + 1)


def render_markdown(
    summary: Summary, plot_files: Mapping[str, str], examples: Mapping[str, list[dict[str, Any]]]
) -> str:
    out = [
        f"# Corruption report: run {summary['run_id']}",
        *report_facts.run_markdown(summary),
        "",
        "## Verdict",
        "",
        summary["verdict"],
        "",
        *([f"{_capital(tiers.headline_line(summary))}.", ""] if summary.get("headline") else []),
        *report_servers.warning_lines(summary),
    ]
    out += [f"{line[0].upper()}{line[1:]}." for line in coverage.dialect_lines(summary)]
    if summary.get("warnings"):
        out += ["", "**Warnings:**", ""] + [f"- {w}" for w in summary["warnings"]]
    sess = [c for c in summary["comparisons"] if c["unit"] == "session"]
    out += [f"- {comparison_line(c)}" for c in sess]
    out += ["", f"Baseline: `{summary['baseline']}`. {METHOD.format(summary['confidence'])}",
            "", "## Variants", ""]  # fmt: skip
    out += ["| " + " | ".join(TABLE_COLS) + " |", "|" + "---|" * len(TABLE_COLS)]
    out += ["| " + " | ".join(c.replace("|", "\\|") for c in r) + " |" for r in table_rows(summary)]
    failed = [(v["label"], v.get("harness_errors") or 0) for v in summary["variants"]]
    if any(n for _, n in failed):
        out += ["", "Harness errors (the harness failed on these turns: counted neither for nor "
                "against the server; see the log for the traceback): "
                + ", ".join(f"`{label}` {n}" for label, n in failed if n)]  # fmt: skip
    out += report_facts.cancelled_markdown(summary["variants"])
    if summary["comparisons"]:
        out += ["", "## Comparisons with the baseline", "",
                "| variant | unit | rate | baseline | difference [95% CI] | p | p (Holm) |",
                "|---|---|---|---|---|---|---|"]  # fmt: skip
        for c in summary["comparisons"]:
            d, lo, hi = fmt_diff(c["diff"], *c["diff_ci"])
            out.append(f"| {c['b']} | {c['unit']} | {fmt_pct(c['rate_b'])} | "
                       f"{fmt_pct(c['rate_a'])} | {d} [{lo}, {hi}] points | "
                       f"{fmt_p(c['p_value'])} | {fmt_p(c['p_holm'])} |")  # fmt: skip
        onsets = [line for c in summary["comparisons"] if (line := onset.sentence(c))]
        if onsets:
            out += ["", "How many turns it took (the cumulative test over turns):", ""]
        out += [f"- {line}." for line in onsets]
    out += shared_sections(summary)
    out += report_servers.markdown(summary)
    if plot_files:
        out += ["", "## Plots", ""]
        out += [f"![{name}]({rel})" for name, rel in plot_files.items()]
    out += ["", "## Worst examples", ""]
    if not any(examples.values()):
        out.append("No corrupted turns.")
    for variant, rows in examples.items():
        out += [f"### {variant}", ""]
        for ex in rows:
            e = ex["excerpt"]
            where = (
                f"from character {e['offset']}" if e["offset"] is not None else "no offset given"
            )
            out.append(f"**{ex['label']}** (repeat {ex['repeat']}, session {ex['session']}, "
                       f"turn {ex['turn']}, attempt {ex['attempt']}, {ex['prompt_tokens']} prompt "
                       f"tokens; ⟦ ⟧ marks the flagged span, {where}"
                       f"{' of the reasoning' if ex['in_reasoning'] else ''})")  # fmt: skip
            body = ("…" if e["cut_before"] else "") + e["pre"]
            body += f"⟦{e['span']}⟧" if e["offset"] is not None else ""
            body += e["post"] + ("…" if e["cut_after"] else "")
            if report_facts.has_calls(ex["tool_calls"]):
                body += f"\n[tool_calls] {ex['tool_calls']}"
            body += "".join(f"\n{line}" for line in report_facts.evidence_lines(ex["evidence"]))
            fence = _fence(body)
            out += ["", fence + "text", body, fence, ""]
    return printable("\n".join(out) + "\n")


def shared_sections(summary: Summary) -> list[str]:
    """The sections after the comparisons, as Markdown: report.md has them as they are,
    report.html renders the same Markdown."""
    out = tiers.markdown(summary)
    out += replays.markdown(summary)
    out += list(confirm_markdown(summary))
    out += list(canary_markdown(summary))
    out += oracles_markdown(summary)
    out += report_facts.sim_accuracy_markdown(summary["variants"])
    out += cache_markdown(summary)
    out += analysis_load.load_lines(summary)
    if any(v.get("harness_self") for v in summary["variants"]):
        out += self_report_lines(summary)
    return out


def cache_markdown(summary: Summary) -> list[str]:
    """Cached-token share and cache pressure per variant (when the turns carry them)."""
    variants = summary["variants"]
    if not any(v.get("cached_token_share") is not None for v in variants):
        return []
    out = ["", "## Cache", "",
           "| variant | cached share of prompt tokens | peak live context | KV capacity | "
           "peak pressure | mean pressure |", "|---|---|---|---|---|---|"]  # fmt: skip
    for v in variants:
        cap = v.get("kv_capacity")
        peak, mean = v.get("pressure_peak"), v.get("pressure_mean")
        live = v.get("live_tokens_peak")
        out.append(
            f"| {v['label']} | {fmt_pct(v.get('cached_token_share'))} | "
            f"{'n/a' if live is None else f'{live:,}'} | {'n/a' if cap is None else f'{cap:,}'} | "
            f"{'n/a' if peak is None else f'{peak:.2f}x'} | "
            f"{'n/a' if mean is None else f'{mean:.2f}x'} |"
        )
    out += [
        "",
        "Pressure: the live context of all sessions (latest prompt and answer, running or "
        "thinking) over the server's KV capacity; above 1x the pool evicts.",
    ]
    return out


# ---- the report ----------------------------------------------------------------------------


def _attach_self_report(summary: Summary, run_dir: Path) -> None:
    """``variants[].harness_self``: the harness's own lag and CPU per load (selfreport.jsonl)."""
    path = run_dir / SELF_REPORT_FILE
    if not path.exists():
        return
    rows: dict[str, list[dict[str, Any]]] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        with contextlib.suppress(json.JSONDecodeError):
            row = json.loads(line)
            rows.setdefault(row.pop("variant", ""), []).append(row)
    saturated = []
    for v in summary["variants"]:
        loads = rows.get(v["label"])
        if loads:
            v["harness_self"] = loads
            if any(r.get("saturated") for r in loads):
                saturated.append(v["label"])
    summary["harness_saturated"] = saturated


def _attach_load(summary: Summary, run: analysis.RunData) -> None:
    """``variants[].load``: the concurrency asked, sent and seen by the server; and
    ``load_short``, the variants whose server ran less than asked."""
    asked = run.meta.get("concurrency")
    seen = analysis_load.load_seen(
        run.turns, run.metrics, asked if isinstance(asked, int) else None
    )
    for v in summary["variants"]:
        if v["label"] in seen:
            v["load"] = seen[v["label"]]
    summary["load_short"] = analysis_load.short_variants(seen)


def self_report_lines(summary: Mapping[str, Any]) -> list[str]:
    """Markdown: the harness's own cost per variant, and a warning when it was saturated."""
    out = ["", "## The harness itself", ""]
    if summary.get("harness_saturated"):
        out += [
            "**Warning: the harness was itself saturated in "
            f"{', '.join(summary['harness_saturated'])}; its lag adds to the latencies "
            "reported, and the server saw less concurrency than asked.**",
            "",
        ]
    out += [
        "| variant | turns/s | CPU % | event-loop lag p50 / p99 ms | send lag p99 ms "
        "| verdict wait p50 / p99 ms | stale-connection resends |",
        "|---|---|---|---|---|---|---|",
    ]
    for v in summary["variants"]:
        for r in v.get("harness_self") or []:
            lag = r.get("loop_lag_ms") or {}
            send = r.get("send_lag_ms") or {}
            judged = r.get("judge_wait_ms") or {}
            out.append(
                f"| {v['label']} | {r.get('turns_per_s')} | {r.get('cpu_percent')} | "
                f"{lag.get('p50', 'n/a')} / {lag.get('p99', 'n/a')} | {send.get('p99', 'n/a')} | "
                f"{judged.get('p50', 'n/a')} / {judged.get('p99', 'n/a')} | "
                f"{r.get('stale_resends', 0)} |"
            )
    return out


def build_summary(run: analysis.RunData, alpha: float = analysis.ALPHA) -> Summary:
    summary = analysis.summarize(run.turns, run.run_id, run.variants, alpha=alpha)
    confirm.attach(summary, run.run_dir)  # confirm.jsonl / reference.jsonl, when recorded
    canary_deviations.attach(summary, run.run_dir)  # canary.jsonl, when recorded
    judge.attach(summary, run.run_dir)  # judge.jsonl, when recorded
    oracles.attach(summary, run.run_dir)  # oracle_*.jsonl, when an exact oracle ran
    _attach_self_report(summary, run.run_dir)
    _attach_load(summary, run)
    report_servers.attach(summary, run)  # server_facts.jsonl, metrics beside corruption
    for key in ("started_at", "finished_at"):
        if key in run.meta:
            summary[key] = run.meta[key]
    interrupted = run.meta.get("interrupted")
    summary["interrupted"] = interrupted
    if interrupted:
        summary["verdict"] = (
            f"INTERRUPTED ({interrupted}): the run was cut short, these numbers cover only the "
            f"turns done. {summary['verdict']}"
        )
    summary["run"] = report_facts.run_facts(run.meta, run.run_dir)
    return summary


def write_report(run_dir: Path | str, alpha: float = analysis.ALPHA) -> Summary:
    """Rebuild summary.json, turns.parquet, plots/, report.md and report.html of a run."""
    run_dir = Path(run_dir)
    run = analysis.load_run(run_dir)
    summary = build_summary(run, alpha)
    summary["replays"] = replays.replay_lines(run.turns, run_dir)
    made = plots.make_plots(run, summary, run_dir / PLOTS_DIR)
    if any("canary" in v for v in summary["variants"]):
        order = [v["label"] for v in summary["variants"]]
        drawn = plot_canary(run_dir, order, run_dir / PLOTS_DIR / "canary.png")
        if drawn is not None:
            made["canary"] = drawn
    if (drawn := plot_passkeys(summary, run_dir / PLOTS_DIR / "passkeys.png")) is not None:
        made["passkeys"] = drawn
    summary["plots"] = {name: f"{PLOTS_DIR}/{p.name}" for name, p in made.items()}
    (run_dir / SUMMARY_FILE).write_text(
        json.dumps(summary, indent=2, ensure_ascii=False) + "\n", encoding="utf-8"
    )
    if len(run.turns):
        frames.write_tidy(run.turns, run_dir / TIDY_FILE, source=run_dir / TURNS_FILE)
    examples = worst_examples(run.turns) if len(run.turns) else {}
    (run_dir / REPORT_MD).write_text(
        render_markdown(summary, summary["plots"], examples), encoding="utf-8"
    )
    html = report_html.render_html(
        summary,
        made,
        examples,
        opening=report_facts.markdown_html(report_facts.run_markdown(summary)),
        shared=report_facts.markdown_html(shared_sections(summary)),
    )
    (run_dir / REPORT_HTML).write_text(html, encoding="utf-8")
    log.info("report written to %s", run_dir / REPORT_HTML)
    return summary


# ---- compare two runs ----------------------------------------------------------------------


def load_summary(run: Path | str) -> Summary:
    """summary.json of a run folder (or the file itself); rebuilt from turns.jsonl if missing."""
    path = Path(run)
    if path.is_file() and path.suffix == ".json":
        return dict(json.loads(path.read_text(encoding="utf-8")))
    if (path / SUMMARY_FILE).is_file():
        return dict(json.loads((path / SUMMARY_FILE).read_text(encoding="utf-8")))
    if (path / TURNS_FILE).is_file():
        return build_summary(analysis.load_run(path))
    raise UsageError(f"{run}: neither a summary.json nor a run folder with turns.jsonl")


def compare_runs(
    run_a: Path | str, run_b: Path | str, alpha: float = analysis.ALPHA
) -> dict[str, Any]:
    """Variant by variant (matched by label): rates of A and B, Fisher p, flagged regressions.

    ``p_value`` is two-sided; ``p_increase`` is one-sided (B corrupts more than A),
    Holm-corrected across the matched variants into ``p_increase_holm``; a variant whose
    session rate rose with ``p_increase_holm < alpha`` is a regression.
    """
    sa, sb = load_summary(run_a), load_summary(run_b)
    va = {v["label"]: v for v in sa["variants"]}
    vb = {v["label"]: v for v in sb["variants"]}
    rows: list[dict[str, Any]] = []
    for label in [lab for lab in vb if lab in va]:
        row: dict[str, Any] = {"label": label}
        for unit, k, n in (
            ("session", "corrupted_sessions", "sessions"),
            ("turn", "corrupted_turns", "classified_turns"),
        ):
            a, b = va[label], vb[label]
            d, lo, hi = stats.diff_ci(b[k], b[n], a[k], a[n])
            row[unit] = {
                "k_a": a[k], "n_a": a[n], "rate_a": a[f"{unit}_corruption_rate"],
                "ci_a": a[f"{unit}_corruption_ci"], "k_b": b[k], "n_b": b[n],
                "rate_b": b[f"{unit}_corruption_rate"], "ci_b": b[f"{unit}_corruption_ci"],
                "diff": d, "diff_ci": [lo, hi],
                "p_value": stats.fisher_exact(b[k], b[n], a[k], a[n]),
                "p_increase": stats.fisher_exact(b[k], b[n], a[k], a[n], alternative="greater"),
            }  # fmt: skip
        rows.append(row)
    adjusted = stats.holm([r["session"]["p_increase"] for r in rows])
    for r, adj in zip(rows, adjusted, strict=True):
        r["session"]["p_increase_holm"] = adj
        r["regression"] = bool(adj < alpha and r["session"]["diff"] > 0)
    return {
        "run_a": sa["run_id"], "run_b": sb["run_id"], "alpha": alpha, "variants": rows,
        "only_in_a": [lab for lab in va if lab not in vb],
        "only_in_b": [lab for lab in vb if lab not in va],
        "regressions": [r["label"] for r in rows if r["regression"]],
    }  # fmt: skip


def compare_markdown(cmp: Mapping[str, Any]) -> str:
    regs = cmp["regressions"]
    head = f"**Regression** in {', '.join(regs)}" if regs else "No significant regression"
    head += (f" (run {cmp['run_b']} against run {cmp['run_a']}: one-sided Fisher exact test on "
             f"corrupted sessions, Holm-corrected, alpha {cmp['alpha']}).")  # fmt: skip
    cols = ["variant", "sessions A", "sessions B", "change [95% CI]", "p (two-sided)",
            "p rise (Holm)", "turns A", "turns B", "regression"]  # fmt: skip
    out = [f"# Compare {cmp['run_a']} -> {cmp['run_b']}", "", head, "",
           "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]  # fmt: skip
    for r in cmp["variants"]:
        s, t = r["session"], r["turn"]
        diff = fmt_diff(s["diff"], *s["diff_ci"])
        out.append(
            f"| {r['label']} | {rate_ci(s['rate_a'], s['ci_a'])} | "
            f"{rate_ci(s['rate_b'], s['ci_b'])} | "
            f"{diff[0]} [{diff[1]}, {diff[2]}] points | "
            f"{fmt_p(s['p_value'])} | "
            f"{fmt_p(s['p_increase_holm'])} | {fmt_pct(t['rate_a'])} | {fmt_pct(t['rate_b'])} | "
            f"{'REGRESSION' if r['regression'] else ''} |"
        )
    for key, name in (("only_in_a", "Only in A"), ("only_in_b", "Only in B")):
        if cmp[key]:
            out += ["", f"{name}: " + ", ".join(cmp[key])]
    return "\n".join(out) + "\n"
