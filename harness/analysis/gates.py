"""CI gates over a summary: ``--fail-if`` expressions, a baseline gate, JUnit XML, a result line.

A gate *fails* when its expression holds: ``--fail-if "session_corruption_rate > 0.01"`` fails
every variant whose session corruption rate is above 1%.
"""

from __future__ import annotations

import json
import math
import operator
import re
import xml.etree.ElementTree as ET
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from harness.analysis import stats
from harness.analysis.oracles import ORACLE_METRICS
from harness.errors import EXIT_GATE, EXIT_OK, UsageError
from harness.record import safejson

FORM = "METRIC OP NUMBER or METRIC[VARIANT] OP NUMBER, e.g. 'session_corruption_rate > 0.01'"
OPS: dict[str, Callable[[float, float], bool]] = {
    ">=": operator.ge, "<=": operator.le, "==": operator.eq, "!=": operator.ne,
    ">": operator.gt, "<": operator.lt,
}  # fmt: skip
_EXPR = re.compile(
    r"^\s*(?P<metric>[A-Za-z_][A-Za-z0-9_]*)\s*(?:\[(?P<variant>[^\]]*)\])?\s*"
    r"(?P<op>>=|<=|==|!=|>|<)\s*(?P<number>[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?%?)\s*$"
)


@dataclass(frozen=True)
class Gate:
    expr: str
    metric: str
    op: str
    threshold: float
    variant: str | None = None


@dataclass(frozen=True)
class GateResult:
    name: str  # the expression, or "baseline:session_corruption_rate"
    variant: str
    passed: bool
    value: float | None
    message: str
    skipped: bool = False  # no value to judge (e.g. a metric not measured in this variant)


def _numeric(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def numeric_fields(summary: Mapping[str, Any]) -> list[str]:
    """Per-variant fields a gate can test (numeric in at least one variant, or null)."""
    seen: dict[str, None] = {}
    for v in summary.get("variants", []):
        for key, value in v.items():
            if _numeric(value):
                seen[key] = None
    return list(seen)


def parse_gate(expr: str) -> Gate:
    """Parse one ``--fail-if`` expression; a trailing % divides the number by 100."""
    m = _EXPR.match(expr)
    if not m:
        raise UsageError(f"--fail-if {expr!r}: not understood; the accepted form is {FORM}, "
                         f"with OP one of {' '.join(OPS)}")  # fmt: skip
    number = m["number"]
    threshold = float(number.rstrip("%")) / (100.0 if number.endswith("%") else 1.0)
    variant = m["variant"].strip() if m["variant"] is not None else None
    if variant == "":
        raise UsageError(f"--fail-if {expr!r}: empty variant in [...]; the accepted form is {FORM}")
    return Gate(expr=expr.strip(), metric=m["metric"], op=m["op"], threshold=threshold,
                variant=variant)  # fmt: skip


#: The per-variant numbers summary.json always has (others may appear, e.g. sim_recall).
KNOWN_METRICS = (
    "sessions", "sessions_seen", "turns", "classified_turns", "corrupted_sessions",
    "corrupted_turns", "session_corruption_rate", "turn_corruption_rate",
    "session_corruption_ci_lo", "session_corruption_ci_hi", "turn_corruption_ci_lo",
    "turn_corruption_ci_hi", "transport_errors", "transport_error_rate", "cancelled_turns",
    "retries",
    "noncanonical_turns", "first_corrupted_turn_median", "prompt_tokens_max", "ttft_p50_s",
    "ttft_p95_s", "itl_p50_s", "itl_p95_s", "latency_p50_s", "sim_injected_turns",
    "sim_recall", "sim_precision", "sim_false_alarms", "sim_suspect_false_alarms",
    # a tools workload only (harness.analysis.coverage): sessions that got no tool call at
    # all, and the share of turns that carried one
    "sessions_without_tool_calls", "tool_call_share",
    # --canary (harness.analysis.canary_deviations) and --confirm's judge (harness.analysis.judge)
    "canary_max_kl", "canary_deviating_share", "confirmed_session_corruption_rate",
    # the verdict's tiers (harness.analysis.tiers): the headline rates count structural +
    # confirmed (or structural + suspect where no suspect could be judged)
    "structural_turns", "confirmed_turns", "suspect_turns",
    # the exact oracles (harness.analysis.oracles)
    *ORACLE_METRICS,
)  # fmt: skip


def _guess(word: str, names: Sequence[str]) -> str:
    """ " (did you mean X?)" for a mistyped name, or nothing."""
    import difflib

    close = difflib.get_close_matches(word, list(names), n=1, cutoff=0.6)
    return f" (did you mean {close[0]}?)" if close else ""


def check_exprs(exprs: Sequence[str], variants: Sequence[str] | None = None) -> list[Gate]:
    """Validate ``--fail-if`` expressions before a run starts: syntax, metric name and, given
    the planned ``variants``' labels, the variant a gate names."""
    gates = [parse_gate(e) for e in exprs]
    for g in gates:
        if g.metric not in KNOWN_METRICS:
            raise UsageError(f"--fail-if {g.expr!r}: unknown metric {g.metric!r}"
                             f"{_guess(g.metric, KNOWN_METRICS)}; per-variant "
                             f"metrics are: {', '.join(KNOWN_METRICS)}")  # fmt: skip
        if variants is not None and g.variant is not None and g.variant not in variants:
            raise UsageError(f"--fail-if {g.expr!r}: no variant {g.variant!r} is planned; the "
                             f"variants are: {', '.join(variants)}")  # fmt: skip
    return gates


def check_baseline(labels: Sequence[str], baseline_summary: Mapping[str, Any], where: str) -> None:
    """A baseline run that shares no variant with this one can judge nothing: an error."""
    before = [v["label"] for v in baseline_summary.get("variants", [])]
    if not any(label in before for label in labels):
        raise UsageError(f"--baseline {where}: none of this run's variants ({', '.join(labels)}) "
                         f"is in it (it has: {', '.join(before) or 'none'}); give a baseline run "
                         "of the same variants")  # fmt: skip


def _check_gate(gate: Gate, summary: Mapping[str, Any]) -> None:
    fields = numeric_fields(summary)
    labels = [v["label"] for v in summary.get("variants", [])]
    if gate.metric not in fields and not any(gate.metric in v for v in summary.get("variants", [])):
        raise UsageError(f"--fail-if {gate.expr!r}: unknown metric {gate.metric!r}"
                         f"{_guess(gate.metric, fields)}; numeric "
                         f"per-variant metrics are: {', '.join(fields)}")  # fmt: skip
    if gate.variant is not None and gate.variant not in labels:
        raise UsageError(f"--fail-if {gate.expr!r}: no variant {gate.variant!r} in this run; "
                         f"variants are: {', '.join(labels)}")  # fmt: skip


def evaluate_gates(summary: Mapping[str, Any], exprs: Sequence[str]) -> list[GateResult]:
    """One result per (expression, variant in scope). Raises UsageError on a bad expression."""
    gates = [parse_gate(e) for e in exprs]
    for g in gates:
        _check_gate(g, summary)
    results: list[GateResult] = []
    for g in gates:
        for v in summary["variants"]:
            if g.variant is not None and v["label"] != g.variant:
                continue
            value = v.get(g.metric)
            if value is None:
                results.append(GateResult(g.expr, v["label"], True, None,
                                          f"{g.metric} has no value in {v['label']}: not judged",
                                          skipped=True))  # fmt: skip
                continue
            if not _numeric(value):
                raise UsageError(f"--fail-if {g.expr!r}: {g.metric} is not a number "
                                 f"({type(value).__name__}); form: {FORM}")  # fmt: skip
            value = float(value)
            fails = OPS[g.op](value, g.threshold)
            verb = "FAILED" if fails else "passed"
            msg = f"{verb}: {g.metric} = {value:.6g} in {v['label']} ({g.op} {g.threshold:g} fails)"
            msg += _tiers_note(g.metric, v)
            results.append(GateResult(g.expr, v["label"], not fails, value, msg))
    return results


def baseline_gate(
    summary: Mapping[str, Any], baseline_summary: Mapping[str, Any], alpha: float = 0.05
) -> list[GateResult]:
    """Fail a variant whose session corruption rate rose significantly against the
    same-labelled variant of a previous run (one-sided Fisher exact test, p < alpha)."""
    name = "baseline:session_corruption_rate"
    check_baseline([v["label"] for v in summary["variants"]], baseline_summary,
                   str(baseline_summary.get("run_id", "?")))  # fmt: skip
    before = {v["label"]: v for v in baseline_summary.get("variants", [])}
    results = []
    for v in summary["variants"]:
        old = before.get(v["label"])
        if old is None:
            results.append(GateResult(name, v["label"], True, None,
                                      f"{v['label']} is not in the baseline run: not judged",
                                      skipped=True))  # fmt: skip
            continue
        k, n = v["corrupted_sessions"], v["sessions"]
        k0, n0 = old["corrupted_sessions"], old["sessions"]
        p = stats.fisher_exact(k, n, k0, n0, alternative="greater")
        rate = k / n if n else None
        rose = p < alpha
        msg = (f"{'FAILED' if rose else 'passed'}: {k}/{n} sessions corrupted against {k0}/{n0} "
               f"in the baseline run {baseline_summary.get('run_id', '?')} "
               f"(one-sided Fisher p={p:.3g}, alpha {alpha})"
               + _tiers_note("corrupted_sessions", v))  # fmt: skip
        results.append(GateResult(name, v["label"], not rose, rate, msg))
    return results


#: The metrics that count corrupted turns or sessions by the headline's tiers.
_HEADLINE_METRICS = frozenset({
    "corrupted_sessions", "corrupted_turns", "session_corruption_rate", "turn_corruption_rate",
    "session_corruption_ci_lo", "session_corruption_ci_hi", "turn_corruption_ci_lo",
    "turn_corruption_ci_hi",
})  # fmt: skip


def _tiers_note(metric: str, v: Mapping[str, Any]) -> str:
    """Which tiers of the verdict a corruption metric counted in variant ``v``."""
    basis = v.get("headline_basis")
    if metric not in _HEADLINE_METRICS or not basis:
        return ""
    return f" [counts {str(basis).replace('+', ' + ')} turns]"


def all_passed(results: Sequence[GateResult]) -> bool:
    return all(r.passed for r in results)


#: The JUnit test case that stands for the run itself (failed when its exit code is not 0 for
#: a reason other than a gate: interrupted, infrastructure, configuration).
RUN_CASE = "run"


def write_junit(
    path: Path | str,
    results: Sequence[GateResult],
    suite: str = "harness",
    run_failure: str | None = None,
    properties: Sequence[tuple[str, str]] = (),
) -> Path:
    """JUnit XML: one testcase per (gate, variant), failed gates carry a <failure>; with
    ``run_failure`` one more, ``run``, failed with that message; ``properties`` (the model,
    the server warnings) as the suite's <properties>."""
    results = list(results)
    if run_failure is not None:
        results.append(GateResult(RUN_CASE, "run", False, None, run_failure))
    # text from a server (a model's name, a message) may hold a lone surrogate: XML needs UTF-8
    results = [GateResult(**safejson.printable(asdict(r))) for r in results]
    properties = [(safejson.printable(n), safejson.printable(v)) for n, v in properties]
    failures = sum(not r.passed for r in results)
    skipped = sum(r.skipped for r in results)
    root = ET.Element("testsuites", name=suite, tests=str(len(results)), failures=str(failures))
    ts = ET.SubElement(root, "testsuite", name=suite, tests=str(len(results)),
                       failures=str(failures), errors="0", skipped=str(skipped))  # fmt: skip
    if properties:
        props = ET.SubElement(ts, "properties")
        for name, value in properties:
            ET.SubElement(props, "property", name=name, value=value)
    for r in results:
        case = ET.SubElement(ts, "testcase", classname=f"{suite}.{r.variant}", name=r.name)
        if r.skipped:
            ET.SubElement(case, "skipped", message=r.message)
        elif not r.passed:
            fail = ET.SubElement(case, "failure", message=r.message, type="GateFailed")
            fail.text = r.message
        out = ET.SubElement(case, "system-out")
        out.text = f"value={r.value}"
    path = Path(path)
    ET.ElementTree(root).write(path, encoding="utf-8", xml_declaration=True)
    return path


def _clean(x: Any) -> Any:
    return None if isinstance(x, float) and not math.isfinite(x) else x


def result_line(
    summary: Mapping[str, Any],
    results: Sequence[GateResult],
    exit_code: int | None = None,
    interrupted: str | None = None,
    error: str | None = None,
) -> str:
    """One line of JSON for stdout: passed (exactly when the exit code is 0), the exit code,
    whether the run was interrupted, verdict, per-variant headline rates, gate outcomes."""
    keys = ("sessions", "corrupted_sessions", "session_corruption_rate", "turn_corruption_rate",
            "transport_errors", "cancelled_turns", "headline_basis", "suspect_turns")  # fmt: skip
    if exit_code is None:
        exit_code = EXIT_OK if all_passed(results) else EXIT_GATE
    doc = {
        "run_id": summary.get("run_id"),
        "passed": exit_code == EXIT_OK,
        "exit_code": exit_code,
        "interrupted": interrupted,
        "error": error,
        "failed_gates": sum(not r.passed for r in results),
        "verdict": summary.get("verdict"),
        "variants": {
            v["label"]: {k: _clean(v.get(k)) for k in keys} for v in summary.get("variants", [])
        },
        "gates": [{**asdict(r), "value": _clean(r.value)} for r in results],
    }
    doc = safejson.printable(doc)  # a line for a terminal: UTF-8 whatever the server said
    return json.dumps(doc, ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def summary_properties(summary: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The JUnit suite's properties of a summary: the model, each server warning."""
    model = summary.get("model")
    props = [("model", ", ".join(model) if isinstance(model, list) else str(model))]
    props += [("server_warning", w) for w in summary.get("server_warnings") or []]
    return props
