"""Reading what an endpoint answers: server-sent chat events and raw-text bodies into a
``TurnOutput``.

``LineSplitter`` cuts arbitrary byte chunks into whole lines; ``ChatEvents`` reads an OpenAI
chat stream as its bytes arrive (content, reasoning as SGLang and llama.cpp name it,
``reasoning_content``, or as vLLM does, ``reasoning``; tool-call deltas, the finish reason,
``usage``, in-band errors) with one time stamp per read; ``raw_piece`` reads one
``/v1/completions`` or SGLang ``/generate`` body or event. Each streamed chat event is decoded
by msgspec into the few fields a turn needs (``_Event``); the ids, model names and time stamps
every event repeats are skipped unread.
"""

from __future__ import annotations

import time
from typing import Any

import msgspec
import orjson

from harness.client.output import BadResponse, Failure, TurnOutput


class LineSplitter:
    """Whole lines out of arbitrary byte chunks; a partial last line waits for the rest
    (``size``: its bytes so far, for the caller to bound)."""

    __slots__ = ("pending", "size")

    def __init__(self) -> None:
        self.pending: list[bytes] = []
        self.size = 0

    def lines(self, chunk: bytes) -> list[bytes]:
        cut = chunk.rfind(b"\n")
        if cut < 0:
            self.pending.append(chunk)
            self.size += len(chunk)
            return []
        head = chunk[:cut]
        if self.pending:
            head = b"".join(self.pending) + head
            self.pending.clear()
        self.size = len(chunk) - cut - 1
        if self.size:
            self.pending.append(chunk[cut + 1 :])
        return head.split(b"\n")


class _Function(msgspec.Struct):
    name: str | None = None
    arguments: str | None = None


class _ToolCallDelta(msgspec.Struct):
    index: int | None = None  # None: the server gave none (Mistral's API)
    id: Any = None
    function: _Function | None = None


class _Delta(msgspec.Struct):
    content: str | None = None
    reasoning_content: str | None = None  # SGLang, llama.cpp
    reasoning: str | None = None  # vLLM
    tool_calls: list[_ToolCallDelta] | None = None


class _Choice(msgspec.Struct):
    delta: _Delta | None = None
    finish_reason: str | None = None
    token_ids: Any = None  # vLLM's ``return_token_ids``: this event's generated token ids


class _Event(msgspec.Struct):
    """The fields of one streamed chat event that a turn needs; the rest is skipped unread
    (an event decoded this way costs half of one decoded into dictionaries). A value of a
    shape no server sends (``choices`` that is not a list of objects, a number where the
    text goes, ...) fails the decode: a ``protocol`` failure."""

    choices: list[_Choice] | None = None
    usage: dict[str, Any] | None = None
    error: Any = msgspec.UNSET


_EVENT = msgspec.json.Decoder(_Event)
_DONE = b"data: [DONE]\n\n"
_BETWEEN = b"\n\ndata: "
_NEXT = b"\n\ndata: {"


class ChatEvents:
    """SSE bytes -> the ``TurnOutput``; ``read`` (and ``feed``) return True at ``[DONE]`` or
    an error."""

    __slots__ = (
        "out", "t0", "content", "reasoning", "calls", "last_call", "last", "gaps", "done", "split",
        "ids",
    )  # fmt: skip

    def __init__(self, out: TurnOutput, t0: float) -> None:
        self.out = out
        self.t0 = t0
        self.content: list[str] = []
        self.reasoning: list[str] = []
        self.calls: dict[int, dict[str, Any]] = {}
        self.last_call: int | None = None
        self.last: float | None = None
        self.gaps = 0.0
        self.done = False
        self.split = LineSplitter()
        self.ids: list[Any] | None = None  # the events' token ids, where they carry them

    def read(self, chunk: bytes, now: float) -> bool:
        """One read from the socket, all of it stamped ``now``.

        A read of whole one-line events (``data: {...}`` and the blank line, one or many, as
        servers write them, and the ``[DONE]`` after them) is cut at its blank lines alone: a
        raw newline is never inside a JSON value, so they can only stand between events.
        Anything else is cut into lines (``feed``)."""
        if not self.split.pending and chunk.startswith(b"data: {"):
            if chunk.endswith(b"}\n\n") and chunk.count(b"\n") == 2:  # one event
                return self._events([chunk[6:-2]], now)
            done = chunk.endswith(_DONE)
            body = chunk[: -len(_DONE)] if done else chunk
            # one line per event, each a data line with an object
            if body.endswith(b"}\n\n") and body.count(b"\n") == 2 * body.count(_NEXT) + 2:
                if self._events(body[6:-2].split(_BETWEEN), now):
                    return True
                self.done = done
                return done
        return self.feed(self.split.lines(chunk), now)

    def feed(self, lines: list[bytes], now: float) -> bool:
        """Read whole lines (of one read from the socket), all stamped ``now``."""
        data: list[bytes] = []
        end = None
        for line in lines:
            if not line:
                continue  # the blank line after each event
            if not line.startswith(b"data:"):
                if line.startswith(b"event:") and b"error" in line:
                    end = "error"
                    break
                continue
            if len(line) < 32 and line[5:].strip() == b"[DONE]":
                end = "done"
                break
            data.append(line[5:])  # (JSON allows the space and a CR around the value)
        if self._events(data, now):
            return True  # an in-band error came first
        if end == "error":
            self.out.failure = Failure("stream_error", "error event in the stream")
        elif end == "done":
            self.done = True
        return end is not None

    def _events(self, data: list[bytes], now: float) -> bool:
        """Decode and take the events of one read, in order; True at an in-band error (the
        stream's end: the events after it are not read)."""
        out = self.out
        decode = _EVENT.decode
        content = self.content.append
        reasoning = self.reasoning.append
        got = 0  # events that carried text or a call: all of this read share ``now``
        stop = False
        for raw in data:
            event = decode(raw)
            if event.error is not msgspec.UNSET:
                out.failure = Failure("stream_error", error_text(orjson.dumps(event.error)))
                stop = True
                break
            if event.usage:
                note_usage(out, event.usage)
            for choice in event.choices or ():
                delta = choice.delta
                if delta is not None:
                    carried = False
                    if delta.content:
                        content(delta.content)
                        carried = True
                    thought = delta.reasoning_content or delta.reasoning
                    if thought:
                        reasoning(thought)
                        carried = True
                    if delta.tool_calls:
                        self._calls(delta.tool_calls)
                        carried = True
                    got += carried
                if choice.finish_reason:
                    out.finish_reason = choice.finish_reason
                if isinstance(choice.token_ids, list):
                    if self.ids is None:
                        self.ids = []
                    self.ids.extend(choice.token_ids)
        if got:
            out.events += got
            if self.last is None:
                out.ttft_s = now - self.t0
            else:
                self.gaps += now - self.last
            self.last = now
        return stop

    def _calls(self, deltas: list[_ToolCallDelta]) -> None:
        """Tool-call deltas into their call's slot (by index): id, name and arguments.

        A delta without an index (Mistral's API streams whole calls so, several in one
        event) opens a call of its own when it brings a new id, and else continues the last
        call: read by a default index of 0, parallel calls would be glued into one."""
        for tc in deltas:
            key = self._unindexed(tc.id) if tc.index is None else tc.index
            self.last_call = key
            slot = self.calls.setdefault(key, {"id": None, "name": "", "arguments": ""})
            if tc.id:
                slot["id"] = tc.id
            fn = tc.function
            if fn is not None:
                if fn.name:
                    slot["name"] += fn.name
                if fn.arguments:
                    slot["arguments"] += fn.arguments

    def _unindexed(self, call_id: Any) -> int:
        """The slot of a delta without an index: the last call's, unless a new id opens one."""
        last = self.last_call
        if last is not None and (not call_id or self.calls[last]["id"] in (None, call_id)):
            return last
        return max(self.calls) + 1 if self.calls else 0

    def finish(self) -> None:
        out = self.out
        out.latency_s = time.perf_counter() - self.t0
        out.content = "".join(self.content)
        out.reasoning = "".join(self.reasoning)
        out.tool_calls = [self.calls[i] for i in sorted(self.calls)]
        if self.ids is not None:
            out.token_ids = int_list(self.ids)
        if out.events > 1:
            out.itl_s = self.gaps / (out.events - 1)
        if not self.done and out.failure is None:
            out.failure = Failure("cut", "stream ended before [DONE]")


def note_usage(out: TurnOutput, usage: dict[str, Any] | None) -> None:
    """The server's token counts (OpenAI ``usage``) onto ``out``."""
    if not usage or not isinstance(usage, dict):
        return
    out.prompt_tokens = _count(usage.get("prompt_tokens"))
    out.completion_tokens = _count(usage.get("completion_tokens"))
    details = usage.get("prompt_tokens_details")
    out.cached_tokens = _count(details.get("cached_tokens")) if isinstance(details, dict) else None


def int_list(value: Any) -> list[int] | None:
    """A list of token ids as the server gave it; None for anything else."""
    if isinstance(value, list) and all(
        isinstance(i, int) and not isinstance(i, bool) for i in value
    ):
        return value
    return None


def note_tokens(out: TurnOutput, choice: dict[str, Any]) -> None:
    """A non-streamed choice's generated tokens onto ``out``: ``token_ids`` (vLLM's
    ``return_token_ids``), else the ids of ``logprobs.content`` (llama.cpp), else its token
    strings (SGLang, vLLM)."""
    ids = int_list(choice.get("token_ids"))
    if ids is not None:
        out.token_ids = ids
        return
    logprobs = choice.get("logprobs")
    items = logprobs.get("content") if isinstance(logprobs, dict) else None
    if not isinstance(items, list) or not all(isinstance(i, dict) for i in items):
        return
    ids = int_list([i.get("id") for i in items])
    if ids is not None:
        out.token_ids = ids
    elif all(isinstance(i.get("token"), str) for i in items):
        out.token_strs = [i["token"] for i in items]


def _count(value: Any) -> int | None:
    """A token count as the server gave it; None for anything that is not a count."""
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def raw_piece(doc: Any, out: TurnOutput) -> str:
    """The text of one raw response or event (completions or /generate); usage and finish
    reason noted on ``out``. A document of a shape neither API has: ``BadResponse``."""
    try:
        return _raw_piece(doc, out)
    except (KeyError, TypeError, AttributeError) as exc:
        raise BadResponse(f"not a completion ({type(exc).__name__}: {exc})") from None


def _raw_piece(doc: Any, out: TurnOutput) -> str:
    if isinstance(doc, list):  # /generate answers a batch with a list
        doc = doc[0] if doc else {}
    if not isinstance(doc, dict) or "error" in doc:
        out.failure = Failure("protocol", "an error body: " + error_text(orjson.dumps(doc)))
        return ""
    if "choices" in doc:  # /v1/completions
        if doc.get("usage"):
            note_usage(out, doc["usage"])
        text = ""
        for choice in doc["choices"] or ():
            text += choice.get("text") or ""
            if choice.get("finish_reason"):
                out.finish_reason = choice["finish_reason"]
        return text
    meta = doc.get("meta_info") or {}
    out.prompt_tokens = meta.get("prompt_tokens", out.prompt_tokens)
    out.completion_tokens = meta.get("completion_tokens", out.completion_tokens)
    out.cached_tokens = meta.get("cached_tokens", out.cached_tokens)
    finish = meta.get("finish_reason")
    if isinstance(finish, dict):
        finish = finish.get("type")
    if finish:
        out.finish_reason = str(finish)
    return str(doc.get("text") or "")


def error_text(raw: bytes) -> str:
    """The message of an error body (OpenAI's ``{"error": {"message"}}`` or anything else),
    at most 200 characters."""
    try:
        doc = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return raw[:200].decode("utf-8", "replace")
    if isinstance(doc, dict):
        err = doc.get("error", doc)
        if isinstance(err, dict):
            return str(err.get("message", err))[:200]
        return str(err)[:200]
    return str(doc)[:200]
