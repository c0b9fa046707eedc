"""``--passkeys``: check every answer to a passkey ask, under load and alone.

The sessions plant the passkey and ask for it back (harness.workload.passkeys); after a
variant's load this reads each session's transcript (kept for every session with the flag),
checks each send of the turn after the ask (``oracle_passkey.jsonl``: ``right``, ``wrong`` or
``missing``, the value given, how many tokens back the passkey was planted), and re-sends
each session's first such send alone on the idle server (``oracle_passkey_alone.jsonl``):
the model's own recall failure on the same prompts, which the loaded rate is compared with.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from harness.analysis.confirm import ROW_KEY, row_key
from harness.client.chat import ChatClient
from harness.drive.session import SessionPlan
from harness.record.rundir import ORACLE_PASSKEY_ALONE_FILE, ORACLE_PASSKEY_FILE, TRANSCRIPTS_FILE
from harness.record.transcripts import Transcript, load_transcripts
from harness.record.turns import read_rows
from harness.run.replay import resend
from harness.workload import passkeys as pk


def _last_prompt(t: Transcript, turn: int) -> int | None:
    rows = [r for r in t.rows if r["turn"] == turn]
    tokens = (rows[-1].get("response") or {}).get("prompt_tokens") if rows else None
    return int(tokens) if tokens is not None else None


def _row(run_id: str, key: tuple[Any, ...], status: str, got: Any, **extra: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"run_id": run_id, **dict(zip(ROW_KEY, key, strict=True))}
    out.update(status=status, got=got if isinstance(got, str | None) else json.dumps(got))
    out.update(extra)
    return out


Key = tuple[Any, ...]


def _asks(t: Transcript, plan: SessionPlan, key: tuple[str, int, int]) -> list[tuple[Key, Any]]:
    """The answered sends of the turn that answers the session's ask: (key, transcript row)."""
    checked = pk.ask_turn(plan.steps, plan.max_turns) + 1
    return [
        ((*key, row["turn"], row["attempt"]), row)
        for row in t.rows
        if row["turn"] == checked and not (row.get("response") or {}).get("failure")
    ]


def pending(
    run_dir: Path,
    transcripts: Mapping[tuple[str, int, int], Transcript],
    key: tuple[str, int],
    plans: Iterable[SessionPlan],
) -> int:
    """Rows of ``key`` (variant, repeat) the passkeys have still to write, under load and
    alone: a resumed run's work after a stop during the lone re-sends."""
    by_index = {p.index: p for p in plans}
    done = {row_key(r) for r in read_rows(run_dir / ORACLE_PASSKEY_FILE)}
    done_alone = {row_key(r) for r in read_rows(run_dir / ORACLE_PASSKEY_ALONE_FILE)}
    left = 0
    for (v, r, session), t in transcripts.items():
        plan = by_index.get(session)
        if (v, r) != key or plan is None:
            continue
        asks = _asks(t, plan, (v, r, session))
        if not asks:
            left += (v, r, session, None, None) not in done
            continue
        left += sum(k not in done for k, _ in asks) + (asks[0][0] not in done_alone)
    return left


async def passkey_variant(
    client: ChatClient,
    run_dir: Path,
    run_id: str,
    variant: str,
    repeat: int,
    plans: Iterable[SessionPlan],
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Check the answers to the asks of (variant, repeat), then re-send one per session
    alone; append both files; return (loaded rows, alone rows)."""
    by_index = {p.index: p for p in plans}
    loaded_path, alone_path = run_dir / ORACLE_PASSKEY_FILE, run_dir / ORACLE_PASSKEY_ALONE_FILE
    done = {row_key(r) for r in read_rows(loaded_path)}
    done_alone = {row_key(r) for r in read_rows(alone_path)}
    loaded: list[dict[str, Any]] = []
    alone: list[dict[str, Any]] = []
    transcripts = load_transcripts(run_dir / TRANSCRIPTS_FILE)
    with (
        open(loaded_path, "a", encoding="utf-8") as lf,  # noqa: ASYNC230 - local files
        open(alone_path, "a", encoding="utf-8") as af,  # noqa: ASYNC230
    ):
        for (v, r, session), t in sorted(transcripts.items()):
            plan = by_index.get(session)
            if (v, r) != (variant, repeat) or plan is None:
                continue
            expected = pk.passkey_for(plan.seed_for(0))
            planted = _last_prompt(t, pk.PLANT_TURN + 1)
            asks = _asks(t, plan, (v, r, session))
            first = asks[0] if asks else None
            for key, row in asks:
                resp = row.get("response") or {}
                if key in done:
                    continue
                status, got = pk.check(resp.get("tool_calls"), expected)
                tokens = resp.get("prompt_tokens")
                far = None if tokens is None or planted is None else int(tokens) - planted
                out = _row(
                    run_id,
                    key,
                    status,
                    got,
                    expected=expected,
                    distance_tokens=far,
                    label=resp.get("label"),
                    sim_injected=resp.get("sim_injected"),
                )
                lf.write(json.dumps(out, ensure_ascii=False) + "\n")
                lf.flush()
                loaded.append(out)
            if first is None:  # the session ended before its answer to the ask
                key = (v, r, session, None, None)
                if key not in done:
                    last = max((x["turn"] for x in t.rows), default=None)
                    out = _row(run_id, key, pk.NOT_ASKED, None, expected=expected,
                               ended_at_turn=last)  # fmt: skip
                    lf.write(json.dumps(out, ensure_ascii=False) + "\n")
                    lf.flush()
                    loaded.append(out)
                continue
            if first[0] in done_alone:
                continue
            key, row = first
            got_alone = await resend(client, t, row["seq"])
            if got_alone.failed:
                status, value = "undecided", str(got_alone.out.failure)
            else:
                status, value = pk.check(got_alone.out.tool_calls, expected)
            out = _row(run_id, key, status, value, expected=expected, label=got_alone.verdict.label,
                       sim_injected=got_alone.out.sim_injected)  # fmt: skip
            af.write(json.dumps(out, ensure_ascii=False) + "\n")
            af.flush()
            alone.append(out)
    return loaded, alone
