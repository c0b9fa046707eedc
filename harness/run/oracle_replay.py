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
evicted under load. The comparison is of the text (reasoning, content, tool-call names and
arguments; call ids are left out): the chat endpoint returns no token ids by default, so the
first differing position is a character offset.

Rows go to ``oracle_replay.jsonl`` keyed like confirm.jsonl: ``status`` is ``identical``,
``diverged`` (with ``position`` and the text around it on both sides) or ``undecided`` (a
transport failure on either side). ``exact`` says whether the server declared a deterministic
mode (analysis.oracles reads it).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from harness.analysis import variantcheck
from harness.analysis.confirm import ROW_KEY, row_key
from harness.client.chat import ChatClient
from harness.errors import UsageError
from harness.record.rundir import ORACLE_REPLAY_FILE, TRANSCRIPTS_FILE
from harness.record.transcripts import Transcript, load_transcripts
from harness.record.turns import read_rows
from harness.run.replay import resend
from harness.target.metrics import flush_cache

log = logging.getLogger(__name__)

IDENTICAL, DIVERGED, UNDECIDED = "identical", "diverged", "undecided"
AROUND = 40  # characters of text shown before and after the first difference


def check_sampling(temperature: float, seeded: bool, what: str = "the scenario") -> None:
    """``--oracle replay`` needs the same sampling alone as under load: greedy or seeded."""
    if temperature > 0 and not seeded:
        raise UsageError(
            f"--oracle replay needs deterministic sampling: {what} samples at temperature "
            f"{temperature:g} without a fixed seed; use temperature 0 or a seeded workload"
        )


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


def first_difference(a: str, b: str) -> int | None:
    """The first position where ``a`` and ``b`` differ (None: identical)."""
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


async def replay_oracle_variant(
    client: ChatClient,
    run_dir: Path,
    run_id: str,
    variant: str,
    repeat: int,
    sample: Sample,
    *,
    declared: bool = False,
    api_key: str | None = None,
) -> list[dict[str, Any]]:
    """Re-send the sampled sends of (variant, repeat) alone; append oracle_replay.jsonl."""
    path = run_dir / ORACLE_REPLAY_FILE
    done = {row_key(r) for r in read_rows(path)}
    exact, why = _exact(run_dir, variant, repeat, declared)
    transcripts = load_transcripts(run_dir / TRANSCRIPTS_FILE)
    rows: list[dict[str, Any]] = []
    can_flush = True
    with open(path, "a", encoding="utf-8") as fh:  # noqa: ASYNC230 - a local file
        for (v, r, session), t in sorted(transcripts.items()):
            if (v, r) != (variant, repeat):
                continue
            todo = []
            for row in t.rows:
                key = (v, r, session, row["turn"], row["attempt"])
                recorded = row.get("response") or {}
                if wanted(key, recorded, done, sample):
                    todo.append((key, row, recorded))
            if not todo:
                continue
            if can_flush:  # the session's cache path from cold; a server without it: warm
                flushed = await flush_cache(client.base_url, api_key=api_key)
                can_flush = flushed["ok"] or flushed["status"] not in (404, 405, 401)
            for key, row, recorded in todo:
                got = await resend(client, t, row["seq"])
                out: dict[str, Any] = {"run_id": run_id, **dict(zip(ROW_KEY, key, strict=True))}
                out.update(
                    exact=exact,
                    exact_reason=why,
                    compared="text",
                    loaded_label=recorded.get("label"),
                    loaded_corrupted=bool(recorded.get("corrupted")),
                    sim_injected=recorded.get("sim_injected"),
                    prompt_tokens=recorded.get("prompt_tokens"),
                    alone_label=got.verdict.label,
                )
                if got.failed:
                    out.update(status=UNDECIDED, error=str(got.out.failure))
                else:
                    loaded = output_text(recorded)
                    alone = output_text(
                        {"reasoning": got.out.reasoning, "content": got.out.content,
                         "tool_calls": got.out.tool_calls}
                    )  # fmt: skip
                    pos = first_difference(loaded, alone)
                    out["status"] = IDENTICAL if pos is None else DIVERGED
                    if pos is not None:
                        lo = max(0, pos - AROUND)
                        out.update(
                            position=pos,
                            loaded_text=loaded[lo : pos + AROUND],
                            alone_text=alone[lo : pos + AROUND],
                        )
                fh.write(json.dumps(out, ensure_ascii=False) + "\n")
                fh.flush()
                rows.append(out)
    return rows
