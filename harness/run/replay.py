"""``harness replay``: re-send one recorded request, alone and under load, and count corruption.

The request is rebuilt byte-for-byte from the run's transcripts (``transcripts.jsonl``) and
sent ``count`` times one after the other on an otherwise idle server, then ``count`` times
while ``load`` other sessions of the run's scenario keep the server busy. Each output is
judged by the same classifier as in the run, with the same context. The result is printed
as a table and written to ``replays/<...>.json`` in the run folder.

The server is the one given with ``--endpoint``, else the variant's server relaunched from
the target file the user names (``--target``) or the copy of the run's target file kept in
the run folder (``target.toml``; never a path read from ``run.json``), else the endpoint the
run used.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.analysis import stats
from harness.client import DEFAULT_REQUEST_TIMEOUT, connections_for
from harness.client.chat import ChatClient
from harness.client.output import TurnOutput
from harness.client.response_limits import Limits
from harness.drive.session import Session, SessionPlan, Shared, make_plans
from harness.errors import UsageError
from harness.record.rundir import TRANSCRIPTS_FILE, RunDir, unmasked_target_vars
from harness.record.transcripts import Transcript, load_transcripts
from harness.record.turns import TurnWriter
from harness.run.options import DEMO_FAULT_SCALE
from harness.target.launch import Target, make_target, safe_label
from harness.target.readiness import EndpointTarget
from harness.target.targetfile import load_target
from harness.verdict import Verdict, classify_turn
from harness.workload.matrix import Variant
from harness.workload.scenario import load_scenario

log = logging.getLogger(__name__)

REPLAYS_DIR = "replays"


@dataclass(frozen=True)
class Resent:
    out: TurnOutput
    verdict: Verdict
    inflight: int  # requests in flight from this process when it was sent (itself included)

    @property
    def failed(self) -> bool:
        return self.out.failure is not None

    def row(self, recorded: dict[str, Any] | None = None) -> dict[str, Any]:
        out = self.out
        row: dict[str, Any] = {
            "label": self.verdict.label,
            "corrupted": self.verdict.corrupted,
            "inflight": self.inflight,
            "transport_error": str(out.failure) if out.failure else None,
            "sim_injected": out.sim_injected,
            "prompt_tokens": out.prompt_tokens,
            "latency_s": out.latency_s,
            "tool_calls": self.verdict.tool_calls,
        }
        if recorded is not None:
            row["same_as_recorded"] = same_output(out, recorded)
        return row


def same_output(out: TurnOutput, recorded: dict[str, Any]) -> bool:
    """True when the output is identical to a transcript's recorded response."""
    return (
        out.content == recorded.get("content")
        and out.reasoning == recorded.get("reasoning")
        and out.tool_calls == recorded.get("tool_calls")
    )


async def resend(
    client: ChatClient, t: Transcript, seq: int, *, stream: bool | None = None, inflight: int = 1
) -> Resent:
    """Send request ``seq`` of transcript ``t`` again and judge the output as the run did."""
    body = t.body(seq)
    s = bool(t.header["stream"]) if stream is None else stream
    out = await client.chat(body, stream=s)
    if out.failure is not None:
        verdict = Verdict("transport_error", False, evidence={"failure": str(out.failure)})
    else:
        verdict = classify_turn(
            out.content,
            reasoning=out.reasoning,
            tool_calls=out.tool_calls,
            tools=body.get("tools") or None,
            finish_reason=out.finish_reason,
            dialect=str(t.header.get("dialect", "auto")),
            source="server",
            context=t.context(seq),
        )
    return Resent(out, verdict, inflight)


# ---- locating the request ------------------------------------------------------------------


def pick_transcript(
    run_dir: Path, session: int, variant: str | None, repeat: int | None
) -> Transcript:
    """The transcript of one session; variant and repeat may be left out when unambiguous."""
    path = run_dir / TRANSCRIPTS_FILE
    found = [
        t
        for t in load_transcripts(path).values()
        if t.key[2] == session
        and (variant is None or t.key[0] == variant)
        and (repeat is None or t.key[1] == repeat)
    ]
    if not found:
        raise UsageError(
            f"{run_dir}: no transcript of session {session}"
            + (f" in variant {variant!r}" if variant else "")
            + (f" repeat {repeat}" if repeat is not None else "")
            + " (transcripts are kept for corrupted sessions, or all with --keep-transcripts)"
        )
    if len(found) > 1:
        which = ", ".join(f"--variant {t.key[0]!r} --repeat {t.key[1]}" for t in found)
        raise UsageError(f"session {session} was recorded more than once; choose one: {which}")
    return found[0]


def pick_row(t: Transcript, turn: int | None, attempt: int | None) -> int:
    """The ``seq`` to replay: the given turn (and attempt), else the first corrupted send."""
    if turn is None:
        row = t.first_corrupted()
        if row is None:
            raise UsageError(f"session {t.key[2]} has no corrupted turn; choose one with --turn")
    elif attempt is None:
        rows = [r for r in t.rows if r["turn"] == turn]
        bad = [r for r in rows if (r.get("response") or {}).get("corrupted")]
        row = (bad or rows or [t.find(turn)])[0]
    else:
        row = t.find(turn, attempt)
    return int(row["seq"])


def sim_args_of(meta: dict[str, Any]) -> list[str]:
    """The simulator's flags as the run launched it: run.json's ``sim_args``; a run folder
    from before they were kept: its seed, speed and (``--demo``) the demo's fault scale."""
    kept = meta.get("sim_args")
    if isinstance(kept, list):
        return [str(a) for a in kept]
    args = meta.get("args") or {}
    extra = ["--seed", str(meta.get("seed", 1))]
    if args.get("speed") is not None:
        extra += ["--speed", str(args["speed"])]
    if args.get("demo"):
        extra += ["--fault-scale", str(DEMO_FAULT_SCALE)]
    return extra


def target_for_replay(
    run_dir: Path,
    meta: dict[str, Any],
    variant_label: str,
    endpoint: str | None,
    named: Path | None = None,
    target_vars: tuple[str, ...] = (),
    api_key: str | None = None,
) -> Target:
    """The server to replay against (see the module docstring): never a target file that
    run.json names, only the copy kept in the folder or the file the user names."""
    if endpoint:
        return EndpointTarget(endpoint, api_key=api_key)
    path = RunDir(run_dir).target_file(meta, named)
    if path is not None:
        args = meta.get("args") or {}
        items = unmasked_target_vars(args.get("target_var") or [], list(target_vars), "replay")
        overrides = dict(v.partition("=")[::2] for v in items)
        spec = load_target(path, var_overrides=overrides)
        factors = next(
            (v["factors"] for v in meta.get("variants", []) if v["label"] == variant_label), None
        )
        if factors is None:
            raise UsageError(f"variant {variant_label!r} is not in {RunDir(run_dir).run_file}")
        variant = Variant(tuple(factors.items()))
        extra: list[str] = []
        if spec.name == "sim":
            extra = sim_args_of(meta)
        return make_target(spec, variant, run_dir / REPLAYS_DIR, extra_args=extra, api_key=api_key)
    if meta.get("endpoint"):
        return EndpointTarget(str(meta["endpoint"]), api_key=api_key)
    raise UsageError("the run recorded no target or endpoint; give --endpoint URL")


# ---- the replay ----------------------------------------------------------------------------


@dataclass(frozen=True)
class ReplayOptions:
    run_dir: Path
    session: int
    variant: str | None = None
    repeat: int | None = None
    turn: int | None = None
    attempt: int | None = None
    count: int = 10
    load: int = 0
    endpoint: str | None = None
    model: str | None = None
    api_key: str | None = None
    request_timeout: float = DEFAULT_REQUEST_TIMEOUT
    limits: Limits = field(default_factory=Limits)
    target: Path | None = None  # the target file to relaunch from (default: the run's copy)
    target_vars: tuple[str, ...] = ()


def condition_summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    judged = [r for r in rows if not r["transport_error"]]
    k = sum(1 for r in judged if r["corrupted"])
    lo, hi = stats.wilson(k, len(judged))
    return {
        "sends": len(rows),
        "judged": len(judged),
        "corrupted": k,
        "rate": k / len(judged) if judged else None,
        "ci": [lo, hi],
        "transport_errors": len(rows) - len(judged),
        "labels": dict(Counter(r["label"] for r in rows)),
        "same_as_recorded": sum(1 for r in rows if r.get("same_as_recorded")),
        "inflight_median": sorted(r["inflight"] for r in rows)[len(rows) // 2] if rows else None,
    }


async def _loaded_sends(
    client: ChatClient, t: Transcript, seq: int, opts: ReplayOptions, scenario: Any
) -> list[dict[str, Any]]:
    """``count`` sends while ``load`` sessions of the scenario keep the server busy."""

    recorded = t.rows[seq].get("response") or {}
    path = opts.run_dir / REPLAYS_DIR / "load-turns.jsonl"
    rows: list[dict[str, Any]] = []
    with TurnWriter(path) as writer:
        shared = Shared(
            client=client,
            scenario=scenario,
            writer=writer,
            base={"run_id": "replay-load", "variant": t.key[0], "factors": {}, "repeat": 0},
            stream=bool(t.header["stream"]),
            limit=asyncio.Semaphore(opts.load),
            transcripts=None,
        )
        rng = random.Random(t.key[2])

        async def worker() -> None:
            while True:  # fresh sessions until cancelled
                plan: SessionPlan = make_plans(scenario, 1, rng.randrange(1 << 31))[0]
                await Session(plan, shared).run()

        workers = [asyncio.create_task(worker()) for _ in range(opts.load)]
        try:
            for _ in range(opts.count):
                for _wait in range(600):  # up to ~60 s for the load to be in flight again
                    if shared.inflight >= opts.load or all(w.done() for w in workers):
                        break
                    await asyncio.sleep(0.1)
                got = await resend(client, t, seq, inflight=shared.inflight + 1)
                rows.append(got.row(recorded))
        finally:
            for w in workers:
                w.cancel()
            for w in workers:
                with contextlib.suppress(asyncio.CancelledError):
                    await w
    return rows


def _scenario_of(meta: dict[str, Any]) -> Any:
    source = meta.get("scenario_source")
    path = Path(source) if source and not str(source).startswith("<") else None
    args = meta.get("args") or {}
    return load_scenario(path).with_overrides(
        max_turns=args.get("turns"), max_context=args.get("max_context")
    )


async def replay(opts: ReplayOptions) -> dict[str, Any]:
    """Run the replay; write ``replays/<name>.json``; return the result."""
    meta = RunDir(opts.run_dir).read_meta()
    t = pick_transcript(opts.run_dir, opts.session, opts.variant, opts.repeat)
    seq = pick_row(t, opts.turn, opts.attempt)
    row = t.rows[seq]
    recorded = row.get("response") or {}
    scenario = _scenario_of(meta) if opts.load else None
    target = target_for_replay(
        opts.run_dir, meta, t.key[0], opts.endpoint, opts.target, opts.target_vars, opts.api_key
    )
    alone: list[dict[str, Any]] = []
    loaded: list[dict[str, Any]] = []
    try:
        base_url = await target.start()
        client = ChatClient(
            base_url,
            model=opts.model or str(t.header["model"]),
            api_key=opts.api_key,
            max_connections=connections_for(opts.load),
            request_timeout=opts.request_timeout,
            limits=opts.limits,
        )
        try:
            for _ in range(opts.count):
                alone.append((await resend(client, t, seq)).row(recorded))
            if opts.load:
                loaded = await _loaded_sends(client, t, seq, opts, scenario)
        finally:
            await client.aclose()
    finally:
        await target.stop()
    result = {
        "run_id": meta.get("run_id"),
        "variant": t.key[0],
        "repeat": t.key[1],
        "session": t.key[2],
        "turn": row["turn"],
        "attempt": row["attempt"],
        "prompt_messages": row["n"],
        "recorded": {k: recorded.get(k) for k in ("label", "corrupted", "sim_injected")},
        "count": opts.count,
        "load": opts.load,
        "server": opts.endpoint or ("relaunched" if meta.get("target") else meta.get("endpoint")),
        "alone": condition_summary(alone),
        "under_load": condition_summary(loaded) if opts.load else None,
        "sends": {"alone": alone, "under_load": loaded},
    }
    name = f"{safe_label(Variant(tuple(_factors(meta, t.key[0]))))}_r{t.key[1]}_s{t.key[2]}"
    name += f"_t{row['turn']}a{row['attempt']}_{time.strftime('%Y%m%d-%H%M%S')}.json"
    out = opts.run_dir / REPLAYS_DIR / name
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2, ensure_ascii=False) + "\n")
    result["path"] = str(out)
    return result


def _factors(meta: dict[str, Any], label: str) -> list[tuple[str, str]]:
    for v in meta.get("variants", []):
        if v.get("label") == label:
            return list((v.get("factors") or {}).items())
    return [("variant", label)] if label else []


def format_replay(result: dict[str, Any]) -> str:
    """The replay as a small table (for the terminal)."""
    rec = result["recorded"]
    head = (
        f"variant {result['variant']}, repeat {result['repeat']}, session {result['session']}, "
        f"turn {result['turn']} attempt {result['attempt']} "
        f"(recorded: {rec.get('label')}), {result['count']} sends per condition"
    )
    lines = [head, "", f"{'condition':<22}{'sends':>6}{'corrupted':>10}{'rate [95% CI]':>24}"
             f"{'errors':>8}  labels"]  # fmt: skip
    conditions = [("alone", result["alone"])]
    if result.get("under_load"):
        conditions.append((f"under load ({result['load']})", result["under_load"]))
    for name, c in conditions:
        lo, hi = c["ci"]
        rate = "n/a" if c["rate"] is None else f"{100 * c['rate']:.0f}%"
        ci = f"{rate} [{100 * lo:.0f}%, {100 * hi:.0f}%]"
        labels = ", ".join(f"{k} {v}" for k, v in sorted(c["labels"].items()))
        lines.append(f"{name:<22}{c['sends']:>6}{c['corrupted']:>10}{ci:>24}"
                     f"{c['transport_errors']:>8}  {labels}")  # fmt: skip
    return "\n".join(lines)
