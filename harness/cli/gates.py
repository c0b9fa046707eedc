"""CI gate arguments of ``harness run`` and ``harness report``: check them early, apply them.

Exit codes: 0 all gates passed; 1 a gate failed (``compare``: a significant regression);
2 bad usage or configuration; 3 infrastructure (a server would not start, an endpoint
unreachable); 128 + N when signal N stopped the run (130 Ctrl-C, 143 SIGTERM, 129 SIGHUP).
The one-line JSON result's ``passed`` is true exactly when the exit code is 0.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

from harness.analysis.gates import (
    all_passed,
    baseline_gate,
    check_baseline,
    check_exprs,
    evaluate_gates,
    result_line,
    summary_properties,
    write_junit,
)
from harness.errors import EXIT_GATE as EXIT_GATE
from harness.errors import EXIT_INFRA as EXIT_INFRA
from harness.errors import EXIT_OK as EXIT_OK
from harness.errors import EXIT_USAGE as EXIT_USAGE
from harness.errors import UsageError
from harness.record.rundir import SUMMARY_FILE


def report_build() -> ModuleType:
    """``harness.report.build``, loaded by the commands that write or read a report when they
    do: it brings pandas and matplotlib (1.5 s), which neither ``harness --help`` nor a run
    before its first request may wait for."""
    from harness.report import build  # lazy: pandas, matplotlib (the reason above)

    return build


def add_gate_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("CI gates (exit code 1 when one fails)")
    g.add_argument(
        "--fail-if",
        action="append",
        default=[],
        metavar="EXPR",
        help="fail when EXPR holds, e.g. 'session_corruption_rate > 0.01' or "
        "'turn_corruption_rate[index_k=bf16] >= 0.05'; repeatable",
    )
    g.add_argument(
        "--baseline",
        type=Path,
        metavar="RUN_DIR",
        help="fail a variant whose session corruption rose significantly against "
        "the same variant of this earlier run",
    )
    g.add_argument("--junit", type=Path, metavar="FILE", help="write gate results as JUnit XML")


def check_gate_args(args: argparse.Namespace, variants: list[str] | None = None) -> None:
    """Validate gate expressions and the baseline before any work starts; given the planned
    ``variants``, a gate naming another variant, or a baseline sharing none, fails now."""
    check_exprs(args.fail_if, variants)
    if args.baseline is not None and not (
        (args.baseline / SUMMARY_FILE).exists() or args.baseline.suffix == ".json"
    ):
        raise UsageError(
            f"--baseline {args.baseline}: no summary.json there (run `harness report` on it)"
        )
    if args.baseline is not None and variants is not None:
        # (pandas and matplotlib come with the report: only for a baseline, at the start)
        summary = report_build().load_summary(args.baseline)
        check_baseline(variants, summary, str(args.baseline))


def apply_gates(
    args: argparse.Namespace,
    summary: Any,
    *,
    run_code: int = EXIT_OK,
    run_problem: str | None = None,
    interrupted: str | None = None,
) -> int:
    """Evaluate the gates on a summary, print the one-line result, return the exit code:
    ``run_code`` when the run itself failed (interrupted, infrastructure, configuration:
    ``run_problem`` says why), else 1 when a gate failed, else 0."""
    results = evaluate_gates(summary, args.fail_if)
    if args.baseline is not None:
        results += baseline_gate(summary, report_build().load_summary(args.baseline))
    for r in results:
        if not r.passed:
            print(f"gate failed: {r.message}", file=sys.stderr)
    code = run_code or (EXIT_OK if all_passed(results) else EXIT_GATE)
    failure = None
    if run_code:
        failure = f"exit code {run_code}: {run_problem or 'the run failed'}"
    if args.junit is not None:
        write_junit(args.junit, results, run_failure=failure,
                    properties=summary_properties(summary))  # fmt: skip
    interrupted = interrupted or summary.get("interrupted")
    print(result_line(summary, results, code, interrupted, run_problem if run_code else None))
    return code


def print_failure_line(
    run_id: str | None, code: int, problem: str, interrupted: str | None = None
) -> None:
    """The one-line JSON result of a run that has no summary to give."""
    print(result_line({"run_id": run_id, "variants": []}, [], code, interrupted, problem))


#: How many replay lines the terminal shows (report.md lists more).
SHOWN_REPLAYS = 3


def print_replays(summary: Any) -> None:
    """The first corrupted sessions, each as a ready-to-run ``harness replay`` line."""
    replays = summary.get("replays") or {}
    lines = (replays.get("lines") or [])[:SHOWN_REPLAYS]
    if not lines:
        return
    more = replays.get("count", 0) - len(lines)
    print("reproduce a corrupted session" + (f" ({more} more in report.md):" if more > 0 else ":"))
    for line in lines:
        print(f"  {line}")
