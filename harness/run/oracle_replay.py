"""``--oracle replay``: after a variant's load, every send (or a seeded sample) re-sent alone
and compared with what it gave under load.

On a server in a deterministic mode (SGLang ``--enable-deterministic-inference``, vLLM
``VLLM_BATCH_INVARIANT=1``) at temperature 0 or with a fixed sampling seed, a request alone
gives exactly what it gives in any batch: "under load equals alone" proves a turn healthy,
and any difference is a bug, whatever the text looks like.

The cache path: each session's sampled sends are re-sent in their order, after one
``/flush_cache`` before the session's first one (where the server has it). Each send then
finds the prefix its session's earlier sends left in the cache, as under load (where the
session's previous turn had just cached it); the only difference is what other sessions
evicted under load.

The comparison is token by token where both sides carry the generated tokens (the sessions
ask for them with the oracle on: ``return_token_ids``, and non-streamed ``logprobs``;
``compared`` is ``tokens`` for ids, ``token_strings`` where the server gives only the token
strings), else of the text (``compared: text``: reasoning, content, tool-call names and
arguments; call ids are left out). A diverged row has ``position``, the first differing
character of that text, with the text around it on both sides, and with tokens
``token_index``, the first differing token, with the ids around it.

Where the server can score a given text (client.scoring), a diverged send's loaded output is
scored teacher-forced from the first difference on: the same prompt and the loaded output's
common prefix with the lone one as the condition, the loaded continuation as the scored
tokens. Its worst window against the judge's threshold (analysis.judge: the variant's healthy
turns in judge.jsonl, else the absolute floor) gives ``judge_verdict``: ``implausible`` (the
judge calls the loaded continuation corrupted) or ``plausible``.

Rows go to ``oracle_replay.jsonl`` keyed like confirm.jsonl: ``status`` is ``identical``,
``diverged`` or ``undecided`` (a transport failure on either side). ``exact`` says whether
the server declared a deterministic mode (analysis.oracles reads it).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple, TextIO

from harness.analysis import variantcheck
from harness.analysis.confirm import ROW_KEY, row_key
from harness.analysis.judge import read_rows as judge_rows
from harness.analysis.judge import threshold, window_nll
from harness.client.chat import ChatClient
from harness.client.scoring import Scorer, ScoringFailed, ScoringMismatch, detect_api
from harness.drive.session import response_of
from harness.errors import UsageError
from harness.record.rundir import ORACLE_REPLAY_FILE, TRANSCRIPTS_FILE
from harness.record.transcripts import Transcript, load_transcripts
from harness.record.turns import read_rows
from harness.run.judge import reply_message
from harness.run.replay import resend
from harness.target.metrics import flush_cache

log = logging.getLogger(__name__)

IDENTICAL, DIVERGED, UNDECIDED = "identical", "diverged", "undecided"
IMPLAUSIBLE, PLAUSIBLE = "implausible", "plausible"  # the judge on a loaded continuation
AROUND = 40  # characters of text shown before and after the first difference
AROUND_TOKENS = 8  # tokens kept before and after the first differing token


def check_sampling(temperature: float, seeded: bool, what: str = "the scenario") -> None:
    """``--oracle replay`` needs the same sampling alone as under load: greedy or seeded."""
    if temperature > 0 and not seeded:
        raise UsageError(
            f"--oracle replay needs deterministic sampling: {what} samples at temperature "
            f"{temperature:g} without a fixed seed; use temperature 0 or a seeded workload"
        )


def tokens_of(resp: Mapping[str, Any]) -> tuple[str, list[Any]] | None:
    """(how, the generated tokens) of an output that carries them: ``tokens`` (ids) or
    ``token_strings``; None without them."""
    ids = resp.get("token_ids")
    if isinstance(ids, list):
        return "tokens", ids
    strs = resp.get("token_strs")
    return ("token_strings", strs) if isinstance(strs, list) else None


def compare(loaded: Mapping[str, Any], alone: Mapping[str, Any]) -> dict[str, Any]:
    """The comparison of a loaded output with its lone one: ``compared``, ``status`` and,
    diverged, the first differing character (``position``, the text around it) and token
    (``token_index``, the tokens around it)."""
    a, b = output_text(loaded), output_text(alone)
    out: dict[str, Any] = {"compared": "text"}
    pos = first_difference(a, b)
    ta, tb = tokens_of(loaded), tokens_of(alone)
    index = None
    if ta is not None and tb is not None and ta[0] == tb[0]:
        out["compared"] = ta[0]
        index = first_difference(ta[1], tb[1])
        if index is not None:
            lo = max(0, index - AROUND_TOKENS)
            out.update(token_index=index, loaded_tokens=ta[1][lo : index + AROUND_TOKENS],
                       alone_tokens=tb[1][lo : index + AROUND_TOKENS])  # fmt: skip
    out["status"] = IDENTICAL if pos is None and index is None else DIVERGED
    if pos is not None:
        lo = max(0, pos - AROUND)
        out.update(position=pos, loaded_text=a[lo : pos + AROUND], alone_text=b[lo : pos + AROUND])
    return out


class Access(NamedTuple):
    """How the replay reaches the server beyond its chat client: the API key (the cache
    flush, the scoring) and the judge's scoring API (``auto``: asked of the server, a name of
    client.scoring, or ``off``)."""

    api_key: str | None = None
    scoring_api: str = "auto"


DEFAULT_ACCESS = Access()


class Sample(NamedTuple):
    """Which sends the replay re-sends: a seeded share of them (--oracle-sample, --seed)."""

    share: float = 1.0
    seed: int = 1


def sampled(key: Sequence[Any], share: float, seed: int) -> bool:
    """Whether ``key``'s send is in the seeded sample (the same sends on every resume)."""
    if share >= 1.0:
        return True
    digest = hashlib.blake2b(f"{seed}|{json.dumps(list(key))}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64 < share


def wanted(
    key: tuple[Any, ...], recorded: Mapping[str, Any], done: set[tuple[Any, ...]], sample: Sample
) -> bool:
    """Whether the replay re-sends this send: in the sample, not replayed yet, and answered
    under load (a failure or a transport error has nothing to compare)."""
    if key in done or not sampled(key, *sample):
        return False
    return not (recorded.get("failure") or recorded.get("label") == "transport_error")


def pending(
    run_dir: Path,
    transcripts: Mapping[tuple[str, int, int], Transcript],
    key: tuple[str, int],
    sample: Sample,
) -> int:
    """Sends of ``key`` (variant, repeat) the replay has still to re-send: a resumed run's
    work after a stop during the replay."""
    done = {row_key(r) for r in read_rows(run_dir / ORACLE_REPLAY_FILE)}
    return sum(
        wanted((*key, session, row["turn"], row["attempt"]), row.get("response") or {}, done,
               sample)
        for (v, r, session), t in transcripts.items() if (v, r) == key
        for row in t.rows
    )  # fmt: skip


def _calls(calls: Sequence[Mapping[str, Any]] | None) -> str:
    out = []
    for c in calls or []:
        inner = c.get("function")
        fn: Mapping[str, Any] = inner if isinstance(inner, Mapping) else c
        args = fn.get("arguments")
        if isinstance(args, str):
            with contextlib.suppress(json.JSONDecodeError):
                args = json.loads(args)
        out.append({"name": fn.get("name"), "arguments": args})
    return json.dumps(out, sort_keys=True, ensure_ascii=False) if out else ""


def output_text(resp: Mapping[str, Any]) -> str:
    """What the comparison reads of an output: reasoning, content, calls (ids left out)."""
    parts = [str(resp.get("reasoning") or ""), str(resp.get("content") or "")]
    return "\x1e".join([*parts, _calls(resp.get("tool_calls"))])


def first_difference(a: Sequence[Any], b: Sequence[Any]) -> int | None:
    """The first position where ``a`` and ``b`` differ (None: identical): characters of two
    texts, or items of two token lists."""
    if a == b:
        return None
    n = min(len(a), len(b))
    return next((i for i in range(n) if a[i] != b[i]), n)


def _flag(command: Sequence[Any], name: str) -> str | None:
    """The value after ``name`` in a launch command (None when absent)."""
    items = [str(c) for c in command]
    at = [i for i, c in enumerate(items[:-1]) if c == name]
    return items[at[-1] + 1] if at else None  # the last one given wins


def exactness(config: Mapping[str, Any], target_says: bool = False) -> tuple[bool, str]:
    """Whether "under load equals alone" is exact on this server, and why (a server's
    configuration as server_facts.jsonl keeps it)."""
    if target_says:
        return True, "the target file declares a deterministic mode (deterministic = true)"
    info = config.get("server_info") or {}
    if isinstance(info, Mapping) and info.get("enable_deterministic_inference") is True:
        return True, "the server reports enable_deterministic_inference"
    launch = config.get("launch") or {}
    launch = launch if isinstance(launch, Mapping) else {}
    env = launch.get("env") or {}
    if isinstance(env, Mapping) and str(env.get("VLLM_BATCH_INVARIANT", "")) == "1":
        return True, "vLLM launched with VLLM_BATCH_INVARIANT=1"
    command = launch.get("command") or []
    if any("harness.llamacpp" in str(c) or "llama-server" in str(c) for c in command):
        # measured (benchmarks/llamacpp_replay.py, README): with 8 slots, greedy answers sent
        # together differ from the same answers sent alone in every setting tried (flash
        # attention and the prompt cache on or off); one slot with the prompt cache off is
        # the setting where under load equals alone
        slots = _flag(command, "--parallel") or _flag(command, "-np") or "8"
        no_cache = "--no-prompt-cache" in [str(c) for c in command]
        if slots == "1" and no_cache:
            return True, LLAMACPP_EXACT
        return False, LLAMACPP_NOT_EXACT
    return False, "no deterministic mode declared (target file, server_info or launch)"


LLAMACPP_EXACT = "llama.cpp with one slot (--parallel 1) and --no-prompt-cache (README)"
LLAMACPP_NOT_EXACT = (
    "llama.cpp with more than one slot or the prompt cache on: greedy answers under load "
    "differ from the lone ones (measured: README); the scores are compared instead (the "
    "canary's KL)"
)


def _exact(run_dir: Path, variant: str, repeat: int, target_says: bool) -> tuple[bool, str]:
    key = (variant, repeat)
    rows = [r for r in variantcheck.load(run_dir) if (r["variant"], r["repeat"]) == key]
    return exactness(rows[-1].get("config") or {} if rows else {}, target_says)


def judge_threshold(run_dir: Path, variant: str) -> float:
    """The judge's threshold on a worst window for ``variant``: from its healthy judged turns
    (judge.jsonl, the turns the text detector passed), else the absolute floor."""
    rows = [r for r in judge_rows(run_dir) if r.get("variant") == variant]
    healthy = [r.get("judge_nll_worst") for r in rows if not r.get("flagged")]
    return threshold([x for x in healthy if x is not None])


def prefix_reply(recorded: Mapping[str, Any], position: int | None) -> dict[str, Any]:
    """The loaded output up to ``position`` of its comparison text (``output_text``), as the
    assistant message a chat template renders: the content's common part (none where the
    difference is in the reasoning, all of it where it is in the tool calls)."""
    reasoning = str(recorded.get("reasoning") or "")
    content = str(recorded.get("content") or "")
    at = 0 if position is None else position - len(reasoning) - 1  # (the separator)
    return reply_message({"content": content[: max(0, at)]})


class ContinuationJudge:
    """The judge's verdict on a diverged send's loaded continuation from the first difference:
    teacher-forced (client.scoring), conditioned on the prompt and the common prefix. The
    scorer is made at the first diverged send; a server whose first scoring fails cannot
    score, and is not asked again."""

    def __init__(self, client: ChatClient, api_key: str | None, api: str, limit: float) -> None:
        self.client, self.api_key, self.api, self.limit = client, api_key, api, limit
        self.scorer: Scorer | None = None
        self.scored = 0
        self.off: str | None = None  # why the server cannot score

    async def aclose(self) -> None:
        if self.scorer is not None:
            await self.scorer.aclose()

    async def _scorer(self) -> Scorer:
        if self.scorer is None:
            base = self.client.base_url
            api = self.api if self.api != "auto" else await detect_api(base, self.api_key)
            self.scorer = Scorer(base, api, model=self.client.model, api_key=self.api_key,  # type: ignore[arg-type]
                                 timeout=self.client.request_timeout)  # fmt: skip
        return self.scorer

    async def verdict(
        self, body: Mapping[str, Any], recorded: Mapping[str, Any], position: int | None
    ) -> dict[str, Any]:
        """``judge_verdict`` (implausible | plausible) with its numbers, or ``judge_error``."""
        if self.off is not None:
            return {"judge_error": f"the server cannot score ({self.off})"}
        reply = reply_message(dict(recorded))
        if not reply.get("content") and not reply.get("tool_calls"):
            return {"judge_error": "an empty output: nothing to score"}
        messages, tools = body["messages"], body.get("tools")
        try:
            scorer = await self._scorer()
            ids, start = await scorer.chat_ids(messages, tools, reply)
            head, _ = await scorer.chat_ids(messages, tools, prefix_reply(recorded, position))
            common = first_difference(ids, head)
            at = max(start, len(ids) if common is None else common)
            if at < 1 or at >= len(ids):
                return {"judge_error": "no loaded continuation past the first difference"}
            got = await scorer.score(ids[:at], ids[at:], "")
        except ScoringMismatch as exc:
            return {"judge_error": f"mismatch: {exc}"}
        except ScoringFailed as exc:
            if not self.scored:
                self.off = str(exc)
            return {"judge_error": str(exc)}
        self.scored += 1
        mean, worst = window_nll(got.logprobs)
        return {
            "judge_verdict": IMPLAUSIBLE if worst > self.limit else PLAUSIBLE,
            "judge_nll": round(mean, 4),
            "judge_nll_worst": round(worst, 4),
            "judge_threshold": round(self.limit, 4),
            "judge_tokens": len(ids) - at,
        }


Todo = list[tuple[tuple[Any, ...], dict[str, Any], dict[str, Any]]]  # (key, row, recorded)


async def replay_oracle_variant(
    client: ChatClient,
    run_dir: Path,
    run_id: str,
    which: tuple[str, int],
    sample: Sample,
    *,
    declared: bool = False,
    access: Access = DEFAULT_ACCESS,
    lanes: int = 1,
) -> list[dict[str, Any]]:
    """Re-send the sampled sends of ``which`` (variant, repeat) alone (``lanes`` sessions at
    once on a deterministic server: ``_together``); append oracle_replay.jsonl. Unless
    ``access.scoring_api`` is ``off`` the judge gives each diverged send its verdict."""
    api_key, scoring_api = access
    variant, repeat = which
    path = run_dir / ORACLE_REPLAY_FILE
    done = {row_key(r) for r in read_rows(path)}
    exact = _exact(run_dir, variant, repeat, declared)
    if lanes > 1 and not exact[0]:
        log.warning("--oracle-concurrency %d: the server declared no deterministic mode, so "
                    "its re-sends go one at a time", lanes)  # fmt: skip
        lanes = 1
    transcripts = load_transcripts(run_dir / TRANSCRIPTS_FILE)
    todo: list[tuple[Transcript, Todo]] = []
    for (v, r, session), t in sorted(transcripts.items()):
        if (v, r) != (variant, repeat):
            continue
        mine = []
        for row in t.rows:
            key = (v, r, session, row["turn"], row["attempt"])
            recorded = row.get("response") or {}
            if wanted(key, recorded, done, sample):
                mine.append((key, row, recorded))
        if mine:
            todo.append((t, mine))
    async with contextlib.AsyncExitStack() as stack:
        judge = None
        if scoring_api != "off":
            judge = ContinuationJudge(
                client, api_key, scoring_api, judge_threshold(run_dir, variant)
            )
            stack.push_async_callback(judge.aclose)
        with open(path, "a", encoding="utf-8") as fh:  # noqa: ASYNC230 - a local file
            replay = _Replay(client, run_id, exact, judge, fh, lanes)
            if lanes == 1:
                await _alone(replay, todo, api_key)
            else:
                await _together(replay, todo, api_key)
        return replay.rows


@dataclass
class _Replay:
    """One variant's replay: what each re-send is compared with, and where its row goes."""

    client: ChatClient
    run_id: str
    exact: tuple[bool, str]
    judge: ContinuationJudge | None
    fh: TextIO
    lanes: int = 1
    rows: list[dict[str, Any]] = field(default_factory=list)

    async def send(
        self, t: Transcript, key: tuple[Any, ...], row: Mapping[str, Any],
        recorded: Mapping[str, Any],
    ) -> dict[str, Any]:  # fmt: skip
        """Re-send one send and compare it (no judge, no row yet)."""
        got = await resend(self.client, t, row["seq"])
        out: dict[str, Any] = {"run_id": self.run_id, **dict(zip(ROW_KEY, key, strict=True))}
        out.update(
            exact=self.exact[0],
            exact_reason=self.exact[1],
            loaded_label=recorded.get("label"),
            loaded_corrupted=bool(recorded.get("corrupted")),
            sim_injected=recorded.get("sim_injected"),
            prompt_tokens=recorded.get("prompt_tokens"),
            alone_label=got.verdict.label,
        )
        if self.lanes > 1:
            out["concurrency"] = self.lanes
        if got.failed:
            out.update(status=UNDECIDED, error=str(got.out.failure))
        else:
            out.update(compare(recorded, response_of(got.out, got.verdict)))
        return out

    async def write(self, t: Transcript, row: Mapping[str, Any], recorded: Mapping[str, Any],
                    out: dict[str, Any]) -> None:  # fmt: skip
        """The judge's verdict on a diverged send, then its row, appended and flushed."""
        if out["status"] == DIVERGED and self.judge is not None:
            body = t.body(row["seq"])
            out.update(await self.judge.verdict(body, recorded, out.get("position")))
        self.fh.write(json.dumps(out, ensure_ascii=False) + "\n")
        self.fh.flush()
        self.rows.append(out)


async def _alone(replay: _Replay, todo: list[tuple[Transcript, Todo]], api_key: str | None) -> None:
    """One send at a time: each session's sends in order, after a flush of the cache."""
    can_flush = True
    for t, mine in todo:
        if can_flush:  # the session's cache path from cold; a server without it: warm
            flushed = await flush_cache(replay.client.base_url, api_key=api_key)
            can_flush = flushed["ok"] or flushed["status"] not in (404, 405, 401)
        for key, row, recorded in mine:
            await replay.write(t, row, recorded, await replay.send(t, key, row, recorded))


async def _together(
    replay: _Replay, todo: list[tuple[Transcript, Todo]], api_key: str | None
) -> None:
    """``replay.lanes`` sessions at once, each session's sends in order in one lane, after
    one flush of the cache (a flush empties every session's cache, and SGLang refuses it while
    a request runs). A send that differs, or that the verdict flagged under load, is held and
    re-sent once more alone when the lanes are done: its row is that lone comparison
    (``concurrent_diverged``: whether it differed beside the others), so a send the replay's
    own concurrency disturbed is not called diverged, and a flagged one is not called
    identical on a re-send that met the same fault."""
    await flush_cache(replay.client.base_url, api_key=api_key)
    queue = list(reversed(todo))
    held: list[tuple[Transcript, Mapping[str, Any], Mapping[str, Any], tuple[Any, ...], str]]
    held = []

    async def lane() -> None:
        while queue:
            t, mine = queue.pop()
            for key, row, recorded in mine:
                out = await replay.send(t, key, row, recorded)
                if out["status"] == IDENTICAL and not recorded.get("corrupted"):
                    await replay.write(t, row, recorded, out)
                else:  # (flagged under load: a raced re-send may repeat a raced answer)
                    held.append((t, row, recorded, key, out["status"]))

    await asyncio.gather(*(lane() for _ in range(min(replay.lanes, len(todo)))))
    replay.lanes = 1  # the re-checks: alone
    for t, row, recorded, key, status in sorted(held, key=lambda h: h[3]):
        out = await replay.send(t, key, row, recorded)
        out["concurrent_diverged"] = status != IDENTICAL
        await replay.write(t, row, recorded, out)
