"""Raw mode (``--api completions|generate``): the harness renders the prompt and parses the output.

The chat body a session builds is rendered to the exact DeepSeek prompt text
(``prompt_v4.render_v4`` for ``dsml-v4``, ``render_v32`` for ``dsml-v32``) and sent to
``/v1/completions`` (``prompt``, ``max_tokens``, ``temperature``, ``stream``) or SGLang's
``/generate`` (``text``, ``sampling_params``). The answer's text comes back unparsed
(``TurnOutput.source == "raw"``): the session classifies it with ``source="raw"``, so the
tool calls are the harness's own parse of the DSML, not the server's.

Running one workload in both modes tells a server parser failure from model corruption:
``compare_runs`` pairs the turns of a chat run and a raw run and sorts the differences.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from harness import labels as L
from harness.client.chat import ChatClient
from harness.client.output import TurnOutput
from harness.dialects import dsml
from harness.dialects.prompt_v4 import END_THINK, THINK, render_v4, render_v32
from harness.drive.session import Session
from harness.errors import UsageError
from harness.record.turns import TURNS_FILE, TurnRecord, read_turns

log = logging.getLogger(__name__)

APIS = ("chat", "completions", "generate")
PATHS = {"completions": "/v1/completions", "generate": "/generate"}
_RENDERERS = {"dsml-v4": render_v4, "dsml-v32": render_v32}


def check_api(api: str, dialect: str) -> None:
    """A UsageError unless ``api`` can run with the scenario's ``dialect``."""
    if api not in APIS:
        raise UsageError(f"--api {api!r}: use one of {', '.join(APIS)}")
    if api != "chat" and dialect not in _RENDERERS:
        raise UsageError(
            f"--api {api} renders DeepSeek prompts only: the scenario's dialect is {dialect!r}, "
            f"use {' or '.join(_RENDERERS)} (or --api chat)"
        )


def render_prompt(body: Mapping[str, Any], dialect: str) -> str:
    """The prompt text of one chat request body (its messages and tools)."""
    render = _RENDERERS.get(dialect)
    if render is None:
        raise UsageError(f"raw mode cannot render a prompt for dialect {dialect!r}")
    return render(body["messages"], body.get("tools") or None)


def raw_payload(api: str, prompt: str, body: Mapping[str, Any]) -> dict[str, Any]:
    """The request of ``api`` for ``prompt`` with the chat body's sampling settings."""
    sampling = {k: body[k] for k in ("temperature", "max_tokens", "seed") if k in body}
    if api == "completions":
        return {"prompt": prompt, **sampling}
    names = {"max_tokens": "max_new_tokens", "seed": "sampling_seed"}  # SGLang's names
    params = {names.get(k, k): v for k, v in sampling.items()}
    return {"text": prompt, "sampling_params": params}


def finish_raw(out: TurnOutput, prompt: str) -> TurnOutput:
    """Split the reasoning off a thinking-mode output; put back the end-of-turn token that a
    server trims when it stops on it (a stop is a complete turn, not a missing token)."""
    text = out.content
    if prompt.endswith(THINK) and END_THINK in text:
        reasoning, _, text = text.partition(END_THINK)
        out.reasoning = reasoning
    if out.finish_reason == "stop" and text and not text.endswith(dsml.EOS):
        text += dsml.EOS
    out.content = text
    return out


class RawClient:
    """The client as the sessions see it in raw mode: ``chat(body)`` sends the rendered prompt."""

    def __init__(self, client: ChatClient, api: str, dialect: str) -> None:
        check_api(api, dialect)
        self._client = client
        self.api = api
        self.dialect = dialect

    async def chat(self, body: dict[str, Any], *, stream: bool) -> TurnOutput:
        prompt = render_prompt(body, self.dialect)
        payload = raw_payload(self.api, prompt, body)
        out = await self._client.raw(PATHS[self.api], payload, stream=stream)
        return out if out.failure is not None else finish_raw(out, prompt)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)


def visible(out: TurnOutput) -> TurnOutput:
    """The output as the history keeps it: a raw output's content without its DSML block."""
    if out.source != "raw":
        return out
    parsed = dsml.parse(out.content)
    content = parsed.content if parsed.ok else out.content.removesuffix(dsml.EOS)
    return replace(out, content=content)


class RawSession(Session):
    """A session whose outputs are raw text: the history gets the content without markup."""

    def _extend(self, turn: int, out: TurnOutput, calls: list[dict[str, Any]]) -> None:
        super()._extend(turn, visible(out), calls)

    def _follow_up(self, turn: int, out: TurnOutput) -> None:
        super()._follow_up(turn, visible(out))


# ---------------------------------------------------------------- comparing a chat and a raw run

_KEY = ("variant", "repeat", "session", "turn", "attempt")


def _calls(rec: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return [c for c in rec.get("tool_calls") or [] if isinstance(c, Mapping)]


def _empty_args(call: Mapping[str, Any]) -> bool:
    args = call.get("arguments")
    return args in ({}, "", "{}", None)


def judge_pair(chat: Mapping[str, Any], raw: Mapping[str, Any]) -> str:
    """Which side a difference between the same turn in chat and raw mode points at.

    ``server_parser``: the raw text parses clean but the server's answer leaks markup, drops
    calls or empties their arguments. ``model``: the raw text itself is corrupted (whatever
    the server made of it). ``same``: both agree. ``other``: a difference of another kind.
    """
    c_label, r_label = chat.get("label"), raw.get("label")
    if r_label in L.CORRUPTED_LABELS:
        return "model"
    if L.TRANSPORT_ERROR in (c_label, r_label):
        return "other"
    if r_label == L.OK_TOOL_CALL:
        if c_label in (L.PARSER_LEAK, L.MALFORMED_TOOL_CALL, L.INVALID_TOOL_CALL, L.OK_TEXT):
            return "server_parser"
        c_calls, r_calls = _calls(chat), _calls(raw)
        if len(c_calls) < len(r_calls):
            return "server_parser"  # dropped calls
        pairs = zip(c_calls, r_calls, strict=False)
        if any(_empty_args(c) and not _empty_args(r) for c, r in pairs):
            return "server_parser"  # `{}` arguments
    return "same" if c_label == r_label else "other"


def compare_records(chat: Iterable[TurnRecord], raw: Iterable[TurnRecord]) -> dict[str, Any]:
    """Pair the turns of two runs of one workload (same variant, repeat, session, turn,
    attempt) and count what each difference points at."""
    by_key = {tuple(r.get(k) for k in _KEY): r for r in raw}
    verdicts: Counter[str] = Counter()
    pairs: Counter[str] = Counter()
    examples: list[dict[str, Any]] = []
    unpaired = 0
    for rec in chat:
        key = tuple(rec.get(k) for k in _KEY)
        other = by_key.pop(key, None)
        if other is None:
            unpaired += 1
            continue
        verdict = judge_pair(rec, other)
        verdicts[verdict] += 1
        pairs[f"{rec.get('label')} -> {other.get('label')}"] += 1
        if verdict in ("server_parser", "model") and len(examples) < 20:
            examples.append(
                dict(zip(_KEY, key, strict=True), chat=rec.get("label"), raw=other.get("label"))
            )
    paired = sum(verdicts.values())
    return {
        "paired": paired,
        "unpaired": unpaired + len(by_key),
        "verdict": verdict_text(verdicts, paired),
        "verdicts": dict(verdicts),
        "label_pairs": dict(pairs.most_common()),
        "examples": examples,
    }


def verdict_text(verdicts: Mapping[str, int], paired: int) -> str:
    """One sentence: which side the differences between the two runs point at."""
    parser, model = verdicts.get("server_parser", 0), verdicts.get("model", 0)
    if not paired:
        return "nothing to compare: no turn of one run pairs with a turn of the other"
    said = []
    if parser:
        said.append(
            f"the server's tool-call parser: {parser} of {paired} paired turns parse clean from "
            "the raw text but came back broken from the chat endpoint (markup left in the "
            "content, calls lost, empty arguments)"
        )
    if model:
        said.append(
            f"the model: {model} of {paired} paired turns are corrupted in the raw text itself, "
            "whatever a parser makes of it"
        )
    if said:
        return "; and ".join(said)
    other = verdicts.get("other", 0)
    return (
        f"neither the parser nor the model: {verdicts.get('same', 0)} of {paired} paired turns "
        f"agree, {other} differ otherwise (transport errors, different answers)"
    )


def compare_runs(chat_dir: Path, raw_dir: Path) -> dict[str, Any]:
    """``compare_records`` of two run directories' turns.jsonl."""
    return compare_records(read_turns(chat_dir / TURNS_FILE), read_turns(raw_dir / TURNS_FILE))
