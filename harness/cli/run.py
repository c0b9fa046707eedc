"""``harness run``: build the options, show progress, write the report, print the table."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import shlex
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, cast

from rich.console import Console

from harness.analysis.rawcompare import compare_runs
from harness.argtypes import api_key_from_env
from harness.cli import progress as cli_progress
from harness.cli.finish import finish_run
from harness.cli.gates import check_gate_args
from harness.cli.limit_flags import limits_from
from harness.cli.run_options import run_defaults
from harness.client.fdlimit import ensure_open_files
from harness.client.raw import check_api
from harness.drive.driver import Progress
from harness.drive.trace_session import check_options
from harness.errors import (
    EXIT_INFRA,
    EXIT_OK,
    ConfigError,
    EnvironmentFailure,
    InfrastructureError,
    UsageError,
)
from harness.pool.parent import auto_workers
from harness.record.rundir import MASK, RunDir, unmasked_target_vars
from harness.run import stopsignals
from harness.run.execute import (
    VariantOutcome,
    execute,
    new_run_id,
    write_run_json,
)
from harness.run.options import (
    DEMO_FAULT_SCALE,
    AfterLoad,
    Endpoint,
    LoadSpec,
    Provenance,
    RunOptions,
    Schedule,
    SessionSource,
)
from harness.run.oracle_alarms import SpecRules
from harness.run.oracle_replay import check_sampling
from harness.run.plan import format_plan, rare_event_lines
from harness.run.shard import Shard, parse_shard, parse_start_at
from harness.run.stopsignals import StopSignals
from harness.target.launch import check_variants
from harness.target.readiness import normalize_endpoint
from harness.target.spec import TargetSpec, is_secret_name
from harness.target.targetfile import default_sim_target, load_target
from harness.workload.dialect import check_name
from harness.workload.matrix import parse_ab, variants
from harness.workload.scenario import load_scenario
from harness.workload.trace import convert_log, load_trace

_PATH_ARGS = ("scenario", "target", "out", "baseline", "junit", "resume", "workload")


def _target_vars(items: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise UsageError(f"--target-var {item!r}: expected NAME=VALUE")
        out[name] = value
    return out


def _shown_target_vars(items: list[str]) -> list[str]:
    """--target-var items as run.json keeps them: secret-looking values masked."""
    out = []
    for item in items:
        name, sep, value = item.partition("=")
        out.append(f"{name}={MASK}" if sep and value and is_secret_name(name) else item)
    return out


def _budget(args: argparse.Namespace, sessions: int) -> int | None:
    """--until-significant --max-sessions N: the budget per variant (None: one round)."""
    until = args.until_significant
    most = args.max_sessions
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
    if args.workload:
        raise UsageError(
            "--until-significant adds scenario sessions; it does not apply to --workload"
        )
    return int(most)


def _detect_lines(text: str, opts: RunOptions) -> list[str]:
    """``--detect RATE:BASELINE`` for ``--dry-run``: the false alarms of the verdict the
    headline will rest on (the text detector's measured rate with ``--judge off``, else the
    judge's confirmed tier, whose false alarms are taken as none, and the detector's line
    beside it for a server that cannot score); with ``--until-significant``, its rounds."""
    from harness.analysis.tiers import DETECTOR_FALSE_ALARMS  # pandas: for --dry-run only

    try:
        rate, baseline, *extra = (float(x) for x in text.split(":"))
        if len(extra) > 1:
            raise ValueError
    except ValueError:
        raise UsageError(
            f"--detect {text!r}: give RATE:BASELINE, e.g. 0.0003:0.0001 (or RATE:BASELINE:DEFF "
            "with the turn design effect an earlier run's report gave, e.g. 0.0003:0:1.2)"
        ) from None
    if not (0 <= rate <= 1 and 0 <= baseline <= 1) or rate == baseline:
        raise UsageError(f"--detect {text!r}: two different rates between 0 and 1")
    deff = extra[0] if extra else None
    if deff is not None and not 1.0 <= deff < 1000:
        raise UsageError(f"--detect {text!r}: a design effect is at least 1 (1: no clustering)")
    sc = opts.scenario
    per_session = max(1, min(sc.max_turns, sc.steps + 1))
    sessions, looks = opts.load.sessions, 1
    most, alpha = opts.schedule.max_sessions, opts.schedule.alpha
    if most and opts.source.workload is None:
        looks = math.ceil(most / sessions)
        sessions = looks * sessions
    detector = float(DETECTOR_FALSE_ALARMS["rate"])
    alone = opts.after.judge == "off"
    lines = rare_event_lines(
        per_session, sessions, rate, baseline, alpha=alpha,
        false_alarm=detector if alone else 0.0, looks=looks, design_effect=deff,
    )  # fmt: skip
    if alone:
        lines.append("  false alarms: the text detector's measured rate (--judge off)")
    else:
        bare = rare_event_lines(
            per_session, sessions, rate, baseline, alpha=alpha,
            false_alarm=detector, looks=looks, design_effect=deff,
        )  # fmt: skip
        lines.append(
            "  false alarms: none assumed (the judge confirms the detector's suspects); where "
            f"the server cannot score them, the text detector alone ({detector:.2%} of clean "
            "turns): " + bare[0].split(": ", 1)[1].split(" (design", 1)[0]
        )
    return lines


def _workers(asked: int | str | None, concurrency: int) -> int:
    """--workers N, or auto (the default): see harness.pool.parent.auto_workers; 0 for a
    Ray cluster (a worker per CPU it has)."""
    if asked is None or asked == "auto":
        return auto_workers(concurrency)
    if _cluster(asked) is not None:
        return 0
    return int(asked)


def _cluster(asked: int | str | None) -> str | None:
    """--workers ray[:ADDRESS]: the Ray address ("" for Ray's default), else None."""
    if isinstance(asked, str) and (asked == "ray" or asked.startswith("ray:")):
        return asked[4:]
    return None


#: ``--demo``: what it sets when the flag is not given, and the simulator's fault odds.
DEMO_AB = "index_k=fp8,bf16"
DEMO_SESSIONS = 48
DEMO_SPEED = 4.0


def _demo(args: argparse.Namespace) -> list[str]:
    """--demo: fill in the demo's flags (those not given); the simulator's extra arguments."""
    if not args.demo:
        return []
    if args.endpoint or args.target or args.workload:
        raise UsageError("--demo runs on the simulator: drop --endpoint, --target and --workload")
    if not args.ab:
        args.ab = [DEMO_AB]
    if args.sessions is None:
        args.sessions = DEMO_SESSIONS
    if args.speed is None:
        args.speed = DEMO_SPEED
    return ["--fault-scale", str(DEMO_FAULT_SCALE)]


def build_options(args: argparse.Namespace, run_id: str) -> RunOptions:
    demo_args = _demo(args)
    dialect = args.dialect
    if dialect is not None:
        dialect = check_name(dialect, "--dialect")
    scenario = load_scenario(args.scenario).with_overrides(
        sessions=args.sessions, max_turns=args.turns, max_context=args.max_context,
        dialect=dialect,
    )  # fmt: skip
    factors = parse_ab(args.ab)
    for name, levels in factors:
        if len(levels) == 1:  # it picks a server setting; a comparison needs two levels
            print(
                f"harness: note: --ab {name}={levels[0]} has one level: every variant runs "
                f"with it, and nothing is compared on {name} (to compare, give two: "
                f"--ab {name}={levels[0]},OTHER)",
                file=sys.stderr,
            )
    vs = tuple(variants(factors))
    target = None
    if args.endpoint:
        endpoint = normalize_endpoint(args.endpoint)
        if endpoint != args.endpoint:
            print(f"harness: --endpoint {args.endpoint} taken as {endpoint}", file=sys.stderr)
            args.endpoint = endpoint
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
        if args.ready_timeout is not None:
            target = replace(target, ready=target.ready.waiting(args.ready_timeout))
    sim_args: list[str] = ["--seed", str(args.seed)]
    if args.speed is not None:
        sim_args += ["--speed", str(args.speed)]
    sim_args += demo_args
    # with --endpoint and no --model, the name is asked from the server's /v1/models
    model = args.model or (target.served_model or target.model if target else None)
    saved = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    if isinstance(saved.get("argv"), list):  # the command line as typed, secrets masked
        saved["argv"] = _masked([str(a) for a in saved["argv"]])
    saved["target_var"] = _shown_target_vars(args.target_var or [])
    concurrency = args.concurrency or scenario.concurrency or scenario.sessions
    shard, start_at = _shard_options(args, target)
    # (in this order: the first usage error is the one said)
    with_passkeys = _with_passkeys(args, scenario)
    budget = _budget(args, scenario.sessions)
    after = _after_load(args, scenario)
    source = _session_source(args, scenario)
    return RunOptions(
        scenario=with_passkeys.with_overrides(
            return_meta_info="spec_accept" in after.oracles or None,
            return_token_ids="replay" in after.oracles or None,
        ),
        out_dir=args.out or Path("reports") / run_id,
        schedule=Schedule(
            variants=vs,
            repeats=args.repeats,
            order=args.order,
            max_sessions=budget,
            run_timeout=args.run_timeout,
        ),
        endpoint=Endpoint(
            url=args.endpoint,
            target=target,
            model=model,
            api_key=api_key_from_env(args.api_key_env),
            stream=not args.no_stream,
            request_timeout=args.request_timeout,
            limits=limits_from(args),
            sim_args=tuple(sim_args),
            strict_variants=args.strict_variants,
            ready_timeout=args.ready_timeout,
        ),
        load=LoadSpec(
            sessions=scenario.sessions,
            concurrency=concurrency,
            workers=_workers(args.workers, concurrency),
            cluster=_cluster(args.workers),
            judges=args.judges,
            on_corruption=args.on_corruption,
            shard=shard,
            start_at=start_at,
        ),
        source=source,
        after=after,
        provenance=Provenance(
            args=saved,
            command=shlex.join(["harness", *_masked(getattr(args, "argv", None) or sys.argv[1:])]),
            model_from_option=bool(args.model),
            dialect_from_option=dialect is not None,
        ),
    )


def _with_passkeys(args: argparse.Namespace, scenario: Any) -> Any:
    """--passkeys: the sessions plant a passkey and ask it back (not a trace's sessions)."""
    if not args.passkeys:
        return scenario
    if args.workload is not None:
        raise UsageError("--passkeys plants facts in the scenario's sessions: not with --workload")
    if not scenario.tools or scenario.workload != "tools":
        raise UsageError(
            "--passkeys asks the passkey back as a tool call: the scenario needs tools"
        )
    return replace(scenario, passkeys=True)


def _after_load(args: argparse.Namespace, scenario: Any) -> AfterLoad:
    """The after-load passes: --confirm, --reference-sessions, the judge, the canary, the
    exact oracles (replay refused on sampling that is not fixed)."""
    oracles = tuple(dict.fromkeys(args.oracle or []))
    if "replay" in oracles:
        # the scenario's sessions send a seed with every request; a trace's requests may not
        check_sampling(
            scenario.temperature,
            args.workload is None,
            "the scenario" if args.workload is None else "the trace workload",
        )
    if "spec_accept" in oracles and not args.no_stream:
        raise UsageError("--oracle spec_accept reads SGLang's meta_info, which only non-streamed "
                         "answers carry: add --no-stream")  # fmt: skip
    log_file = args.server_log
    if "kv_canary" in oracles and log_file is None and args.endpoint:
        raise UsageError("--oracle kv_canary with --endpoint: name the server's log with "
                         "--server-log FILE")  # fmt: skip
    return AfterLoad(
        confirm=args.confirm,
        reference_sessions=int(args.reference_sessions or 0),
        judge=args.judge,
        judge_sample=args.judge_sample,
        judge_concurrency=args.judge_concurrency,
        scoring_api=args.scoring_api,
        canary=args.canary,
        canary_rate=args.canary_rate,
        oracles=oracles,
        oracle_sample=args.oracle_sample,
        oracle_concurrency=args.oracle_concurrency,
        spec_rules=SpecRules(
            args.spec_accept_min_length, args.spec_accept_min_tokens, args.spec_accept_max_rate
        ),
        server_log=log_file,
        keep_transcripts=args.keep_transcripts,
    )


def _masked(argv: list[str]) -> list[str]:
    """The command line with the values of secret-named ``--target-var``s masked."""
    out = list(argv)
    for i, item in enumerate(out):
        var = item.split("=", 1)[1] if item.startswith("--target-var=") else None
        if var is None and i > 0 and out[i - 1] == "--target-var":
            var = item
        if var is not None and "=" in var and is_secret_name(var.split("=", 1)[0]):
            name = var.split("=", 1)[0]
            out[i] = (
                f"--target-var={name}=" if item.startswith("--target-var=") else f"{name}="
            ) + MASK
    return out


def _shard_options(
    args: argparse.Namespace, target: TargetSpec | None
) -> tuple[Shard | None, float | None]:
    """--shard I/K and --start-at, and what a slice of a run cannot do alone. The exact
    oracles run on a shard whose servers are its own (a target that launches them): its lone
    requests after its load meet no other shard's load, and its server's log holds its own
    sends only; ``--oracle spec_accept`` reads only the answers, and runs on any shard."""
    text = args.shard
    start = args.start_at
    if text is None:
        if start is not None:
            raise UsageError("--start-at goes with --shard (it makes the shards start together)")
        return None, None
    shard = parse_shard(text)
    alone = {
        "--until-significant": args.until_significant,
        "--confirm": args.confirm,
        "--reference-sessions": args.reference_sessions,
    }
    for flag, given in alone.items():
        if given:
            raise UsageError(
                f"{flag} needs one coordinator over the whole run, not a shard: run it on one "
                "host (--workers N spreads it over the cores)"
            )
    own = target is not None and target.mode == "launch"
    shared = [f"--oracle {o}" for o in args.oracle or [] if o != "spec_accept"]
    shared += ["--passkeys"] if args.passkeys else []
    if shared and not own:
        raise UsageError(
            f"{shared[0]} on a shard needs servers of the shard's own (a --target file that "
            "launches them): a shared server still carries the other shards' load when this "
            "one's ends; run it on one host (--workers N spreads it over the cores)"
        )
    gates = [f for f, v in (("--fail-if", args.fail_if), ("--baseline", args.baseline),
                             ("--junit", args.junit)) if v]  # fmt: skip
    if gates and not args.resume:
        raise UsageError(
            f"{', '.join(gates)}: a shard is judged with the others; give the gates to "
            "`harness merge SHARD_DIR... -o OUT`"
        )
    return shard, parse_start_at(start) if start is not None else None


def _session_source(args: argparse.Namespace, scenario: Any) -> SessionSource:
    """--workload, --workload-mode, --pace and --api, checked before anything starts."""
    api = args.api
    mode = args.workload_mode
    pace = args.pace
    workload = args.workload
    if scenario.dialect != "auto":  # "auto" is checked once the model name decides it
        check_api(api, scenario.dialect)
    check_options(mode, pace)
    if workload is not None:
        load_trace(workload)  # a bad line fails now, naming the file and line
        if args.reference_sessions:
            raise UsageError("--reference-sessions re-runs scenario sessions: not with --workload")
    return SessionSource(workload, mode, pace, api, args.seed)


def cmd_trace(args: argparse.Namespace) -> int:
    if args.trace_command == "compare":
        result = compare_runs(args.chat_run, args.raw_run)
        print(f"verdict: {result['verdict']}", file=sys.stderr)
        print(json.dumps(result, indent=2))
        return EXIT_OK
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
    return EXIT_OK


async def _run_with_progress(
    opts: RunOptions,
    run_id: str,
    show: str,
    skip: set[tuple[str, int, int]],
    stop: StopSignals,
    interval_s: float = 30.0,
    said: set[str] | None = None,
) -> list[VariantOutcome]:
    task = asyncio.current_task()
    assert task is not None
    stop.attach(task)  # SIGTERM and SIGHUP cancel this task, as Ctrl-C does
    try:
        return await _progress(opts, run_id, show, skip, interval_s, said)
    finally:
        stop.detach()


async def _progress(
    opts: RunOptions,
    run_id: str,
    show: str,
    skip: set[tuple[str, int, int]],
    interval_s: float = 30.0,
    said: set[str] | None = None,
) -> list[VariantOutcome]:
    """Run under the live display (``show`` "live", a terminal), with a progress line every
    ``interval_s`` ("lines"), or with the announcements alone ("none"); every announcement
    is kept in ``said``."""
    counts = Progress()
    console = Console(stderr=True, highlight=False)
    kept = said if said is not None else set()

    def work(announce: Any) -> Any:
        def say(line: str) -> None:
            kept.add(line)
            announce(line)

        return execute(opts, run_id, counts, announce=say, skip=skip)

    if show == "live":
        return await cli_progress.live(counts, work, console)

    def write(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    if show == "none":
        return cast("list[VariantOutcome]", await work(write))
    return await cli_progress.plain(counts, work, write, interval_s)


def _resume_args(args: argparse.Namespace) -> tuple[argparse.Namespace, str]:
    run_dir: Path = args.resume
    folder = RunDir(run_dir)
    meta = folder.read_meta("--resume")
    # (over every flag's default: an earlier version's run.json may lack later flags)
    saved: dict[str, Any] = {**run_defaults(), **dict(meta.get("args") or {})}
    for key in _PATH_ARGS:
        if saved.get(key) is not None:
            saved[key] = Path(saved[key])
    saved["target"] = folder.target_file(meta, args.target)
    saved["target_var"] = unmasked_target_vars(
        saved.get("target_var") or [], args.target_var, f"--resume {run_dir}"
    )
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
    check_gate_args(args, [v.label for v in opts.schedule.variants])  # before anything starts
    if args.dry_run:
        _print_plan(opts)
        if args.detect:
            for line in _detect_lines(args.detect, opts):
                print(line)
        return EXIT_OK
    raised = ensure_open_files(opts.load.concurrency + 8)  # EMFILE is ours, not the server's
    if raised:
        print(f"harness: {raised}", file=sys.stderr)
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
    code = _drive_and_report(args, opts, run_id, skip)
    note_end(RunDir(opts.out_dir), code)
    return code


def _print_plan(opts: RunOptions) -> None:
    """--dry-run: the plan (variants, order, commands, URLs), the workers, the load."""
    endpoint, load, schedule = opts.endpoint, opts.load, opts.schedule
    if endpoint.target is None:
        print(f"endpoint {endpoint.url}: {load.sessions} sessions, model {endpoint.model}")
    else:
        extra = endpoint.sim_args if endpoint.target.name == "sim" else ()
        most = schedule.max_sessions
        looks = math.ceil(most / load.sessions) if most else 1
        plan = format_plan(
            endpoint.target, schedule.blocks(), opts.out_dir, extra_args=extra, looks=looks
        )
        print(plan, end="")
    where = (
        f"up to {load.workers} per variant"
        if load.cluster is None
        else f"one per CPU of the Ray cluster {load.cluster or '(default address)'}"
    )
    print(f"workers: {where}, {load.concurrency} requests in flight")


def note_end(run_dir: RunDir, code: int) -> None:
    """Record in run.json how the run ended (``harness merge`` reads it of each shard)."""
    with contextlib.suppress(OSError, ValueError, UsageError):
        meta = run_dir.read_meta()
        reason = {0: None, 1: "a gate failed", 2: "configuration", 3: "infrastructure"}
        meta["finished"] = {
            "exit_code": code,
            "reason": reason.get(code, "interrupted"),
            "at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        }
        run_dir.write_meta(meta)


def _drive_and_report(
    args: argparse.Namespace, opts: RunOptions, run_id: str, skip: set[tuple[str, int, int]]
) -> int:
    t0 = time.perf_counter()
    show = "none" if args.no_progress else "live" if sys.stderr.isatty() else "lines"
    interrupted = infra = None
    outcomes: list[VariantOutcome] = []
    said: set[str] = set()
    with StopSignals() as stop:
        try:
            interval = args.progress_interval
            outcomes = asyncio.run(
                _run_with_progress(opts, run_id, show, skip, stop, interval, said)
            )
        except KeyboardInterrupt:
            interrupted = "SIGINT"
        except asyncio.CancelledError:
            if stop.received is None:
                raise
        except TimeoutError:
            infra = f"the run timeout ({args.run_timeout:.0f}s) was reached"
        except EnvironmentFailure as exc:  # the run folder cannot be written: no report either
            print(
                f"harness: error: {exc}; the rows written are whole (continue with: "
                f"harness run --resume {opts.out_dir} once it can be written)",
                file=sys.stderr,
            )
            return EXIT_INFRA
        except InfrastructureError as exc:
            infra = str(exc)
        if stop.received is not None:
            interrupted = stopsignals.name(stop.received)
        return finish_run(args, opts, run_id, outcomes, interrupted, infra, t0, said)
