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
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from harness.analysis.judge import ABS_FLOOR, GAP_FLOOR, decide, greedy_gaps, window_nll
from harness.client.scoring import Scored, Scorer, ScoringFailed, ScoringMismatch, detect_api
from harness.record.rundir import JUDGE_FILE, TRANSCRIPTS_FILE
from harness.record.transcripts import Transcript, load_transcripts
from harness.record.turns import JsonlAppender
from harness.run.options import RunOptions

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
    recorded = cannot_score(opts.out_dir, variant, repeat)
    if recorded is not None:
        announce(f"{variant}: the judge is off: the server could not score a given text "
                 f"(recorded: {recorded})")  # fmt: skip
        return
    after, endpoint = opts.after, opts.endpoint
    api = after.scoring_api if after.scoring_api != "auto" else await detect_api(base_url)
    transcripts = load_transcripts(opts.out_dir / TRANSCRIPTS_FILE)
    lanes, t0 = after.judge_concurrency, time.monotonic()
    async with Scorer(base_url, api, model=model, api_key=endpoint.api_key,  # type: ignore[arg-type]
                      timeout=endpoint.request_timeout, connections=lanes) as scorer:  # fmt: skip
        n, why = await judge_turns(
            scorer, transcripts, opts.out_dir / JUDGE_FILE, part=(variant, repeat),
            share=after.judge_sample, seed=opts.source.seed, base={"run_id": run_id},
            lanes=lanes,
        )  # fmt: skip
    if why is not None:
        announce(f"{variant}: the judge is off: the server cannot score a given text ({why})")
    else:
        announce(f"{variant}: {n} turns scored teacher-forced by the judge in "
                 f"{time.monotonic() - t0:.1f} s ({lanes} at once)")  # fmt: skip


async def judge_saved(
    inputs: dict[str, dict[str, Any]], labelled: list[dict[str, Any]], scorer: Scorer
) -> tuple[list[dict[str, Any]], str | None]:
    """``harness classify --judge``: score each classified line's output teacher-forced after
    its prompt (``messages`` + ``tools`` rendered by the server's chat template, else the
    ``context`` text), and decide ``judge_confirmed`` with the run's rule, the lines the
    classifier passed as the healthy reference. (lines, why the server cannot score or None);
    a line with no prompt is not judged."""
    rows: list[dict[str, Any]] = []
    for out in labelled:
        src = inputs.get(str(out.get("id")))
        if src is None:
            continue
        row = {"variant": "classify", "id": out.get("id"), "flagged": bool(out.get("corrupted"))}
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
            got = await scorer.score(ids[:start], ids[start:], str(src["text"]))
        except ScoringMismatch as exc:
            row["error"] = f"mismatch: {exc}"
        except ScoringFailed as exc:
            if not rows:
                return [], str(exc)
            row["error"] = str(exc)
        else:
            mean, worst = window_nll(got.logprobs)
            row.update(judge_nll=mean, judge_nll_worst=worst)
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
        elif key in errors:
            out = {**out, "judge_error": errors[key]}
        result.append(out)
    return result, None
