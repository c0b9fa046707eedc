"""One whole run: for each variant (and repeat), bring its server up, drive the sessions, stop it.

What a run leaves behind is written as it happens: ``turns.jsonl`` per turn,
``sessions.jsonl`` per finished session (what ``--resume`` skips), ``outcomes.json`` per
finished variant, ``transcripts.jsonl`` the exact requests of corrupted sessions (of all with
``keep_transcripts``). After a variant's load, with ``confirm`` its corrupted turns are re-sent
alone (``confirm.jsonl``) and with ``reference_sessions`` some sessions run again one at a time
(``reference.jsonl``), on the same server. A server that dies mid-run stops that variant
cleanly; the run goes on with the next one and the outcome says so.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import secrets
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict
from pathlib import Path

from harness import __version__
from harness.analysis import judge, sequential
from harness.drive.driver import Progress
from harness.drive.permits import Permits
from harness.drive.session import make_plans
from harness.drive.trace_session import sessions_for
from harness.errors import HarnessError
from harness.pool.dealing import deal
from harness.record.rundir import OUTCOMES_FILE, TARGET_COPY, TURNS_FILE, RunDir
from harness.record.turns import TurnWriter
from harness.run.afterload import after_load_left, write_alarms
from harness.run.options import RunOptions
from harness.run.plan import round_orders
from harness.run.serverup import target_for
from harness.run.shard import slice_plans, wait_until
from harness.run.variant import Block, RunContext, VariantOutcome, VariantRun
from harness.target.launch import Target
from harness.workload.matrix import Variant

__all__ = ["VariantOutcome", "execute", "finish_run_json", "new_run_id", "write_run_json"]

log = logging.getLogger(__name__)


def new_run_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(2)


def write_run_json(opts: RunOptions, run_id: str) -> None:
    endpoint, load, schedule = opts.endpoint, opts.load, opts.schedule
    target = endpoint.target
    meta = {
        "run_id": run_id,
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "scenario": opts.scenario.name,
        "temperature": opts.scenario.temperature,  # greedy: variants' answers compare
        "scenario_source": opts.scenario.source,
        "target": str(target.path) if target else None,
        "target_copy": TARGET_COPY if target else None,
        "sessions": load.sessions,
        "concurrency": load.concurrency,
        "workers": load.workers,
        "seed": opts.source.seed,
        "repeats": schedule.repeats,
        "stream": endpoint.stream,
        "endpoint": endpoint.url,
        "model": endpoint.model,
        "dialect": opts.scenario.dialect,
        "dialects": {},  # per variant, once its server answers (record_dialect)
        "model_source": opts.provenance.model_source(endpoint.model),
        "variants": [{"label": v.label, "factors": v.as_dict()} for v in schedule.variants],
        "order": [{"variant": v.label, "repeat": r} for v, r in schedule.blocks()],
        "args": opts.provenance.args,
        "command": opts.provenance.command,
        "harness_version": __version__,
        "python": sys.version.split()[0],
        "plan_id": opts.plan_id(),
        "shard": load.shard.to_dict() if load.shard is not None else None,
        # the simulator's own flags (seed, speed, the demo's --fault-scale): a replay
        # launches it exactly as the run did
        "sim_args": list(endpoint.sim_args) if target and target.name == "sim" else None,
    }
    RunDir(opts.out_dir).write_meta(meta, target.path if target else None)


def finish_run_json(out_dir: Path, started: float) -> None:
    """Note in run.json when the run ended and how long its load took (also when stopped)."""
    run_dir = RunDir(out_dir)
    with contextlib.suppress(OSError, ValueError, HarnessError):
        meta = run_dir.read_meta()
        meta["finished_at"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        meta["duration_s"] = round(meta.get("duration_s", 0.0) + time.monotonic() - started, 1)
        run_dir.write_meta(meta)


@contextlib.contextmanager
def _finally(action: Callable[[], None]) -> Iterator[None]:
    try:
        yield
    finally:
        action()


async def execute(
    opts: RunOptions,
    run_id: str,
    progress: Progress,
    announce: Callable[[str], None] = lambda _msg: None,
    skip: set[tuple[str, int, int]] | None = None,
) -> list[VariantOutcome]:
    """Run every variant in the planned order. Turns are on disk as they complete."""
    plans, _ = sessions_for(
        opts.source, opts.scenario, make_plans(opts.scenario, opts.load.sessions, opts.source.seed)
    )
    outcomes: list[VariantOutcome] = []
    skip = skip or set()
    clock = None
    slices = None
    if (shard := opts.load.shard) is not None:
        # this host's slice of the plan; each variant's permits take its share (``slices``)
        slices = [len(s) for s in deal(plans, shard.count)]
        plans = slice_plans(plans, shard)
        share = Permits(opts.load.concurrency).share(slices, shard.index - 1).count
        announce(f"shard {shard.label}: {len(plans)} sessions a variant, {share} in flight")
        start_at = opts.load.start_at
        late = await wait_until(start_at, announce) if start_at is not None else None
        clock = {
            "shard": shard.to_dict(),
            "start_unix": time.time(),
            "start_at": start_at,
            "late_s": None if late is None else round(late, 3),
            "server_offset_s": None,
        }
        RunDir(opts.out_dir).clock.write_text(json.dumps(clock, indent=2) + "\n")

    def save() -> None:
        path = opts.out_dir / OUTCOMES_FILE
        path.write_text(json.dumps([asdict(o) for o in outcomes], indent=2) + "\n")

    schedule, sessions = opts.schedule, opts.load.sessions
    rounds = [plans]
    if schedule.max_sessions and opts.source.workload is None:
        # --until-significant: rounds of --sessions more sessions per variant, up to the budget
        looks = math.ceil(schedule.max_sessions / sessions)
        every = make_plans(opts.scenario, looks * sessions, opts.source.seed)
        rounds = [every[i : i + sessions] for i in range(0, len(every), sessions)]
    for variant, repeat in schedule.blocks():  # what the progress display shows to come
        todo = [p for p in rounds[0] if (variant.label, repeat, p.index) not in skip]
        progress.expect(variant.label, todo, repeat)
    held: tuple[Variant, int, Target] | None = None  # a server kept up between two rounds
    load_began = time.monotonic()
    try:
        with (
            TurnWriter(opts.out_dir / TURNS_FILE) as writer,
            _finally(lambda: finish_run_json(opts.out_dir, load_began)),
        ):
            ctx = RunContext(opts, run_id, writer, progress, announce, slices, clock)
            async with asyncio.timeout(schedule.run_timeout):
                for look, order in enumerate(round_orders(schedule.blocks(), len(rounds)), 1):
                    round_plans = rounds[look - 1]
                    for i, (variant, repeat) in enumerate(order):
                        todo = [
                            p for p in round_plans if (variant.label, repeat, p.index) not in skip
                        ]
                        if skip and not todo:  # the alarms a stop left unwritten: no server
                            for n, what in write_alarms(opts, run_id, variant.label, repeat):
                                if n:
                                    announce(f"{variant.label}: the load is done; {what}")
                        reference, lone_left = after_load_left(
                            opts, variant, repeat, round_plans, bool(skip), loaded=not todo
                        )
                        if not todo and not reference and not lone_left:
                            continue
                        if lone_left:
                            announce(f"{variant.label}: the load is done; left after it: "
                                     + ", ".join(lone_left))  # fmt: skip
                        started = held is not None and held[:2] == (variant, repeat)
                        if held is not None and not started:
                            await held[2].stop()
                        target = held[2] if held is not None and started else None
                        target = target or target_for(opts, variant, repeat)
                        held = None
                        # the last block of a round starts the next one: its server stays up
                        keep = i == len(order) - 1 and look < len(rounds)
                        block = Block(variant, repeat, todo, reference, target, started, keep)
                        outcome = await VariantRun(ctx, block).run()
                        outcomes.append(outcome)
                        save()
                        if outcome.stop_run:
                            return outcomes  # every variant would be refused the same way
                        if keep and outcome.error is None:
                            held = (variant, repeat, target)
                    if len(rounds) > 1:
                        writer.sync()
                        decided, why = sequential.decision(
                            opts.out_dir / TURNS_FILE,
                            [v.label for v in schedule.variants],
                            look=look,
                            looks=len(rounds),
                            alpha=schedule.alpha,
                        )
                        announce(f"after {look * sessions} sessions per variant: {why}")
                        if decided:
                            break
    finally:
        if held is not None:
            await held[2].stop()
        if opts.after.confirm or opts.after.judge == "auto":  # the judge's verdicts
            judge.merge_into_turns(opts.out_dir)
    return outcomes
