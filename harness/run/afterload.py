"""After a variant's load: confirm corrupted turns alone, and re-run reference sessions alone.

The judge (run/judge.py; by default, ``--judge auto``, and always with ``--confirm``) scores
the flagged turns and a sample of the passed ones teacher-forced, alone (judge.jsonl): the
confirmed tier of the verdict (analysis/tiers.py).

``confirm.jsonl`` -- one row per corrupted send of the run, re-sent once on the otherwise idle
server (same body, so the same temperature and seed): ``status`` is
``confirmed_under_load`` (clean when alone: the corruption needed the load, a concurrency
bug), ``reproduces_alone`` (corrupted again: a model or prompt problem) or ``undecided`` (the
re-send failed in transport). Rows are keyed by variant/repeat/session/turn/attempt and
joined to turns.jsonl by the analysis; turns.jsonl is not rewritten for them (only the
judge's fields are merged into it once, when the run ends: run/judge.py).

``reference.jsonl`` -- turn records (the turns.jsonl shape) of K sessions re-run one at a
time after the load; ``reference_sessions.jsonl`` notes each of them that ran to its end (a
resumed run re-runs the others from their start, their partial rows dropped).
``divergence`` compares each loaded session with its lone run turn by turn: while both sent
the same request, a turn where both gave well-formed tool calls that differ (name or
arguments) is a divergence -- "fluent but wrong" output no text classifier flags.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.analysis.confirm import (
    CONFIRMED_UNDER_LOAD,
    REPRODUCES_ALONE,
    ROW_KEY,
    UNDECIDED,
    row_key,
)
from harness.client.chat import ChatClient
from harness.drive.session import Session, SessionPlan, Shared, make_plans
from harness.record.rundir import (
    CONFIRM_FILE,
    REFERENCE_ENDS_FILE,
    REFERENCE_FILE,
    TRANSCRIPTS_FILE,
    TURNS_FILE,
)
from harness.record.transcripts import load_transcripts
from harness.record.turns import TurnWriter, read_rows
from harness.run.judge import judge_variant
from harness.run.judge import pending as judge_pending
from harness.run.options import RunOptions
from harness.run.oracle_alarms import canary_rows, kept_lines, spec_rows
from harness.run.oracle_passkeys import passkey_variant
from harness.run.oracle_passkeys import pending as passkeys_pending
from harness.run.oracle_replay import Access, Sample, replay_oracle_variant
from harness.run.oracle_replay import pending as replay_pending
from harness.run.replay import resend
from harness.target.launch import make_target
from harness.target.spec import substitute
from harness.workload.matrix import Variant
from harness.workload.scenario import Scenario

log = logging.getLogger(__name__)


def unconfirmed(run_dir: Path, variant: str, repeat: int) -> int:
    """Corrupted sends of (variant, repeat) not yet re-sent alone (a resumed run's work)."""
    done = {row_key(r) for r in read_rows(run_dir / CONFIRM_FILE)}
    left = 0
    for (v, r, session), t in load_transcripts(run_dir / TRANSCRIPTS_FILE).items():
        if (v, r) == (variant, repeat):
            for row in t.rows:
                key = (v, r, session, row["turn"], row["attempt"])
                left += bool((row.get("response") or {}).get("corrupted")) and key not in done
    return left


def flagged(run_dir: Path, variant: str, repeat: int) -> bool:
    """Whether (variant, repeat) has a turn the verdict flagged (its transcript is kept)."""
    for (v, r, _session), t in load_transcripts(run_dir / TRANSCRIPTS_FILE).items():
        if (v, r) == (variant, repeat) and any(
            (row.get("response") or {}).get("corrupted") for row in t.rows
        ):
            return True
    return False


def _of(rows: Iterable[Mapping[str, Any]], variant: str, repeat: int) -> set[int]:
    return {
        int(r["session"])
        for r in rows
        if r.get("variant") == variant and int(r.get("repeat", 0)) == repeat
    }


def referenced(run_dir: Path, variant: str, repeat: int) -> set[int]:
    """Sessions of (variant, repeat) already re-run alone to their end. (A run folder from
    before reference_sessions.jsonl was kept: any session with rows.)"""
    ends = run_dir / REFERENCE_ENDS_FILE
    if ends.exists():
        return _of(read_rows(ends), variant, repeat)
    return _of(read_rows(run_dir / REFERENCE_FILE), variant, repeat)


def _seed_ends(run_dir: Path, variant: str, repeat: int, running: set[int]) -> None:
    """A run folder from before reference_sessions.jsonl was kept: its sessions with rows
    count as run to their end, as they did then (but those about to run again)."""
    seen = {
        (str(r.get("variant")), int(r.get("repeat", 0)), int(r["session"]))
        for r in read_rows(run_dir / REFERENCE_FILE)
    }
    rows = [
        {"variant": v, "repeat": r, "session": s, "ended": None}
        for v, r, s in sorted(seen)
        if (v, r) != (variant, repeat) or s not in running
    ]
    text = "".join(json.dumps(row) + "\n" for row in rows)
    (run_dir / REFERENCE_ENDS_FILE).write_text(text, encoding="utf-8")


def _drop_reference_rows(run_dir: Path, variant: str, repeat: int, sessions: set[int]) -> None:
    """Remove the rows of these sessions (cut short by an earlier stop) from reference.jsonl,
    so that their new lone run is the only one; the file is replaced whole, atomically."""
    path = run_dir / REFERENCE_FILE
    if not sessions or not path.exists():
        return
    keep = []
    dropped = 0
    for line in path.read_bytes().splitlines(keepends=True):
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            keep.append(line)  # the readers skip it, as they did
            continue
        if _of([row], variant, repeat) & sessions:
            dropped += 1
        else:
            keep.append(line)
    if dropped:
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_bytes(b"".join(keep))
        os.replace(tmp, path)
        log.info("%d rows of reference sessions cut short dropped: they run again", dropped)


async def confirm_variant(
    client: ChatClient, run_dir: Path, run_id: str, variant: str, repeat: int
) -> list[dict[str, Any]]:
    """Re-send every corrupted send of (variant, repeat) once, alone; append confirm.jsonl."""
    done = {row_key(r) for r in read_rows(run_dir / CONFIRM_FILE)}
    transcripts = load_transcripts(run_dir / TRANSCRIPTS_FILE)
    rows: list[dict[str, Any]] = []
    with open(run_dir / CONFIRM_FILE, "a", encoding="utf-8") as fh:  # noqa: ASYNC230 - local
        for (v, r, session), t in sorted(transcripts.items()):
            if (v, r) != (variant, repeat):
                continue
            for row in t.rows:
                recorded = row.get("response") or {}
                key = (v, r, session, row["turn"], row["attempt"])
                if not recorded.get("corrupted") or key in done:
                    continue
                got = await resend(client, t, row["seq"])
                status = (
                    UNDECIDED
                    if got.failed
                    else REPRODUCES_ALONE
                    if got.verdict.corrupted
                    else CONFIRMED_UNDER_LOAD
                )
                out = {"run_id": run_id, **dict(zip(ROW_KEY, key, strict=True))}
                out.update(status=status, recorded_label=recorded.get("label"), **got.row(recorded))
                out["content"] = (got.out.content or "")[:4000]  # what it said alone
                fh.write(json.dumps(out, ensure_ascii=False) + "\n")
                fh.flush()
                rows.append(out)
    return rows


async def confirm_on_lone_server(
    opts: RunOptions, done: Loaded, client: ChatClient, announce: Callable[[str], None]
) -> list[dict[str, Any]]:
    """``confirm_variant`` on a fresh server of the variant that takes requests one at a
    time (the target's ``[alone] args`` added to its command): what a damaged cache did to the
    loaded server cannot reach the lone answers, and a server that corrupts only under
    concurrency gives them clean."""
    spec = opts.endpoint.launched
    assert spec is not None
    assert spec.alone_args is not None
    variant, repeat, run_id = done.variant, done.repeat, done.run_id
    values = {**spec.vars, "model": spec.model}
    extra = [substitute(a, values) for a in spec.alone_args]
    sim = list(opts.endpoint.sim_args) if spec.name == "sim" else []
    target = make_target(
        spec, variant, opts.out_dir, extra_args=[*sim, *extra], repeat=repeat,
        api_key=opts.endpoint.api_key,
    )  # fmt: skip
    announce(f"{variant.label}: a fresh server for the flagged turns alone ({' '.join(extra)})")
    base_url = await target.start()
    try:
        lone = ChatClient(
            base_url,
            model=client.model,
            api_key=opts.endpoint.api_key,
            max_connections=2,
            request_timeout=client.request_timeout,
            limits=client.limits,
        )
        try:
            return await confirm_variant(lone, opts.out_dir, run_id, variant.label, repeat)
        finally:
            await lone.aclose()
    finally:
        await target.stop()


async def reference_variant(
    client: ChatClient,
    scenario: Scenario,
    plans: Iterable[SessionPlan],
    base: dict[str, Any],
    run_dir: Path,
    *,
    stream: bool,
    on_corruption: str,
) -> int:
    """Run ``plans`` again one session at a time into reference.jsonl, each one's end noted
    in reference_sessions.jsonl; return the count."""
    plans = list(plans)
    variant, repeat = str(base.get("variant")), int(base.get("repeat", 0))
    running = {p.index for p in plans}
    ends_path = run_dir / REFERENCE_ENDS_FILE
    if not ends_path.exists():
        _seed_ends(run_dir, variant, repeat, running)
    _drop_reference_rows(run_dir, variant, repeat, running)
    n = 0
    with (
        TurnWriter(run_dir / REFERENCE_FILE) as writer,
        open(ends_path, "a", encoding="utf-8") as ends,  # noqa: ASYNC230 - a local file
    ):
        shared = Shared(
            client=client,
            scenario=scenario,
            writer=writer,
            base=base,
            stream=stream,
            on_corruption=on_corruption,
            limit=asyncio.Semaphore(1),
            transcripts=None,
        )
        for plan in plans:
            session = Session(plan, shared)
            await session.run()
            end = {"variant": variant, "repeat": repeat, "session": plan.index}
            ends.write(json.dumps({**end, "ended": session.ended}) + "\n")
            ends.flush()
            n += 1
    return n


@dataclass(frozen=True)
class Loaded:
    """One variant's load, done: what the passes after it take."""

    run_id: str
    variant: Variant
    repeat: int
    base: dict[str, Any]  # the fields every record of the variant carries
    reference: list[SessionPlan]  # the sessions to re-run alone (--reference-sessions)


async def after_load(
    opts: RunOptions, done: Loaded, client: ChatClient, announce: Callable[[str], None]
) -> None:
    """--confirm, the judge, --oracle replay and --reference-sessions: lone requests on the
    same server, now idle (a target's [alone] server for the flagged turns re-sent alone). The
    judge runs by default (``--judge auto``) once the variant has a flagged turn (not on a
    shard: its reference is the whole variant's)."""
    after, out_dir, run_id, repeat = opts.after, opts.out_dir, done.run_id, done.repeat
    label = done.variant.label
    name = label + (f" (repeat {repeat + 1})" if opts.schedule.repeats > 1 else "")
    target = opts.endpoint.launched
    lone_server = target.alone_args if target is not None else None
    if opts.load.shard is not None:
        lone_server = None  # (a shard's flagged turns are re-sent by --confirm only)
    for _, what in write_alarms(opts, run_id, label, repeat):  # first: they need no request
        announce(f"{name}: {what}")
    if after.confirm or (lone_server is not None and flagged(out_dir, label, repeat)):
        if lone_server is not None:
            rows = await confirm_on_lone_server(opts, done, client, announce)
        else:
            rows = await confirm_variant(client, out_dir, run_id, label, repeat)
        alone = sum(1 for r in rows if r["status"] == REPRODUCES_ALONE)
        announce(f"{name}: {len(rows)} corrupted turns re-sent alone, {alone} corrupted again")
    auto = after.judge == "auto" and opts.load.shard is None
    if after.confirm or (auto and flagged(out_dir, label, repeat)):
        await judge_variant(opts, client.base_url, client.model, run_id, label, repeat, announce)
    if "replay" in after.oracles:
        target = opts.endpoint.target
        rows = await replay_oracle_variant(
            client, out_dir, run_id, (label, repeat), Sample(after.oracle_sample, opts.source.seed),
            declared=bool(target is not None and target.deterministic),
            access=Access(opts.endpoint.api_key,
                          after.scoring_api if opts.source.api == "chat" else "off"),
            lanes=after.oracle_concurrency,
        )  # fmt: skip
        diverged = sum(1 for r in rows if r["status"] == "diverged")
        announce(f"{name}: {len(rows)} sends replayed alone, {diverged} diverged")
    if opts.scenario.passkeys:
        plans = passkey_plans(opts)
        loaded, lone = await passkey_variant(client, out_dir, run_id, label, repeat, plans)
        wrong = sum(1 for r in loaded if r["status"] != "right")
        lone_wrong = sum(1 for r in lone if r["status"] in ("wrong", "missing"))
        announce(f"{name}: passkeys: {wrong} of {len(loaded)} wrong or missing under load, "
                 f"{lone_wrong} of {len(lone)} alone")  # fmt: skip
    if done.reference:
        announce(f"{name}: {len(done.reference)} reference sessions, one at a time")
        await reference_variant(
            client,
            opts.scenario,
            done.reference,
            done.base,
            out_dir,
            stream=opts.endpoint.stream,
            on_corruption=opts.load.on_corruption,
        )


def write_alarms(opts: RunOptions, run_id: str, variant: str, repeat: int) -> list[tuple[int, str]]:
    """The server's own alarms of (variant, repeat) not yet written (--oracle spec_accept:
    the sends' counters; --oracle kv_canary: the canary lines kept as the load read them):
    they need no request, so a resumed run writes what a stop left, with no server. Per
    oracle on: (rows written, what to say)."""
    after, out_dir, said = opts.after, opts.out_dir, []
    if "spec_accept" in after.oracles:
        rows = spec_rows(out_dir, run_id, variant, repeat, after.spec_rules)
        alarms = sum(1 for r in rows if r["alarm"])
        said.append((len(rows), f"speculative acceptance: {alarms} alarms in {len(rows)} sends"))
    if "kv_canary" in after.oracles:
        lines = kept_lines(out_dir, variant, repeat)
        turns = read_rows(out_dir / TURNS_FILE)
        rows = canary_rows(lines, turns, run_id, variant, repeat, out_dir)
        tied = sum(1 for r in rows if r["alarm"] == "kv_canary")
        new = sum(1 for r in rows if r["alarm"] == "kv_canary_line")
        said.append((len(rows), f"kv canary: {new} violation lines, {tied} sends in flight"))
    return said


def after_load_left(
    opts: RunOptions,
    variant: Variant,
    repeat: int,
    plans: list[SessionPlan],
    resuming: bool,
    loaded: bool = False,
) -> tuple[list[SessionPlan], list[str]]:
    """The reference sessions of this round still to run alone (the first K of its plans,
    less those a resumed run already re-ran), and, for a resumed run whose load is done
    (``loaded``), the names of its other lone passes left unfinished: what an interrupted
    after-load left to do (``lone_work_left``)."""
    reference = plans[: opts.after.reference_sessions]
    if reference and resuming:
        done = referenced(opts.out_dir, variant.label, repeat)
        reference = [p for p in reference if p.index not in done]
    left = lone_work_left(opts, variant.label, repeat) if resuming and loaded else []
    return reference, left


def lone_work_left(opts: RunOptions, variant: str, repeat: int) -> list[str]:
    """The passes after the load of (variant, repeat) that a stop cut short, by name: the
    corrupted sends not yet re-sent alone (--confirm, a target's [alone] server), the turns
    not yet judged (where the server can score: run.judge), the sends not yet replayed
    (--oracle replay), the passkey answers not yet checked or re-sent alone (--passkeys).
    Each pass skips what its file holds, so a resumed run does only these. (The server's own
    alarms need no server: ``write_alarms``.)"""
    after, out_dir, key = opts.after, opts.out_dir, (variant, repeat)
    target, shard = opts.endpoint.launched, opts.load.shard
    lone_server = target is not None and target.alone_args is not None and shard is None
    wanted = {
        "confirm": after.confirm or lone_server,
        "judge": (after.confirm or (after.judge == "auto" and shard is None))
        and opts.source.api == "chat",  # (the judge scores chat turns only)
        "replay": "replay" in after.oracles,
        "passkeys": opts.scenario.passkeys,
    }
    if not any(wanted.values()):
        return []
    transcripts = load_transcripts(out_dir / TRANSCRIPTS_FILE)
    corrupted = any(
        (row.get("response") or {}).get("corrupted")
        for (v, r, _s), t in transcripts.items() if (v, r) == key
        for row in t.rows
    )  # fmt: skip
    sample = Sample(after.oracle_sample, opts.source.seed)
    checks: dict[str, Callable[[], int | bool]] = {
        "confirm": lambda: corrupted and unconfirmed(out_dir, variant, repeat),
        "judge": lambda: (
            (after.confirm or corrupted) and judge_pending(opts, transcripts, variant, repeat)
        ),
        "replay": lambda: replay_pending(out_dir, transcripts, key, sample),
        "passkeys": lambda: passkeys_pending(out_dir, transcripts, key, passkey_plans(opts)),
    }
    return [name for name, on in wanted.items() if on and checks[name]()]


def passkey_plans(opts: RunOptions) -> list[SessionPlan]:
    """Every plan a session of the run may have (--passkeys reads each one's passkey)."""
    most = max(opts.load.sessions, opts.schedule.max_sessions or 0)
    return make_plans(opts.scenario, most, opts.source.seed)
