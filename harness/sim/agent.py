"""The scripted agent "model": writes the next assistant turn from the conversation.

Deterministic from the RNG it is given (seeded from the server seed and the conversation
hash). With tools declared it follows a plan: the first user message asks for "about N steps"
(12 if it does not say), each assistant turn calls one or two tools (the first call lists the
root when a listing tool exists), and after N tool-call turns it answers in prose. Without
tools it answers in prose.
"""

from __future__ import annotations

import random
import re
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from harness.dialects.base import ToolCall
from harness.sim import phrases
from harness.sim.args import ArgMaker, Seen, is_list_tool, is_path_param
from harness.sim.cache import Prompt, content_text

DEFAULT_STEPS = 12
_STEPS = re.compile(r"(\d+)\s+steps", re.I)
_PATH = re.compile(
    r"(?<![\w/.:-])(?:\./)?(?:[A-Za-z0-9_][A-Za-z0-9_.-]*/)+[A-Za-z0-9_][A-Za-z0-9_.-]*"
)
_IDENT = re.compile(
    r"\b(?:[a-z][a-z0-9]+(?:_[a-z0-9]+)+|[A-Z][a-z0-9]+(?:[A-Z][a-z0-9]+)+"
    r"|[a-z]+(?:[A-Z][a-z0-9]+)+)\b"
)
_BAD = re.compile(r"dsml|\uff5c|[<>]", re.I)
#: an in-band passkey (harness.workload.passkeys): planted as "PASSKEY: pk-...", asked back
#: as "call TOOL with the passkey"
_PASSKEY = re.compile(r"PASSKEY: (pk-[0-9a-f]+)")
_ASK = re.compile(r"call (\w+) with the passkey")
_PER_MESSAGE = 60


@dataclass(frozen=True)
class Tool:
    name: str
    parameters: Mapping[str, Any]


@dataclass(frozen=True)
class Turn:
    """What the agent writes: ``calls`` empty for a prose answer."""

    content: str
    calls: tuple[ToolCall, ...]
    kind: str  # "calls" | "final" | "chat"


def parse_tools(tools: Any) -> list[Tool]:
    """Declared OpenAI tools -> (name, parameters schema); malformed entries are skipped."""
    out: list[Tool] = []
    if not isinstance(tools, list):
        return out
    for tool in tools:
        fn = tool.get("function") if isinstance(tool, Mapping) else None
        if isinstance(fn, Mapping) and isinstance(fn.get("name"), str):
            params = fn.get("parameters")
            out.append(Tool(fn["name"], params if isinstance(params, Mapping) else {}))
    return out


def extract(text: str) -> tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]:
    """(files, dirs, identifiers) mentioned in one tool result, first-seen order."""
    files: dict[str, None] = {}
    dirs: dict[str, None] = {}
    for m in _PATH.finditer(text):
        p = m.group(0).rstrip(".")
        if len(p) > 120 or "//" in p or _BAD.search(p):
            continue
        last = p.rsplit("/", 1)[-1]
        (files if "." in last.strip(".") else dirs)[p.removeprefix("./")] = None
        if len(files) + len(dirs) >= _PER_MESSAGE:
            break
    idents: dict[str, None] = {}
    for m in _IDENT.finditer(text):
        word = m.group(0)
        if len(word) <= 40 and not _BAD.search(word):
            idents[word] = None
            if len(idents) >= _PER_MESSAGE:
                break
    return tuple(files), tuple(dirs), tuple(idents)


class Agent:
    """Writes turns; memoizes what each tool result mentions (keyed by prefix hash)."""

    def __init__(self, memo_size: int = 50_000) -> None:
        self._memo: OrderedDict[bytes, tuple[tuple[str, ...], ...]] = OrderedDict()
        self._memo_size = memo_size

    def _facts(self, key: bytes, text: str) -> tuple[tuple[str, ...], ...]:
        facts = self._memo.get(key)
        if facts is None:
            facts = extract(text)
            self._memo[key] = facts
            if len(self._memo) > self._memo_size:
                self._memo.popitem(last=False)
        return facts

    def seen(self, messages: Sequence[Mapping[str, Any]], prompt: Prompt) -> Seen:
        seen = Seen()
        first_user = True
        for i, message in enumerate(messages):
            role = message.get("role")
            if role == "assistant":
                for call in message.get("tool_calls") or ():
                    fn = call.get("function") if isinstance(call, Mapping) else None
                    if isinstance(fn, Mapping):
                        _collect_used(fn.get("arguments"), seen.used)
                continue
            if role == "user" and first_user:
                first_user = False
                continue
            if role not in ("tool", "user"):
                continue
            text = content_text(message.get("content"))
            files, dirs, idents = self._facts(prompt.chain[i + 1], text)
            for pool, new in ((seen.files, files), (seen.dirs, dirs), (seen.identifiers, idents)):
                pool.extend(new)
        for pool in (seen.files, seen.dirs, seen.identifiers):
            pool[:] = list(dict.fromkeys(reversed(pool)))[::-1]  # keep the latest position
        return seen

    def next_turn(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Tool],
        prompt: Prompt,
        rng: random.Random,
    ) -> Turn:
        task = next(
            (content_text(m.get("content")) for m in messages if m.get("role") == "user"), ""
        )
        if not tools:
            users = [m for m in messages if m.get("role") == "user"]
            last = content_text(users[-1].get("content")) if users else ""
            return Turn(phrases.chat_answer(rng, last), (), "chat")
        asked = _asked(messages, tools)
        if asked is not None:
            return Turn(phrases.preamble(rng, [asked], Seen()), (asked,), "calls")
        m = _STEPS.search(task)
        steps = int(m.group(1)) if m else DEFAULT_STEPS
        done = sum(1 for m in messages if m.get("role") == "assistant" and m.get("tool_calls"))
        seen = self.seen(messages, prompt)
        if done >= steps:
            return Turn(phrases.final_answer(rng, seen, done), (), "final")
        maker = ArgMaker(rng, seen)
        calls = [self._first_call(tools, maker) if done == 0 else None]
        if calls[0] is None:
            calls[0] = self._call(rng.choices(tools, [_weight(t, seen) for t in tools])[0], maker)
        if done > 0 and rng.random() < 0.2:
            calls.append(self._call(rng.choice(tools), maker))
        final = [c for c in calls if c is not None]
        return Turn(phrases.preamble(rng, final, seen), tuple(final), "calls")

    def _first_call(self, tools: Sequence[Tool], maker: ArgMaker) -> ToolCall | None:
        for tool in tools:
            if not is_list_tool(tool.name):
                continue
            props = tool.parameters.get("properties") or {}
            keys = [k for k, s in props.items() if isinstance(s, Mapping) and is_path_param(k, s)]
            if keys:
                args = maker.arguments(tool.name, tool.parameters)
                args[keys[0]] = "."
                return ToolCall(tool.name, args)
        return None

    def _call(self, tool: Tool, maker: ArgMaker) -> ToolCall:
        return ToolCall(tool.name, maker.arguments(tool.name, tool.parameters))


def _asked(messages: Sequence[Mapping[str, Any]], tools: Sequence[Tool]) -> ToolCall | None:
    """The call that answers a passkey ask in the last tool result, recalling the passkey
    planted earlier in the conversation (what a healthy cache lets the model read)."""
    if not messages or messages[-1].get("role") != "tool":
        return None
    ask = _ASK.search(content_text(messages[-1].get("content"))[-300:])
    if ask is None or ask.group(1) not in {t.name for t in tools}:
        return None
    for message in messages:
        if message.get("role") == "tool":
            m = _PASSKEY.search(content_text(message.get("content")))
            if m:
                return ToolCall(ask.group(1), {"passkey": m.group(1)})
    return ToolCall(ask.group(1), {"passkey": "unknown"})


def _weight(tool: Tool, seen: Seen) -> float:
    name = tool.name.lower()
    fresh_files = bool(seen.unused(seen.files))
    if re.search(r"read|open|view|cat|get", name):
        return 4.0 if fresh_files else 1.0
    if re.search(r"search|grep|find", name):
        return 2.0
    if is_list_tool(name):
        return 1.0 if fresh_files else 2.5
    return 1.0


def _collect_used(arguments: Any, used: set[str]) -> None:
    if isinstance(arguments, str):
        try:
            arguments = orjson.loads(arguments) if arguments else {}
        except orjson.JSONDecodeError:
            return
    if isinstance(arguments, Mapping):
        for value in arguments.values():
            if isinstance(value, str):
                used.add(value)
            elif isinstance(value, list):
                used.update(v for v in value if isinstance(v, str))
