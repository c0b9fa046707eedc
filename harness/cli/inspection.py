"""The commands that read a run folder or saved outputs: report, compare, classify, replay."""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path
from typing import Any

from harness.argtypes import api_key_from_env
from harness.cli.gates import EXIT_OK, EXIT_USAGE, apply_gates, check_gate_args
from harness.errors import UsageError
from harness.record.rundir import TURNS_FILE
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
    return apply_gates(args, summary)


def cmd_compare(args: argparse.Namespace) -> int:
    from harness.report.build import compare_markdown, compare_runs

    result = compare_runs(_run_dir(args.run_a), _run_dir(args.run_b))
    print(compare_markdown(result))
    return EXIT_OK


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
