"""Recorded conversations (traces): the file format, validation, and a converter from request logs.

A trace file is JSONL, one conversation per line::

    {"id": "conv-17",                      # optional; defaults to the line number
     "messages": [...],                    # OpenAI chat messages: system, user, assistant
                                           # (with tool_calls), tool (with tool_call_id)
     "tools": [...],                       # optional OpenAI tool definitions
     "offsets_s": [0.0, 4.2, ...]}         # optional: when each assistant turn was requested,
                                           # seconds from the conversation's start

Each assistant message is one recorded turn: its request is the history before it.

A request log (what a logging proxy writes: one request per line, ``{"request": {"messages",
"tools"}, "response"?: {...}, "time"?: seconds}`` or just ``{"messages", "tools"}``) becomes a
trace with ``convert_log``: requests whose messages extend an earlier request's messages are
turns of the same conversation.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.errors import ConfigError

_ROLES = {"system", "user", "assistant", "tool", "developer"}


@dataclass(frozen=True)
class RecordedTurn:
    index: int  # the assistant message's index in the conversation
    history: tuple[dict[str, Any], ...]  # the messages sent for this turn
    recorded: dict[str, Any]  # the assistant message that was recorded
    offset_s: float | None = None


@dataclass(frozen=True)
class Conversation:
    id: str
    messages: tuple[dict[str, Any], ...]
    tools: tuple[dict[str, Any], ...] = ()
    offsets_s: tuple[float, ...] = field(default=())

    def turns(self) -> list[RecordedTurn]:
        out: list[RecordedTurn] = []
        for i, msg in enumerate(self.messages):
            if msg.get("role") == "assistant":
                k = len(out)
                offset = self.offsets_s[k] if k < len(self.offsets_s) else None
                out.append(RecordedTurn(i, self.messages[:i], msg, offset))
        return out


def _check_messages(messages: Any, where: str) -> tuple[dict[str, Any], ...]:
    if not isinstance(messages, list) or not messages:
        raise ConfigError(f"{where}: 'messages' must be a non-empty list of chat messages")
    for j, msg in enumerate(messages):
        if not isinstance(msg, dict) or msg.get("role") not in _ROLES:
            raise ConfigError(
                f"{where}: messages[{j}] needs a 'role' of {', '.join(sorted(_ROLES))}"
            )
        if msg["role"] == "tool" and "tool_call_id" not in msg:
            raise ConfigError(f"{where}: messages[{j}] is a tool message without 'tool_call_id'")
    return tuple(messages)


#: the latest a recorded turn may be sent, in seconds from its conversation's start (a day)
MAX_OFFSET_S = 86_400.0


def parse_conversation(doc: Any, where: str, default_id: str) -> Conversation:
    if not isinstance(doc, dict):
        raise ConfigError(f"{where}: each line must be a JSON object with 'messages'")
    messages = _check_messages(doc.get("messages"), where)
    if not any(m["role"] == "assistant" for m in messages):
        raise ConfigError(f"{where}: the conversation has no assistant turn to replay")
    tools = doc.get("tools") or []
    if not isinstance(tools, list):
        raise ConfigError(f"{where}: 'tools' must be a list of OpenAI tool definitions")
    offsets = doc.get("offsets_s") or []
    if not isinstance(offsets, list) or not all(
        isinstance(x, int | float) and not isinstance(x, bool) for x in offsets
    ):
        raise ConfigError(f"{where}: 'offsets_s' must be a list of numbers")
    for x in offsets:
        if not 0 <= x <= MAX_OFFSET_S:  # (NaN fails this too)
            raise ConfigError(
                f"{where}: 'offsets_s' holds {x!r}: each offset is seconds from the start of "
                f"the conversation, 0 to {MAX_OFFSET_S:g}"
            )
    return Conversation(
        str(doc.get("id", default_id)), messages, tuple(tools), tuple(float(x) for x in offsets)
    )


def load_trace(path: Path) -> list[Conversation]:
    """Read a trace file; a bad line is a ConfigError naming the file and line."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise ConfigError(f"{path}: workload file not found") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the workload file ({exc.strerror})") from None
    try:
        lines = data.decode("utf-8").splitlines()
    except UnicodeDecodeError as exc:
        lineno = data.count(b"\n", 0, exc.start) + 1
        raise ConfigError(
            f"{path}:{lineno}: not UTF-8 (byte {exc.start} of the file); a workload file is "
            "UTF-8 JSON lines"
        ) from None
    out = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{path}:{n}"
        out.append(parse_conversation(_json_line(line, where), where, f"line-{n}"))
    if not out:
        raise ConfigError(f"{path}: no conversation in the file")
    return out


def _json_line(line: str, where: str) -> Any:
    """One line's JSON value; ``ConfigError`` naming ``where`` when it cannot be read."""
    try:
        return json.loads(line)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{where}: not valid JSON ({exc.msg})") from None
    except RecursionError:
        raise ConfigError(f"{where}: JSON nested too deep to read") from None


def _request_of(
    doc: dict[str, Any],
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], dict[str, Any] | None, float | None]:
    req = doc.get("request", doc)
    resp = doc.get("response")
    message = None
    if isinstance(resp, dict):
        choices = resp.get("choices") or []
        message = choices[0].get("message") if choices else resp.get("message")
    t = doc.get("time")
    return list(req.get("messages") or []), list(req.get("tools") or []), message, t


def convert_log(lines: Iterable[str]) -> Iterator[dict[str, Any]]:
    """Group logged requests into conversations (trace lines).

    A request continues the open conversation whose last request's messages are a prefix of
    its own; the recorded response, when logged, is kept as the assistant turn. Requests
    without a logged response get their assistant turn from the next request's history.
    """
    open_convs: list[dict[str, Any]] = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        messages, tools, answer, t = _request_of(_json_line(line, f"log line {n}"))
        _check_messages(messages, f"log line {n}")
        conv = next(
            (
                c
                for c in reversed(open_convs)
                if len(c["last"]) < len(messages) and messages[: len(c["last"])] == c["last"]
            ),
            None,
        )
        if conv is None:
            conv = {
                "id": f"conv-{len(open_convs) + 1}",
                "messages": [],
                "tools": tools,
                "offsets_s": [],
                "t0": t,
                "last": [],
            }
            open_convs.append(conv)
        conv["messages"] = list(messages)
        if answer is not None:
            conv["messages"].append({k: v for k, v in answer.items() if v is not None})
        conv["last"] = list(messages)
        if t is not None and conv["t0"] is not None:
            conv["offsets_s"].append(round(float(t) - float(conv["t0"]), 3))
    for conv in open_convs:
        # a request without a logged answer: its answer is the next request's assistant turn
        trace = {"id": conv["id"], "messages": conv["messages"], "tools": conv["tools"]}
        if conv["offsets_s"]:
            trace["offsets_s"] = conv["offsets_s"]
        if any(m.get("role") == "assistant" for m in trace["messages"]):
            yield trace
