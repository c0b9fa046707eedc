"""The commands that read run folders or saved outputs: report, compare, merge, classify,
replay."""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path
from typing import Any

from harness.argtypes import api_key_from_env
from harness.cli.gates import (
    EXIT_GATE,
    EXIT_INFRA,
    EXIT_OK,
    EXIT_USAGE,
    apply_gates,
    check_gate_args,
)
from harness.errors import UsageError
from harness.record.rundir import TURNS_FILE
from harness.run.merge import merge_shards
from harness.verdict.batch import classify_files


def _run_dir(path: Path) -> Path:
    if not (path / TURNS_FILE).exists():
        raise UsageError(f"{path} is not a run folder (no {TURNS_FILE} in it)")
    return path


def cmd_report(args: argparse.Namespace) -> int:
    from harness.report.build import format_table, write_report

    check_gate_args(args)
    summary = write_report(_run_dir(args.run_dir))
    print(format_table(summary))
    print(f"report: {args.run_dir / 'report.md'} and {args.run_dir / 'report.html'}")
    interrupted = summary.get("interrupted")
    if interrupted:
        print(
            f"harness: this run was interrupted ({interrupted}): the report covers the turns "
            f"done (continue with: harness run --resume {args.run_dir})",
            file=sys.stderr,
        )
    return apply_gates(args, summary)


def cmd_compare(args: argparse.Namespace) -> int:
    """Exit 1 when a variant regressed significantly, 2 when the runs share no variant."""
    from harness.report.build import compare_markdown, compare_runs

    result = compare_runs(_run_dir(args.run_a), _run_dir(args.run_b))
    if not result["variants"]:
        raise UsageError(
            f"{args.run_a} and {args.run_b} share no variant (A has "
            f"{', '.join(result['only_in_a']) or 'none'}; B has "
            f"{', '.join(result['only_in_b']) or 'none'}): nothing to compare"
        )
    print(compare_markdown(result))
    return EXIT_GATE if result["regressions"] else EXIT_OK


def cmd_classify(args: argparse.Namespace) -> int:
    stats: Any = classify_files(args.input, args.output)
    for err in getattr(stats, "errors", []):
        print(f"harness classify: {err}", file=sys.stderr)
    return EXIT_USAGE if getattr(stats, "errors", None) else EXIT_OK


def cmd_replay(args: argparse.Namespace) -> int:
    from harness.run.replay import ReplayOptions, format_replay, replay

    if args.load < 0:
        raise UsageError(f"--load must be 0 or more, got {args.load}")
    result = asyncio.run(
        replay(
            ReplayOptions(
                run_dir=args.run_dir,
                session=args.session,
                variant=args.variant,
                repeat=args.repeat,
                turn=args.turn,
                attempt=args.attempt,
                count=args.count,
                load=args.load,
                endpoint=args.endpoint,
                model=args.model,
                api_key=api_key_from_env(args.api_key_env),
                request_timeout=args.request_timeout,
            )
        )
    )
    print(format_replay(result))
    print(f"replay: {result['path']}")
    return EXIT_OK


def cmd_merge(args: argparse.Namespace) -> int:
    from harness.report.build import format_table, write_report

    check_gate_args(args)
    result = merge_shards(list(args.shard_dirs), args.out, args.shards)
    summary = write_report(args.out)
    print(format_table(summary))
    print(
        f"merged {len(result.present)} of {result.count} shards, {result.turns} turns: "
        f"{args.out}"
        + (
            f" (their clocks differ by {result.largest_offset_s:.0f}s, more than the 1s the "
            "servers' Date header can tell)"
            if (result.largest_offset_s or 0) > 1.0
            else ""
        )
    )
    code = apply_gates(args, summary)
    for problem in result.problems():
        print(f"harness merge: {problem}", file=sys.stderr)
    return code if result.complete else EXIT_INFRA
