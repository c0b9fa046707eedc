"""``harness run``: build the options, show progress, write the report, print the table."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from harness.config import load_scenario
from harness.driver import Progress as Counts
from harness.errors import UsageError
from harness.matrix import parse_ab, variants
from harness.run import RunOptions, execute, new_run_id, prepare_run_dir, write_run_json


def build_options(args: argparse.Namespace) -> tuple[RunOptions, str]:
    scenario = load_scenario(args.scenario).with_overrides(
        sessions=args.sessions, max_turns=args.turns, max_context=args.max_context
    )
    factors = parse_ab(args.ab)
    if args.endpoint and factors:
        raise UsageError(
            "--ab with --endpoint needs one server per level: leave out --endpoint to launch "
            "the simulator per variant"
        )
    vs = tuple(variants(factors))
    run_id = new_run_id()
    out = args.out or Path("reports") / run_id
    sim_args: list[str] = ["--seed", str(args.seed)]
    if args.speed is not None:
        sim_args += ["--speed", str(args.speed)]
    from harness.cli import api_key_from_env

    opts = RunOptions(
        scenario=scenario,
        variants=vs,
        out_dir=out,
        sessions=scenario.sessions,
        concurrency=args.concurrency or scenario.sessions,
        seed=args.seed,
        stream=not args.no_stream,
        on_corruption=args.on_corruption,
        endpoint=args.endpoint,
        model=args.model,
        api_key=api_key_from_env(args.api_key_env),
        request_timeout=args.request_timeout,
        sim_args=tuple(sim_args),
        args={
            k: (str(v) if isinstance(v, Path) else v)
            for k, v in vars(args).items()
            if k not in ("api_key_env",)
        },
    )
    if not opts.endpoint:
        from harness.targets import sim_flags

        for v in vs:
            sim_flags(v)  # unknown factors fail now, before anything starts
    return opts, run_id


async def _run_with_progress(opts: RunOptions, run_id: str, show: bool) -> None:
    counts = Counts()
    console = Console(stderr=True)
    if not show:
        await execute(opts, run_id, counts, announce=lambda m: console.print(m, highlight=False))
        return
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
    with Progress(*columns, console=console, transient=False) as bar:
        task = bar.add_task(
            "run",
            total=len(opts.variants) * opts.sessions,
            turns=0,
            bad=0,
            bad_sessions=0,
            errors=0,
        )

        def announce(msg: str) -> None:
            bar.console.print(msg, highlight=False)

        async def refresh() -> None:
            while True:
                bar.update(
                    task,
                    completed=counts.sessions_done,
                    turns=counts.turns,
                    bad=counts.corrupted_turns,
                    bad_sessions=len(counts.corrupted_sessions),
                    errors=counts.transport_errors,
                )
                await asyncio.sleep(0.5)

        ticker = asyncio.create_task(refresh())
        try:
            await execute(opts, run_id, counts, announce=announce)
        finally:
            ticker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await ticker
            bar.update(
                task,
                completed=counts.sessions_done,
                turns=counts.turns,
                bad=counts.corrupted_turns,
                bad_sessions=len(counts.corrupted_sessions),
                errors=counts.transport_errors,
            )


def cmd_run(args: argparse.Namespace) -> int:
    from harness.cli import apply_gates, check_gate_args

    check_gate_args(args)
    opts, run_id = build_options(args)
    prepare_run_dir(opts.out_dir)
    write_run_json(opts, run_id)
    t0 = time.perf_counter()
    show = not args.no_progress and sys.stderr.isatty()
    interrupted = False
    try:
        asyncio.run(_run_with_progress(opts, run_id, show))
    except KeyboardInterrupt:
        interrupted = True
        print(
            "harness: interrupted; writing the report from the turns done so far", file=sys.stderr
        )
    from harness.report import format_table, write_report

    summary = write_report(opts.out_dir)
    print(format_table(summary))
    print(f"run folder: {opts.out_dir}  ({time.perf_counter() - t0:.0f}s)")
    code = apply_gates(args, summary)
    return 130 if interrupted else code
