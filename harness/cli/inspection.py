"""The commands that read run folders or saved outputs: report, compare, merge, classify,
replay. ``harness.cli.main`` loads this module when one of them runs (numpy, jsonschema, the
run stack: not for ``--help``); the report's own libraries come later (``report_build``)."""

from __future__ import annotations

import argparse
import asyncio
import io
import json
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
    print_replays,
    report_build,
)
from harness.cli.limit_flags import limits_from
from harness.client.scoring import Scorer, ScoringFailed, detect_api
from harness.errors import InfrastructureError, UsageError
from harness.record.rundir import TURNS_FILE, RunDir
from harness.run.judge import check_judges, judge_run_folder, judge_saved, judge_servers
from harness.run.merge import merge_shards
from harness.run.replay import ReplayOptions, format_replay, replay
from harness.verdict.batch import classify_files, classify_stream


def _run_dir(path: Path) -> Path:
    if not (path / TURNS_FILE).exists():
        raise UsageError(f"{path} is not a run folder (no {TURNS_FILE} in it)")
    return path


def _planned_variants(run_dir: Path) -> list[str] | None:
    """The variants run.json planned (None when it does not say)."""
    try:
        meta = json.loads((run_dir / "run.json").read_text(encoding="utf-8"))
        labels = [str(v["label"]) for v in meta["variants"]]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return labels or None


def cmd_report(args: argparse.Namespace) -> int:
    report = report_build()
    check_gate_args(args, _planned_variants(_run_dir(args.run_dir)))  # before the rebuild
    summary = report.write_report(args.run_dir)
    print(report.format_table(summary))
    print_replays(summary)
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
    report = report_build()
    result = report.compare_runs(_run_dir(args.run_a), _run_dir(args.run_b))
    if not result["variants"]:
        raise UsageError(
            f"{args.run_a} and {args.run_b} share no variant (A has "
            f"{', '.join(result['only_in_a']) or 'none'}; B has "
            f"{', '.join(result['only_in_b']) or 'none'}): nothing to compare"
        )
    print(report.compare_markdown(result))
    return EXIT_GATE if result["regressions"] else EXIT_OK


def cmd_classify(args: argparse.Namespace) -> int:
    if getattr(args, "judge", None):
        return _classify_judged(args)
    stats: Any = classify_files(args.input, args.output, dialect=args.dialect)
    for err in getattr(stats, "errors", []):
        print(f"harness classify: {err}", file=sys.stderr)
    return EXIT_USAGE if getattr(stats, "errors", None) else EXIT_OK


def _classify_judged(args: argparse.Namespace) -> int:
    """``harness classify --judge URL``: classify, then score every output teacher-forced."""
    source = sys.stdin if args.input in (None, Path("-")) else None
    try:
        text = source.read() if source is not None else args.input.read_text(encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"cannot read {args.input}: {exc.strerror}") from None
    inputs: dict[str, dict[str, Any]] = {}
    lines = []
    for line in text.splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            lines.append(line)  # the classifier names it
            continue
        if isinstance(rec, dict):
            inputs[str(rec.get("id"))] = dict(rec)
            for judges in ("messages", "temperature"):  # the judge's, not the classifier's
                rec.pop(judges, None)
            line = json.dumps(rec, ensure_ascii=False)
        lines.append(line)
    out = io.StringIO()
    stats: Any = classify_stream(io.StringIO("\n".join(lines) + "\n"), out, dialect=args.dialect)
    labelled = [json.loads(x) for x in out.getvalue().splitlines() if x.strip()]

    async def judged() -> tuple[list[dict[str, Any]], str | None]:
        api = args.scoring_api if args.scoring_api != "auto" else await detect_api(args.judge)
        async with Scorer(args.judge, api) as scorer:
            return await judge_saved(inputs, labelled, scorer)

    rows, why = asyncio.run(judged())
    if why is not None:
        raise InfrastructureError(f"--judge {args.judge}: the server cannot score a given text: "
                                  f"{why}")  # fmt: skip
    body = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
    if args.output in (None, Path("-")):
        sys.stdout.write(body)
    else:
        args.output.write_text(body, encoding="utf-8")
    for err in getattr(stats, "errors", []):
        print(f"harness classify: {err}", file=sys.stderr)
    return EXIT_USAGE if getattr(stats, "errors", None) else EXIT_OK


def cmd_replay(args: argparse.Namespace) -> int:
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
                limits=limits_from(args),
                target=args.target,
                target_vars=tuple(args.target_var),
            )
        )
    )
    print(format_replay(result))
    print(f"replay: {result['path']}")
    return EXIT_OK


def cmd_merge(args: argparse.Namespace) -> int:
    report = report_build()
    check_gate_args(args)
    servers: dict[str, str] = {}
    if args.judge:  # (checked before anything is written)
        meta = RunDir(args.shard_dirs[0]).read_meta()
        labels = [str(v["label"]) for v in meta.get("variants") or []]
        servers = judge_servers(args.judge, labels)
        for warning in asyncio.run(check_judges(servers, meta)):
            print(f"harness merge: warning: {warning}", file=sys.stderr)
    result = merge_shards(list(args.shard_dirs), args.out, args.shards)
    judge_failed = None
    if servers:

        def say(line: str) -> None:
            print(f"harness merge: {line}", file=sys.stderr, flush=True)

        try:
            asyncio.run(judge_run_folder(
                args.out, servers, args.scoring_api, args.judge_concurrency, say
            ))  # fmt: skip
        except (OSError, InfrastructureError, ScoringFailed) as exc:
            judge_failed = f"the judge stopped: {exc}; the merged turns are all in {args.out}"
    summary = report.write_report(args.out)
    print(report.format_table(summary))
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
    suspects = sum(v.get("suspect_turns") or 0 for v in summary.get("variants", ()))
    if not servers and suspects:
        print(f"harness merge: no shard judges: the rates count the text detector's {suspects} "
              "suspect turns unconfirmed; --judge URL (an idle server of the run's model) "
              "scores them as a run in one process does", file=sys.stderr)  # fmt: skip
    if judge_failed is not None:
        print(f"harness merge: error: {judge_failed}", file=sys.stderr)
        return EXIT_INFRA
    return code if result.complete else EXIT_INFRA
