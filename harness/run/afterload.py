"""After a variant's load: confirm corrupted turns alone, and re-run reference sessions alone.

``confirm.jsonl`` -- one row per corrupted send of the run, re-sent once on the otherwise idle
server (same body, so the same temperature and seed): ``status`` is
``confirmed_under_load`` (clean when alone: the corruption needed the load, a concurrency
bug), ``reproduces_alone`` (corrupted again: a model or prompt problem) or ``undecided`` (the
re-send failed in transport). Rows are keyed by variant/repeat/session/turn/attempt and
joined to turns.jsonl by the analysis; turns.jsonl itself is never rewritten.

``reference.jsonl`` -- turn records (the turns.jsonl shape) of K sessions re-run one at a
time after the load; ``reference_sessions.jsonl`` notes each of them that ran to its end (a
resumed run re-runs the others from their start, their partial rows dropped).
``divergence`` compares each loaded session with its lone run turn by turn: while both sent
the same request, a turn where both gave well-formed tool calls that differ (name or
arguments) is a divergence -- "fluent but wrong" output no text classifier flags.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness import labels as L
from harness.analysis import stats
from harness.record.transcripts import TRANSCRIPTS_FILE, load_transcripts
from harness.record.turns import TURNS_FILE, TurnWriter, iter_turns

if TYPE_CHECKING:  # the report reads this module's analysis half without the HTTP stack
    from collections.abc import Callable

    from harness.client.chat import ChatClient
    from harness.drive.session import SessionPlan
    from harness.run.execute import RunOptions
    from harness.workload.matrix import Variant
    from harness.workload.scenario import Scenario

log = logging.getLogger(__name__)

CONFIRM_FILE = "confirm.jsonl"
REFERENCE_FILE = "reference.jsonl"
REFERENCE_ENDS_FILE = "reference_sessions.jsonl"
CONFIRMED_UNDER_LOAD = "confirmed_under_load"
REPRODUCES_ALONE = "reproduces_alone"
UNDECIDED = "undecided"
_KEY = ("variant", "repeat", "session", "turn", "attempt")


def _key(row: Mapping[str, Any]) -> tuple[Any, ...]:
    return tuple(row.get(k) for k in _KEY)


def _read(path: Path) -> list[dict[str, Any]]:
    return list(iter_turns(path)) if path.exists() else []  # type: ignore[arg-type]


def unconfirmed(run_dir: Path, variant: str, repeat: int) -> int:
    """Corrupted sends of (variant, repeat) not yet re-sent alone (a resumed run's work)."""
    done = {_key(r) for r in _read(run_dir / CONFIRM_FILE)}
    left = 0
    for (v, r, session), t in load_transcripts(run_dir / TRANSCRIPTS_FILE).items():
        if (v, r) == (variant, repeat):
            for row in t.rows:
                key = (v, r, session, row["turn"], row["attempt"])
                left += bool((row.get("response") or {}).get("corrupted")) and key not in done
    return left


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
        return _of(_read(ends), variant, repeat)
    return _of(_read(run_dir / REFERENCE_FILE), variant, repeat)


def _seed_ends(run_dir: Path, variant: str, repeat: int, running: set[int]) -> None:
    """A run folder from before reference_sessions.jsonl was kept: its sessions with rows
    count as run to their end, as they did then (but those about to run again)."""
    seen = {
        (str(r.get("variant")), int(r.get("repeat", 0)), int(r["session"]))
        for r in _read(run_dir / REFERENCE_FILE)
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
    from harness.run.replay import resend

    done = {_key(r) for r in _read(run_dir / CONFIRM_FILE)}
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
                out = {"run_id": run_id, **dict(zip(_KEY, key, strict=True))}
                out.update(status=status, recorded_label=recorded.get("label"), **got.row())
                fh.write(json.dumps(out, ensure_ascii=False) + "\n")
                fh.flush()
                rows.append(out)
    return rows


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
    from harness.drive.session import Session, Shared

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


async def after_load(
    opts: RunOptions,
    run_id: str,
    variant: Variant,
    repeat: int,
    chosen: list[SessionPlan],
    client: ChatClient,
    base: dict[str, Any],
    announce: Callable[[str], None],
) -> None:
    """--confirm and --reference-sessions (``chosen``): lone re-sends on the same server,
    now idle."""
    name = variant.label + (f" (repeat {repeat + 1})" if opts.repeats > 1 else "")
    if opts.confirm:
        rows = await confirm_variant(client, opts.out_dir, run_id, variant.label, repeat)
        alone = sum(1 for r in rows if r["status"] == REPRODUCES_ALONE)
        announce(f"{name}: {len(rows)} corrupted turns re-sent alone, {alone} corrupted again")
    if chosen:
        announce(f"{name}: {len(chosen)} reference sessions, one at a time")
        await reference_variant(
            client,
            opts.scenario,
            chosen,
            base,
            opts.out_dir,
            stream=opts.stream,
            on_corruption=opts.on_corruption,
        )


def after_load_left(
    opts: RunOptions, variant: Variant, repeat: int, plans: list[SessionPlan], resuming: bool
) -> tuple[list[SessionPlan], bool]:
    """The reference sessions of this round still to run alone (the first K of its plans,
    less those a resumed run already re-ran), and whether corrupted sends of a resumed run
    still wait to be confirmed: what an interrupted after-load left to do."""
    reference = plans[: opts.reference_sessions]
    if reference and resuming:
        done = referenced(opts.out_dir, variant.label, repeat)
        reference = [p for p in reference if p.index not in done]
    confirm_left = resuming and opts.confirm
    confirm_left = confirm_left and unconfirmed(opts.out_dir, variant.label, repeat) > 0
    return reference, confirm_left


# ---- analysis ------------------------------------------------------------------------------


def confirm_summary(rows: list[dict[str, Any]], classified_turns: int) -> dict[str, Any]:
    """The corruption rate split by what the lone re-send said."""
    counts = {s: sum(1 for r in rows if r.get("status") == s) for s in
              (CONFIRMED_UNDER_LOAD, REPRODUCES_ALONE, UNDECIDED)}  # fmt: skip
    out: dict[str, Any] = {"confirmed": len(rows), **counts}
    for status, name in ((CONFIRMED_UNDER_LOAD, "under_load"), (REPRODUCES_ALONE, "alone")):
        k = counts[status]
        lo, hi = stats.wilson(k, classified_turns) if classified_turns >= k else (0.0, 1.0)
        out[f"turn_rate_{name}"] = k / classified_turns if classified_turns else None
        out[f"turn_rate_{name}_ci"] = [lo, hi]
    return out


def _calls(row: Mapping[str, Any]) -> list[tuple[str, str]]:
    out = []
    for c in row.get("tool_calls") or []:
        args = c.get("arguments")
        if isinstance(args, str):
            with contextlib.suppress(json.JSONDecodeError):
                args = json.loads(args)
        out.append((str(c.get("name")), json.dumps(args, sort_keys=True)))
    return out


def _accepted(rows: Iterable[Mapping[str, Any]]) -> dict[int, Mapping[str, Any]]:
    """turn -> the last send of that turn (the one the session went on with)."""
    out: dict[int, Mapping[str, Any]] = {}
    for r in sorted(rows, key=lambda r: (r["turn"], r["attempt"])):
        out[int(r["turn"])] = r
    return out


def compare_session(
    loaded: Iterable[Mapping[str, Any]], lone: Iterable[Mapping[str, Any]]
) -> tuple[int, list[dict[str, Any]]]:
    """(turns compared, divergences) of one session run loaded and alone.

    Turns are walked in order while both runs sent the same request (every earlier turn gave
    the same output, and the prompt sizes agree); the walk stops at the first difference.
    """
    a, b = _accepted(loaded), _accepted(lone)
    compared, found = 0, []
    for turn in sorted(set(a) & set(b)):
        x, y = a[turn], b[turn]
        px, py = x.get("prompt_tokens"), y.get("prompt_tokens")
        if px is not None and py is not None and px != py:
            break
        both_ok = x.get("label") == y.get("label") == L.OK_TOOL_CALL
        if both_ok:
            compared += 1
            if _calls(x) != _calls(y):
                found.append({"turn": turn, "loaded": x.get("tool_calls"),
                              "alone": y.get("tool_calls")})  # fmt: skip
                break
        elif (x.get("label"), x.get("content"), _calls(x)) != (
            y.get("label"),
            y.get("content"),
            _calls(y),
        ):
            break
    return compared, found


def divergence_summary(
    turns: list[dict[str, Any]], reference: list[dict[str, Any]], variant: str
) -> dict[str, Any] | None:
    ref = [r for r in reference if r.get("variant") == variant]
    if not ref:
        return None

    def by_session(rows: list[dict[str, Any]]) -> dict[tuple[int, int], list[dict[str, Any]]]:
        out: dict[tuple[int, int], list[dict[str, Any]]] = {}
        for r in rows:
            if r.get("variant") == variant:
                out.setdefault((int(r.get("repeat", 0)), int(r["session"])), []).append(r)
        return out

    loaded, lone = by_session(turns), by_session(ref)
    compared = diverged = 0
    examples: list[dict[str, Any]] = []
    for key in sorted(set(loaded) & set(lone)):
        n, found = compare_session(loaded[key], lone[key])
        compared += n
        diverged += len(found)
        examples += [{"repeat": key[0], "session": key[1], **f} for f in found]
    lo, hi = stats.wilson(diverged, compared)
    return {
        "reference_sessions": len(lone),
        "compared_turns": compared,
        "diverged_turns": diverged,
        "divergence_rate": diverged / compared if compared else None,
        "divergence_ci": [lo, hi],
        "examples": examples[:3],
    }


def attach(summary: dict[str, Any], run_dir: Path) -> None:
    """Add ``confirm`` and ``divergence`` to each variant of ``summary`` when recorded."""
    confirm = _read(run_dir / CONFIRM_FILE)
    reference = _read(run_dir / REFERENCE_FILE)
    turns = _read(run_dir / TURNS_FILE) if reference else []
    for v in summary.get("variants", []):
        rows = [r for r in confirm if r.get("variant") == v["label"]]
        if rows:
            v["confirm"] = confirm_summary(rows, int(v.get("classified_turns") or 0))
        div = divergence_summary(turns, reference, v["label"]) if reference else None
        if div is not None:
            v["divergence"] = div


def markdown(summary: Mapping[str, Any]) -> list[str]:
    """Report sections for the confirmation split and the divergence (empty if neither)."""
    from harness.analysis.summary import fmt_pct

    out: list[str] = []
    conf = [v for v in summary.get("variants", []) if v.get("confirm")]
    if conf:
        out += ["", "## Corrupted turns re-sent alone", "",
                "Each corrupted turn was re-sent once on the idle server. Clean alone: the "
                "corruption needed the load (a concurrency bug). Corrupted again: a model or "
                "prompt problem.", "",
                "| variant | corrupted turns | clean alone (under load only) | rate | "
                "corrupted alone | rate | undecided |",
                "|---|---|---|---|---|---|---|"]  # fmt: skip
        for v in conf:
            c = v["confirm"]
            out.append(f"| {v['label']} | {c['confirmed']} | {c[CONFIRMED_UNDER_LOAD]} | "
                       f"{fmt_pct(c['turn_rate_under_load'])} | {c[REPRODUCES_ALONE]} | "
                       f"{fmt_pct(c['turn_rate_alone'])} | {c[UNDECIDED]} |")  # fmt: skip
    div = [v for v in summary.get("variants", []) if v.get("divergence")]
    if div:
        out += ["", "## Divergence under load", "",
                "Sessions re-run alone after the load; a turn diverges when both runs sent the "
                "same request and got well-formed tool calls that differ.", "",
                "| variant | reference sessions | turns compared | diverged | rate [95% CI] |",
                "|---|---|---|---|---|"]  # fmt: skip
        for v in div:
            d = v["divergence"]
            lo, hi = d["divergence_ci"]
            out.append(f"| {v['label']} | {d['reference_sessions']} | {d['compared_turns']} | "
                       f"{d['diverged_turns']} | {fmt_pct(d['divergence_rate'])} "
                       f"[{fmt_pct(lo)}, {fmt_pct(hi)}] |")  # fmt: skip
    return out
