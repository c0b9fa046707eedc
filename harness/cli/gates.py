"""CI gate arguments of ``harness run`` and ``harness report``: check them early, apply them.

Exit codes: 0 all gates passed; 1 a gate failed; 2 bad usage or configuration;
3 infrastructure (a server would not start, an endpoint unreachable).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from harness.errors import UsageError
from harness.record.rundir import SUMMARY_FILE

EXIT_OK, EXIT_GATE, EXIT_USAGE, EXIT_INFRA = 0, 1, 2, 3


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


def check_gate_args(args: argparse.Namespace) -> None:
    """Validate gate expressions and the baseline before any work starts."""
    from harness.analysis.gates import check_exprs

    check_exprs(args.fail_if)
    if args.baseline is not None and not (
        (args.baseline / SUMMARY_FILE).exists() or args.baseline.suffix == ".json"
    ):
        raise UsageError(
            f"--baseline {args.baseline}: no summary.json there (run `harness report` on it)"
        )


def apply_gates(args: argparse.Namespace, summary: Any) -> int:
    """Evaluate the gates on a summary, print the one-line result, return the exit code."""
    from harness.analysis.gates import (
        all_passed,
        baseline_gate,
        evaluate_gates,
        result_line,
        summary_properties,
        write_junit,
    )
    from harness.report.build import load_summary

    results = evaluate_gates(summary, args.fail_if)
    if args.baseline is not None:
        results += baseline_gate(summary, load_summary(args.baseline))
    for r in results:
        if not r.passed:
            print(f"gate failed: {r.message}", file=sys.stderr)
    if args.junit is not None:
        write_junit(args.junit, results, properties=summary_properties(summary))
    print(result_line(summary, results))
    return EXIT_OK if all_passed(results) else EXIT_GATE
