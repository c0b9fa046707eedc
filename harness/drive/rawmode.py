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
from harness.dialects.prompt_v4 import BOS, END_THINK, THINK, render_v4, render_v32
from harness.drive.session import Session
from harness.errors import UsageError
from harness.record.turns import TURNS_FILE, TurnRecord, read_turns
from harness.workload.scenario import Scenario

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
    """The request of ``api`` for ``prompt`` with the chat body's sampling settings.

    ``skip_special_tokens`` is false: the servers default to true and would strip the think
    delimiters and, where they are special tokens, the DSML marks from the text (SGLang's chat
    path turns it off itself when tools are given; the raw paths do not)."""
    sampling = {k: body[k] for k in ("temperature", "max_tokens", "seed") if k in body}
    sampling["skip_special_tokens"] = False
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
    """The client as the sessions see it in raw mode: ``chat(body)`` sends the rendered prompt.

    ``drop_bos``: the server puts its own BOS before a prompt, so the rendered one is left out
    (``check_rendering`` finds out)."""

    def __init__(self, client: ChatClient, api: str, dialect: str, drop_bos: bool = False) -> None:
        check_api(api, dialect)
        self._client = client
        self.api = api
        self.dialect = dialect
        self.drop_bos = drop_bos

    def prompt(self, body: Mapping[str, Any]) -> str:
        prompt = render_prompt(body, self.dialect)
        return prompt.removeprefix(BOS) if self.drop_bos else prompt

    async def chat(self, body: dict[str, Any], *, stream: bool) -> TurnOutput:
        prompt = self.prompt(body)
        payload = raw_payload(self.api, prompt, body)
        out = await self._client.raw(PATHS[self.api], payload, stream=stream)
        return out if out.failure is not None else finish_raw(out, prompt)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)


def probe_body(scenario: Scenario) -> dict[str, Any]:
    """A one-token request of the scenario's first turn (its system prompt, task and tools)."""
    messages: list[dict[str, Any]] = []
    if scenario.system_prompt:
        messages.append({"role": "system", "content": scenario.system_prompt})
    task = scenario.tasks[0] if scenario.tasks else "List the files of the project."
    messages.append({"role": "user", "content": task})
    body: dict[str, Any] = {"messages": messages, "max_tokens": 1, "temperature": 0.0}
    if scenario.tools:
        body["tools"] = scenario.openai_tools()
    return body


async def check_rendering(raw: RawClient, body: dict[str, Any]) -> dict[str, Any]:
    """One turn sent both ways: the server's chat template and the harness's rendering must
    give the same ``prompt_tokens``, or the raw turns are not the chat turns.

    One token more in raw mode, on a prompt that starts with BOS, is the server adding its
    own BOS (a double BOS): ``raw.drop_bos`` is set and the turn sent again without it.
    ``{"ok": True | False | None, "chat_prompt_tokens", "raw_prompt_tokens", "drop_bos",
    "message"}``; None when the two could not be compared.
    """
    chat = await raw._client.chat(body, stream=False)
    out = await raw.chat(body, stream=False)
    result: dict[str, Any] = {
        "chat_prompt_tokens": chat.prompt_tokens,
        "raw_prompt_tokens": out.prompt_tokens,
        "drop_bos": False,
    }
    failed = chat.failure or out.failure
    if failed is not None or chat.prompt_tokens is None or out.prompt_tokens is None:
        why = str(failed) if failed is not None else "no prompt_tokens in the answers"
        return {**result, "ok": None, "message": f"raw mode: the rendering was not checked ({why})"}
    if out.prompt_tokens == chat.prompt_tokens + 1 and raw.prompt(body).startswith(BOS):
        raw.drop_bos = True
        again = await raw.chat(body, stream=False)
        if again.prompt_tokens == chat.prompt_tokens:
            return {**result, "raw_prompt_tokens": again.prompt_tokens, "drop_bos": True,
                    "ok": True, "message": (
                        "raw mode: the server adds its own BOS to a prompt; the harness leaves "
                        "its rendered BOS out (no double BOS)")}  # fmt: skip
        raw.drop_bos = False
    if out.prompt_tokens == chat.prompt_tokens:
        return {**result, "ok": True, "message": (
            f"raw mode: the rendered prompt and the server's chat template agree "
            f"({chat.prompt_tokens} prompt tokens)")}  # fmt: skip
    return {**result, "ok": False, "message": (
        f"raw mode: the prompt the harness renders is {out.prompt_tokens} tokens where the "
        f"server's chat template makes {chat.prompt_tokens} of the same turn: the raw turns are "
        "not what the chat endpoint sends the model (another chat template, system prompt or "
        "tool rendering?); compare runs with trace compare only once they agree")}  # fmt: skip


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
