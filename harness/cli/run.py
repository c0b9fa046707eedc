"""``harness run``: build the options, show progress, write the report, print the table."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from harness.analysis.rawcompare import compare_runs
from harness.argtypes import api_key_from_env
from harness.cli.gates import apply_gates, check_gate_args
from harness.client.raw import check_api
from harness.drive.driver import Progress as Counts
from harness.drive.trace_session import check_options
from harness.errors import ConfigError, InfrastructureError, UsageError
from harness.pool.parent import auto_workers
from harness.record.rundir import TURNS_FILE, RunDir
from harness.run.execute import (
    VariantOutcome,
    execute,
    new_run_id,
    write_run_json,
)
from harness.run.options import RunOptions
from harness.run.plan import format_plan
from harness.target.launch import check_variants
from harness.target.spec import default_sim_target, load_target
from harness.workload.matrix import parse_ab, variants
from harness.workload.scenario import load_scenario
from harness.workload.trace import convert_log, load_trace

#: A variant with more than this share of transport errors cannot be judged (exit code 3).
MAX_TRANSPORT_ERROR_RATE = 0.5
_PATH_ARGS = ("scenario", "target", "out", "baseline", "junit", "resume", "workload")


def _target_vars(items: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise UsageError(f"--target-var {item!r}: expected NAME=VALUE")
        out[name] = value
    return out


def _budget(args: argparse.Namespace, sessions: int) -> int | None:
    """--until-significant --max-sessions N: the budget per variant (None: one round)."""
    until = getattr(args, "until_significant", False)
    most = getattr(args, "max_sessions", None)
    if not until:
        if most is not None:
            raise UsageError("--max-sessions goes with --until-significant")
        return None
    if most is None:
        raise UsageError("--until-significant needs --max-sessions N (the budget per variant)")
    if most < 2 * sessions:
        raise UsageError(
            f"--max-sessions {most} leaves no second round of --sessions {sessions}: "
            "give at least twice --sessions"
        )
    if getattr(args, "workload", None):
        raise UsageError(
            "--until-significant adds scenario sessions; it does not apply to --workload"
        )
    return int(most)


def _workers(asked: int | str | None, concurrency: int) -> int:
    """--workers N, or auto (the default): see harness.pool.parent.auto_workers."""
    if asked is None or asked == "auto":
        return auto_workers(concurrency)
    return int(asked)


def build_options(args: argparse.Namespace, run_id: str) -> RunOptions:
    scenario = load_scenario(args.scenario).with_overrides(
        sessions=args.sessions, max_turns=args.turns, max_context=args.max_context
    )
    factors = parse_ab(args.ab)
    vs = tuple(variants(factors))
    target = None
    if args.endpoint:
        if factors:
            raise UsageError(
                "--ab with --endpoint needs one server per level: map the levels to servers "
                "in a --target file (see scenarios/targets/endpoints.toml)"
            )
        if args.target:
            raise UsageError("give either --endpoint or --target, not both")
    else:
        target = (
            load_target(args.target, var_overrides=_target_vars(args.target_var))
            if args.target
            else default_sim_target()
        )
        check_variants(target, vs)  # unknown factors and levels fail now, before anything starts
    sim_args: list[str] = ["--seed", str(args.seed)]
    if args.speed is not None:
        sim_args += ["--speed", str(args.speed)]
    # with --endpoint and no --model, the name is asked from the server's /v1/models
    model = args.model or (target.served_model or target.model if target else None)
    saved = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    concurrency = args.concurrency or scenario.sessions
    return RunOptions(
        scenario=scenario,
        variants=vs,
        out_dir=args.out or Path("reports") / run_id,
        sessions=scenario.sessions,
        concurrency=concurrency,
        workers=_workers(getattr(args, "workers", None), concurrency),
        target=target,
        seed=args.seed,
        repeats=args.repeats,
        order=args.order,
        stream=not args.no_stream,
        on_corruption=args.on_corruption,
        endpoint=args.endpoint,
        model=model,
        api_key=api_key_from_env(args.api_key_env),
        request_timeout=args.request_timeout,
        run_timeout=args.run_timeout,
        max_sessions=_budget(args, scenario.sessions),
        sim_args=tuple(sim_args),
        keep_transcripts=bool(getattr(args, "keep_transcripts", False)),
        confirm=bool(getattr(args, "confirm", False)),
        reference_sessions=int(getattr(args, "reference_sessions", 0) or 0),
        strict_variants=bool(getattr(args, "strict_variants", False)),
        args=saved,
        **_workload_options(args, scenario),
    )


def _workload_options(args: argparse.Namespace, scenario: Any) -> dict[str, Any]:
    """--workload, --workload-mode, --pace and --api, checked before anything starts."""

    api = getattr(args, "api", "chat")
    mode = getattr(args, "workload_mode", "replay")
    pace = getattr(args, "pace", "recorded")
    workload = getattr(args, "workload", None)
    check_api(api, scenario.dialect)
    check_options(mode, pace)
    if workload is not None:
        load_trace(workload)  # a bad line fails now, naming the file and line
        if getattr(args, "reference_sessions", 0):
            raise UsageError("--reference-sessions re-runs scenario sessions: not with --workload")
    return {"workload": workload, "workload_mode": mode, "pace": pace, "api": api}


def cmd_trace(args: argparse.Namespace) -> int:
    if args.trace_command == "compare":
        result = compare_runs(args.chat_run, args.raw_run)
        print(f"verdict: {result['verdict']}", file=sys.stderr)
        print(json.dumps(result, indent=2))
        return 0
    try:
        lines = args.log.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        raise ConfigError(f"{args.log}: log file not found") from None
    out = [json.dumps(conv, ensure_ascii=False) for conv in convert_log(lines)]
    text = "".join(line + "\n" for line in out)
    if args.output is None:
        sys.stdout.write(text)
    else:
        args.output.write_text(text, encoding="utf-8")
        print(f"{len(out)} conversations written to {args.output}", file=sys.stderr)
    return 0


async def _run_with_progress(
    opts: RunOptions, run_id: str, show: bool, skip: set[tuple[str, int, int]]
) -> list[VariantOutcome]:
    counts = Counts()
    console = Console(stderr=True)
    if not show:
        return await execute(
            opts, run_id, counts, announce=lambda m: console.print(m, highlight=False), skip=skip
        )
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn(
            "sessions · {task.fields[turns]} turns · {task.fields[bad]} corrupted turns "
            "in {task.fields[bad_sessions]} sessions · {task.fields[errors]} transport errors"
        ),
        TimeElapsedColumn(),
    )
    total = len(opts.schedule()) * (opts.max_sessions or opts.sessions) - len(skip)
    with Progress(*columns, console=console, transient=False) as bar:
        task = bar.add_task("run", total=total, turns=0, bad=0, bad_sessions=0, errors=0)

        def update() -> None:
            bar.update(
                task,
                completed=counts.sessions_done,
                turns=counts.turns,
                bad=counts.corrupted_turns,
                bad_sessions=len(counts.corrupted_sessions),
                errors=counts.transport_errors,
            )

        async def refresh() -> None:
            while True:
                update()
                await asyncio.sleep(0.5)

        ticker = asyncio.create_task(refresh())
        try:
            return await execute(
                opts,
                run_id,
                counts,
                announce=lambda m: bar.console.print(m, highlight=False),
                skip=skip,
            )
        finally:
            ticker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await ticker
            update()


def _resume_args(args: argparse.Namespace) -> tuple[argparse.Namespace, str]:
    run_dir: Path = args.resume
    meta = RunDir(run_dir).read_meta("--resume")
    saved: dict[str, Any] = dict(meta.get("args") or {})
    for key in _PATH_ARGS:
        if saved.get(key) is not None:
            saved[key] = Path(saved[key])
    saved.update(
        out=run_dir,
        resume=run_dir,
        no_progress=args.no_progress,
        fail_if=args.fail_if or saved.get("fail_if", []),
        junit=args.junit or saved.get("junit"),
        baseline=args.baseline or saved.get("baseline"),
        dry_run=args.dry_run,
        workers=args.workers or saved.get("workers"),
    )
    return argparse.Namespace(**saved), str(meta["run_id"])


def cmd_run(args: argparse.Namespace) -> int:

    skip: set[tuple[str, int, int]] = set()
    if args.resume:
        args, run_id = _resume_args(args)
    else:
        run_id = new_run_id()
    check_gate_args(args)
    opts = build_options(args, run_id)
    if args.dry_run:
        if opts.target is None:
            print(f"endpoint {opts.endpoint}: {opts.sessions} sessions, model {opts.model}")
        else:
            extra = opts.sim_args if opts.target.name == "sim" else ()
            print(format_plan(opts.target, opts.schedule(), opts.out_dir, extra_args=extra))
        print(f"workers: up to {opts.workers} per variant, {opts.concurrency} requests in flight")
        return 0
    if args.resume:
        skip = RunDir(opts.out_dir).finished_sessions()
        moved = RunDir(opts.out_dir).set_aside_unfinished(skip)
        print(
            f"resuming {opts.out_dir}: {len(skip)} sessions done, {moved} turns of "
            "unfinished sessions set aside in turns.interrupted.jsonl",
            file=sys.stderr,
        )
    else:
        RunDir(opts.out_dir).prepare()
        write_run_json(opts, run_id)
    t0 = time.perf_counter()
    show = not args.no_progress and sys.stderr.isatty()
    interrupted = infra = None
    outcomes: list[VariantOutcome] = []
    try:
        outcomes = asyncio.run(_run_with_progress(opts, run_id, show, skip))
    except KeyboardInterrupt:
        interrupted = "interrupted"
    except TimeoutError:
        infra = f"the run timeout ({args.run_timeout:.0f}s) was reached"
    except InfrastructureError as exc:
        infra = str(exc)
    turns_path = opts.out_dir / TURNS_FILE
    nothing_ran = not turns_path.exists() or turns_path.stat().st_size == 0
    if nothing_ran and (interrupted or infra):
        print(f"harness: error: {interrupted or infra}", file=sys.stderr)
        return 130 if interrupted else 3
    if interrupted or infra:
        print(
            f"harness: {interrupted or infra}; the report covers the turns done so far "
            f"(continue with: harness run --resume {opts.out_dir})",
            file=sys.stderr,
        )
    died = [o for o in outcomes if o.error]
    for o in died:
        print(f"harness: variant {o.label}: {o.error}", file=sys.stderr)
    from harness.report.build import format_table, write_report

    if nothing_ran:
        return 3
    summary = write_report(opts.out_dir)
    for warning in summary.get("server_warnings") or []:
        print(f"harness: warning: {warning}", file=sys.stderr)
    print(format_table(summary))
    print(f"run folder: {opts.out_dir}  ({time.perf_counter() - t0:.0f}s)")
    code = apply_gates(args, summary)
    if interrupted:
        return 130
    unjudged = [
        v["label"]
        for v in summary["variants"]
        if (v.get("transport_error_rate") or 0) > MAX_TRANSPORT_ERROR_RATE
    ]
    if infra or died or unjudged:
        if unjudged:
            print(
                f"harness: too many transport errors to judge: {', '.join(unjudged)}",
                file=sys.stderr,
            )
        return 3
    return code
