"""Teacher-forced confirmation (``--confirm``): the model scores the turns of the run alone.

After a variant's load, every turn the text detector flagged and a seeded sample of the
turns it passed (``judge_sample``) are scored on the idle server: the conversation as sent
plus the output as received, rendered by the server's chat template, the output's tokens
teacher-forced (``client.scoring``), ``--judge-concurrency`` of them in flight at once (the
first alone; a score beside others that the rule could confirm scored again alone). Each
judged turn gets a row in ``judge.jsonl`` with its
``judge_nll`` (mean negative log-likelihood per token, and the worst window of
``analysis.judge.WINDOW`` tokens) and, for a greedy turn written as content only, its
``judge_gap`` (the largest gap below the model's first choice, re-cut words explained:
``analysis.judge``, the greedy check); whether that is far above the model's own healthy outputs
of the same run is decided by ``analysis.judge`` once the variant's turns are all scored, and
merged into ``turns.jsonl`` when the run ends (``judge_nll``, ``judge_confirmed``).

The conversations come from ``transcripts.jsonl`` (with a judge sample above zero every
session's transcript is kept). Only chat-API runs can be judged: a raw-mode turn has no
messages to render. A server that cannot score is said once and the judge skipped; that is
recorded too, as a row of the variant with no turn (``cannot_score``: why), so a resumed run
knows the judge's work there is done (``pending`` is 0) and starts no server for it.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.analysis.judge import (
    ABS_FLOOR,
    GAP_FLOOR,
    decide,
    greedy_gaps,
    merge_into_turns,
    window_nll,
)
from harness.argtypes import api_key_from_env
from harness.client.door import list_models
from harness.client.scoring import Scored, Scorer, ScoringFailed, ScoringMismatch, detect_api
from harness.errors import InfrastructureError, UsageError
from harness.record.rundir import JUDGE_FILE, TRANSCRIPTS_FILE, RunDir
from harness.record.transcripts import Transcript, load_transcripts
from harness.record.turns import JsonlAppender
from harness.run.options import RunOptions
from harness.target.readiness import WAIT_LONGER, EndpointTarget, normalize_endpoint

log = logging.getLogger(__name__)

KEY = ("variant", "repeat", "session", "turn", "attempt")
#: the field of the row that says the server of a variant cannot score (no turn in it)
CANNOT_SCORE = "cannot_score"


def sampled(seed: int, key: tuple[Any, ...], share: float) -> bool:
    """A seeded draw per turn: the same turns are sampled whenever the run is judged."""
    if share >= 1.0:
        return True
    digest = hashlib.blake2b(repr((seed, *key)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2.0**64 < share


def reply_message(response: dict[str, Any]) -> dict[str, Any]:
    """The output as received, as the assistant message a chat template renders."""
    calls = []
    for i, call in enumerate(response.get("tool_calls") or []):
        args = call.get("arguments")
        text = args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)
        calls.append({"id": f"call_{i}", "type": "function",
                      "function": {"name": call.get("name"), "arguments": text}})  # fmt: skip
    message: dict[str, Any] = {"role": "assistant", "content": response.get("content") or None}
    if calls:
        message["tool_calls"] = calls
    return message


def cannot_score(run_dir: Path, variant: str, repeat: int) -> str | None:
    """Why the server of (variant, repeat) could not score, as its judge recorded it (None:
    not recorded)."""
    path = run_dir / JUDGE_FILE
    if not path.exists():
        return None
    for line in path.read_text(encoding="utf-8").splitlines():
        if CANNOT_SCORE not in line:
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if row.get("variant") == variant and row.get("repeat") == repeat:
            return str(row[CANNOT_SCORE])
    return None


def _done(run_dir: Path) -> set[tuple[Any, ...]]:
    path = run_dir / JUDGE_FILE
    if not path.exists():
        return set()
    out = set()
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        out.add(tuple(row.get(k) for k in KEY))
    return out


Judged = tuple[Transcript, int, tuple[Any, ...], dict[str, Any]]


def to_judge(
    transcripts: Mapping[tuple[str, int, int], Transcript],
    variant: str | None,
    repeat: int | None,
    share: float,
    seed: int,
    done: set[tuple[Any, ...]],
) -> Iterator[Judged]:
    """The turns the judge scores and has not scored yet: (transcript, its row's index, key,
    the output as an assistant message), the flagged ones and the seeded sample of the rest
    (of one variant/repeat when given)."""
    for (v, r, session), t in sorted(transcripts.items()):
        if (variant is not None and v != variant) or (repeat is not None and r != repeat):
            continue
        for seq, row in enumerate(t.rows):
            response = row.get("response") or {}
            key = (v, r, session, row["turn"], row["attempt"])
            if response.get("failure") or key in done:
                continue
            if not response.get("corrupted") and not sampled(seed, key, share):
                continue
            reply = reply_message(response)
            if reply.get("content") or reply.get("tool_calls"):
                yield t, seq, key, reply


def pending(opts: RunOptions, transcripts: Mapping[tuple[str, int, int], Transcript],
            variant: str, repeat: int) -> int:  # fmt: skip
    """Turns of (variant, repeat) the judge has still to score: a resumed run's work after a
    stop during the judge. None where its judge found that the server cannot score."""
    if cannot_score(opts.out_dir, variant, repeat) is not None:
        return 0
    done, share = _done(opts.out_dir), opts.after.judge_sample
    return sum(1 for _ in to_judge(transcripts, variant, repeat, share, opts.source.seed, done))


def _record(key: tuple[Any, ...], response: Mapping[str, Any], base: Mapping[str, Any]
            ) -> dict[str, Any]:  # fmt: skip
    return {**base, **dict(zip(KEY, key, strict=True)),
            "flagged": bool(response.get("corrupted")), "label": response.get("label"),
            "sim_injected": response.get("sim_injected")}  # fmt: skip


async def _score(scorer: Scorer, item: Judged, base: Mapping[str, Any]
                 ) -> tuple[dict[str, Any], str | None]:  # fmt: skip
    """One judged turn scored: (its row, why the scoring failed where it did: a server that
    cannot score says so on its first request)."""
    t, seq, key, reply = item
    response = t.rows[seq].get("response") or {}
    record = _record(key, response, base)
    body = t.body(seq)
    greedy = greedy_checkable(body, response)
    try:
        ids, start = await scorer.chat_ids(body["messages"], body.get("tools"), reply)
        if start < 1 or start >= len(ids):
            raise ScoringFailed("the rendered output is empty")
        got = await scorer.score(ids[:start], ids[start:], "", top_k=1 if greedy else 0)
    except ScoringMismatch as exc:
        record["error"] = f"mismatch: {exc}"
    except ScoringFailed as exc:
        record["error"] = str(exc)
        return record, str(exc)
    else:
        mean, worst = window_nll(got.logprobs)
        record.update(judge_nll=mean, judge_nll_worst=worst, tokens=len(got.ids))
        if greedy and got.top is not None:
            gap, retokenized = await unexplained_gap(scorer, got)
            if gap is not None:
                record["judge_gap"] = round(gap, 4)
            if retokenized:
                record["gap_retokenized"] = retokenized
        if got.skipped:
            record["unscored_tokens"] = len(got.skipped)
    return record, None


#: the most gaps above the floor checked for a re-tokenized word in one turn
RETOKENIZED_MAX = 4


async def unexplained_gap(scorer: Scorer, got: Scored) -> tuple[float | None, int]:
    """(the gap that counts, how many above the floor the model's first choice explained).
    The gaps above the floor are walked in text order; one is explained when the first
    choice's text begins the text from there on (the model wrote the same word in other
    pieces than the tokenizer cuts it into now), or when it lies within the next two tokens
    of the same word after such a one (the pieces after a re-cut word are read after another
    context than the model wrote them after). The first one not explained is the gap; with
    all explained, the largest below the floor. None: it cannot be told (the server cannot
    detokenize, or more than ``RETOKENIZED_MAX`` explained ones)."""
    assert got.top is not None
    gaps = greedy_gaps(got.logprobs, got.top)
    over = sorted((j, gap, first) for gap, j, first in gaps if gap > GAP_FLOOR)
    explained, last = 0, -10
    try:
        for j, gap, first in over:
            if explained >= RETOKENIZED_MAX:
                return None, explained
            piece = await scorer.detokenize([first])
            rest = await scorer.detokenize(got.ids[j:])
            if piece and rest.startswith(piece):
                explained, last = explained + 1, j
                continue
            if j - last <= 2:
                between = await scorer.detokenize(got.ids[last : j + 1])
                if not any(c.isspace() for c in between[1:]):  # (one word)
                    explained += 1
                    continue
            return gap, explained
    except ScoringFailed:
        return None, explained
    return max((gap for gap, _, _ in gaps if gap <= GAP_FLOOR), default=0.0), explained


def greedy_checkable(body: Mapping[str, Any], response: Mapping[str, Any]) -> bool:
    """Whether the judge's greedy check applies to a turn (analysis.judge): a greedy request
    whose output renders as it was generated (content only, no reasoning apart)."""
    temperature = body.get("temperature")
    if isinstance(temperature, bool) or not isinstance(temperature, int | float):
        return False
    return (
        temperature == 0
        and bool(response.get("content"))
        and not response.get("tool_calls")
        and not response.get("reasoning")
    )


def _line(record: Mapping[str, Any]) -> bytes:
    return json.dumps(record, ensure_ascii=False).encode() + b"\n"


async def _lanes(
    scorer: Scorer, todo: Iterator[Judged], out: JsonlAppender, lanes: int,
    base: Mapping[str, Any],
) -> int:  # fmt: skip
    """Score ``todo`` with up to ``lanes`` requests in flight, each row appended as it
    finishes. A score made beside others whose worst window is above the rule's floor, or
    whose greedy gap is above its floor (one the rule could confirm), is held and scored
    again alone when the lanes are done: what the judge hunts is a fault that needs
    concurrency, and its own requests beside each other could meet it; the row is the lone
    score (``beside_nll_worst``, ``beside_gap``: the score beside)."""
    n = 0
    held: list[tuple[Judged, float, float]] = []

    async def lane() -> None:
        nonlocal n
        for item in todo:  # (one iterator shared: each lane takes the next turn)
            record, _ = await _score(scorer, item, base)
            worst, gap = record.get("judge_nll_worst"), record.get("judge_gap") or 0.0
            if lanes > 1 and worst is not None and (worst > ABS_FLOOR or gap > GAP_FLOOR):
                held.append((item, float(worst), float(gap)))
                continue
            out.append(_line(record))
            n += 1

    tasks = [asyncio.ensure_future(lane()) for _ in range(lanes)]
    try:
        await asyncio.gather(*tasks)
    except BaseException:  # (the first error as it is, the other lanes stopped)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise
    for item, beside, beside_gap in held:
        record, _ = await _score(scorer, item, base)
        if record.get("judge_nll_worst") is not None:
            record["beside_nll_worst"] = beside
            if "judge_gap" in record:
                record["beside_gap"] = beside_gap
        out.append(_line(record))
        n += 1
    return n


async def judge_turns(
    scorer: Scorer,
    transcripts: dict[tuple[str, int, int], Transcript],
    out_path: Path,
    *,
    part: tuple[str | None, int | None],
    share: float,
    seed: int,
    base: dict[str, Any],
    lanes: int = 1,
) -> tuple[int, str | None]:
    """Score the flagged and the sampled turns of ``transcripts`` (of one (variant, repeat)
    in ``part``, None: any) into ``out_path``, up to ``lanes`` at once; (rows written, why
    the server cannot score or None). The first turn is scored alone: when it fails, the
    server cannot score, which is recorded once and nothing else is sent."""
    done = _done(out_path.parent)
    todo = to_judge(transcripts, part[0], part[1], share, seed, done)
    out = JsonlAppender(out_path)
    try:
        first = next(todo, None)
        if first is None:
            return 0, None
        record, failed = await _score(scorer, first, base)
        if failed is not None:  # the first one fails: the server cannot score (recorded)
            mark = {**base, **dict(zip(KEY, first[2], strict=True)), "session": None,
                    "turn": None, "attempt": None, CANNOT_SCORE: failed}  # fmt: skip
            out.append(_line(mark))
            return 0, failed
        out.append(_line(record))
        return 1 + await _lanes(scorer, todo, out, lanes, base), None
    finally:
        out.close()


@dataclass(frozen=True)
class JudgeServer:
    """The server that scores and how: its URL, the scoring shape it speaks (auto: asked),
    the run's model, its key, the request timeout, and the scores in flight at once."""

    base_url: str
    scoring_api: str
    model: str
    api_key: str | None
    timeout: float
    lanes: int


async def judge_variant(
    opts: RunOptions,
    base_url: str,
    model: str,
    run_id: str,
    variant: str,
    repeat: int,
    announce: Callable[[str], None],
) -> None:
    """--confirm's teacher-forced pass over one variant's turns, on its idle server."""
    if opts.source.api != "chat":
        announce(f"{variant}: the judge scores chat turns only; --api {opts.source.api} is not "
                 "judged")  # fmt: skip
        return
    after, endpoint = opts.after, opts.endpoint
    server = JudgeServer(base_url, after.scoring_api, model, endpoint.api_key,
                         endpoint.request_timeout, after.judge_concurrency)  # fmt: skip
    sample = (after.judge_sample, opts.source.seed)
    await judge_part(server, opts.out_dir, run_id, (variant, repeat), sample, announce)


async def judge_part(
    server: JudgeServer,
    run_dir: Path,
    run_id: str,
    part: tuple[str, int],
    sample: tuple[float, int],
    announce: Callable[[str], None],
) -> int:
    """Score (variant, repeat)'s flagged turns and its seeded ``sample`` (share, seed) of the
    passed ones of ``run_dir``'s transcripts on ``server`` into judge.jsonl, what was already
    scored there skipped; the rows written."""
    variant, repeat = part
    recorded = cannot_score(run_dir, variant, repeat)
    if recorded is not None:
        announce(f"{variant}: the judge is off: the server could not score a given text "
                 f"(recorded: {recorded})")  # fmt: skip
        return 0
    api = server.scoring_api
    if api == "auto":
        api = await detect_api(server.base_url, server.api_key)
    transcripts = load_transcripts(run_dir / TRANSCRIPTS_FILE)
    lanes, t0 = server.lanes, time.monotonic()
    async with Scorer(server.base_url, api, model=server.model,  # type: ignore[arg-type]
                      api_key=server.api_key, timeout=server.timeout,
                      connections=lanes) as scorer:  # fmt: skip
        n, why = await judge_turns(
            scorer, transcripts, run_dir / JUDGE_FILE, part=part, share=sample[0],
            seed=sample[1], base={"run_id": run_id}, lanes=lanes,
        )  # fmt: skip
    if why is not None:
        announce(f"{variant}: the judge is off: the server cannot score a given text ({why})")
    else:
        announce(f"{variant}: {n} turns scored teacher-forced by the judge in "
                 f"{time.monotonic() - t0:.1f} s ({lanes} at once)")  # fmt: skip
    return n


async def judge_saved(
    inputs: dict[str, dict[str, Any]], labelled: list[dict[str, Any]], scorer: Scorer
) -> tuple[list[dict[str, Any]], str | None]:
    """``harness classify --judge``: score each classified line's output teacher-forced after
    its prompt (``messages`` + ``tools`` rendered by the server's chat template, else the
    ``context`` text), and decide ``judge_confirmed`` with the run's rule, the lines the
    classifier passed as the healthy reference. (lines, why the server cannot score or None);
    a line with no prompt is not judged. A line written greedily (``"temperature": 0``) as
    text only gets the greedy check too (``judge_gap``), as a run's greedy turns do."""
    rows: list[dict[str, Any]] = []
    for out in labelled:
        src = inputs.get(str(out.get("id")))
        if src is None:
            continue
        row = {"variant": "classify", "id": out.get("id"), "flagged": bool(out.get("corrupted"))}
        output = {"content": src.get("text"), "tool_calls": src.get("tool_calls"),
                  "reasoning": src.get("reasoning")}  # fmt: skip
        greedy = greedy_checkable(src, output)
        try:
            if isinstance(src.get("messages"), list):
                reply = reply_message({"content": src.get("text"),
                                       "tool_calls": src.get("tool_calls")})  # fmt: skip
                ids, start = await scorer.chat_ids(src["messages"], src.get("tools"), reply)
            elif isinstance(src.get("context"), str) and src["context"]:
                head = await scorer.tokenize(src["context"])
                ids, start = head + await scorer.tokenize(str(src["text"])), len(head)
            else:
                continue
            if start < 1 or start >= len(ids):
                raise ScoringFailed("the output is empty once rendered")
            got = await scorer.score(
                ids[:start], ids[start:], str(src["text"]), top_k=1 if greedy else 0
            )
            gap = await unexplained_gap(scorer, got) if greedy and got.top is not None else None
        except ScoringMismatch as exc:
            row["error"] = f"mismatch: {exc}"
        except ScoringFailed as exc:
            if not rows:
                return [], str(exc)
            row["error"] = str(exc)
        else:
            mean, worst = window_nll(got.logprobs)
            row.update(judge_nll=mean, judge_nll_worst=worst)
            if gap is not None and gap[0] is not None:
                row["judge_gap"] = round(gap[0], 4)
        rows.append(row)
    scored, _ = decide(rows)
    by_id = {str(r["id"]): r for r in scored}
    errors = {str(r["id"]): r["error"] for r in rows if "error" in r}
    result = []
    for out in labelled:
        key = str(out.get("id"))
        if key in by_id:
            r = by_id[key]
            out = {**out, "judge_nll": round(r["judge_nll"], 6),
                   "judge_nll_worst": round(r["judge_nll_worst"], 6),
                   "judge_confirmed": r["judge_confirmed"]}  # fmt: skip
            out.update({k: r[k] for k in ("judge_gap", "judge_by") if r.get(k) is not None})
        elif key in errors:
            out = {**out, "judge_error": errors[key]}
        result.append(out)
    return result, None


def judge_servers(given: Sequence[str], labels: Sequence[str]) -> dict[str, str]:
    """``--judge [VARIANT=]URL``, repeated: the judge's server of each variant. A URL alone
    scores every variant not named with one of its own; a variant the run does not have, or
    named twice, is a usage error."""
    out: dict[str, str] = {}
    default: str | None = None
    for item in given:
        # a variant's label holds '=' itself (index_k=fp8): the last one before the URL's
        # scheme ends it; with no '=' there, it is a URL alone (whose query may hold one)
        head = item[: item.find("://")] if "://" in item else item
        if "=" not in head:
            if default is not None:
                raise UsageError(f"--judge {item}: a URL for every variant is given twice "
                                 f"({default}); name the variant: --judge VARIANT=URL")  # fmt: skip
            default = _judge_url(item)
            continue
        name = head[: head.rfind("=")]
        if name not in labels:
            raise UsageError(f"--judge {item}: the run has no variant {name!r} "
                             f"(its variants: {', '.join(labels)})")  # fmt: skip
        if name in out:
            raise UsageError(f"--judge: variant {name!r} is given two servers")
        out[name] = _judge_url(item[len(name) + 1 :])
    for label in labels:
        if default is not None:
            out.setdefault(label, default)
    return out


def _judge_url(url: str) -> str:
    """A server's base URL as ``--endpoint`` takes it (``HOST:PORT``, ``.../v1``...)."""
    try:
        return normalize_endpoint(url)
    except UsageError as exc:
        raise UsageError(str(exc).replace("--endpoint", "--judge", 1)) from None


def _variant_model(meta: Mapping[str, Any], label: str) -> str:
    dialects = meta.get("dialects") or {}
    return str((dialects.get(label) or {}).get("model") or meta.get("model") or "")


async def check_judges(servers: Mapping[str, str], meta: Mapping[str, Any]) -> list[str]:
    """Before anything is written: each judge server is up and speaks the OpenAI API (else a
    usage or infrastructure error); the warnings to say: a server that does not list the model
    that wrote its variant's turns (the judge asks for that model: a server that serves
    models by name refuses it, and the judge says it cannot score; one that ignores the name,
    as llama.cpp does, scores with its own)."""
    args = meta.get("args") or {}
    if args.get("api", "chat") != "chat":
        raise UsageError(f"--judge: the judge scores chat turns only; this run used --api "
                         f"{args.get('api')}")  # fmt: skip
    key = api_key_from_env(str(args.get("api_key_env") or "OPENAI_API_KEY"))
    warnings = []
    for url in sorted(set(servers.values())):
        try:
            await EndpointTarget(url, api_key=key).start()
        except (UsageError, InfrastructureError) as exc:  # (merge has no --ready-timeout)
            said = str(exc).replace(f" ({WAIT_LONGER})", "")
            raise type(exc)(f"--judge {url}: {said}") from None
        cards = await list_models(url, api_key=key) or []
        served = {str(c.get("id")) for c in cards if isinstance(c, dict)}
        for label in (lb for lb, u in servers.items() if u == url):
            model = _variant_model(meta, label)
            if served and model and model not in served:
                warnings.append(
                    f"--judge {url} lists {', '.join(sorted(served))}, not {model}, the model "
                    f"that wrote variant {label}'s turns: the judge must score with that model"
                )
    return warnings


async def judge_run_folder(
    run_dir: Path,
    servers: Mapping[str, str],
    scoring_api: str,
    lanes: int | None,
    announce: Callable[[str], None],
) -> int:
    """The judge a run in one process gives its variants after their load (``--judge
    auto``), given to a finished run folder (the shards of a run merged: no shard judges,
    since the healthy reference is the whole variant's): every (variant, repeat) with a
    flagged turn is scored on its ``servers`` entry with the run's own sample share, seed,
    key and timeout, and the verdicts written into turns.jsonl. The rows written."""
    meta = RunDir(run_dir).read_meta()
    args = meta.get("args") or {}
    key = api_key_from_env(str(args.get("api_key_env") or "OPENAI_API_KEY"))
    sample = (float(args.get("judge_sample", 0.1)), int(args.get("seed") or 0))
    flagged = {
        (v, r)
        for (v, r, _session), t in load_transcripts(run_dir / TRANSCRIPTS_FILE).items()
        if any((row.get("response") or {}).get("corrupted") for row in t.rows)
    }
    n = 0
    try:
        parts = [(str(o["variant"]), int(o.get("repeat", 0))) for o in meta.get("order") or []]
        repeats = len({r for _, r in parts}) > 1
        for part in parts:
            label = part[0]
            name = label + (f" (repeat {part[1] + 1})" if repeats else "")
            if label not in servers:
                announce(f"{name}: not judged (no --judge server for it)")
                continue
            if part not in flagged:
                announce(f"{name}: no flagged turn to judge")
                continue
            server = JudgeServer(
                servers[label], scoring_api, _variant_model(meta, label), key,
                float(args.get("request_timeout") or 120.0),
                lanes or int(args.get("judge_concurrency") or 1),
            )  # fmt: skip
            n += await judge_part(server, run_dir, str(meta.get("run_id")), part, sample, announce)
    finally:  # (a judge cut short: the verdicts of what it scored are kept)
        merge_into_turns(run_dir)
    return n
