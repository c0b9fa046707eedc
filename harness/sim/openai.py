"""OpenAI-compatible response bodies and stream chunks, shaped like SGLang's."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from harness.dialects.base import ToolCall


def usage(prompt: int, completion: int, cached: int | None) -> dict[str, Any]:
    """OpenAI ``usage``; ``cached`` None: no ``prompt_tokens_details`` (as SGLang without
    ``--enable-cache-report``, vLLM without ``--enable-prompt-tokens-details``)."""
    out: dict[str, Any] = {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": None,
    }
    if cached is not None:
        out["prompt_tokens_details"] = {"cached_tokens": cached}
    return out


def tool_calls_json(calls: Sequence[ToolCall], ids: Sequence[str]) -> list[dict[str, Any]]:
    return [
        {
            "id": call_id,
            "type": "function",
            "function": {"name": call.name, "arguments": arguments(call)},
        }
        for call, call_id in zip(calls, ids, strict=True)
    ]


def arguments(call: ToolCall) -> str:
    """The arguments as SGLang serializes them (``json.dumps``, non-ASCII kept)."""
    return json.dumps(call.arguments, ensure_ascii=False)


@dataclass(frozen=True)
class Answer:
    """A whole answer: its message's parts (a call's id beside each call) and why it ended."""

    content: str | None
    calls: Sequence[ToolCall]
    ids: Sequence[str]
    finish_reason: str
    reasoning: str = ""


def completion(
    rid: str, created: int, model: str, answer: Answer, use: dict[str, Any]
) -> dict[str, Any]:
    message: dict[str, Any] = {
        "role": "assistant",
        "content": answer.content,
        "reasoning_content": answer.reasoning or None,
        "tool_calls": tool_calls_json(answer.calls, answer.ids) if answer.calls else None,
    }
    return {
        "id": rid,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": message,
                "logprobs": None,
                "finish_reason": answer.finish_reason,
                "matched_stop": None,
            }
        ],
        "usage": use,
    }


def pieces(text: str, size: int) -> Iterator[str]:
    for i in range(0, len(text), size):
        yield text[i : i + size]


def deltas(
    content: str | None,
    calls: Sequence[ToolCall],
    ids: Sequence[str],
    chunk_chars: int,
    reasoning: str = "",
) -> Iterator[tuple[dict[str, Any], int]]:
    """(delta, characters of output it carries) in stream order, after the role delta: the
    reasoning first (SGLang's ``reasoning_content``), then the content, then the calls."""
    for piece in pieces(reasoning, chunk_chars):
        yield {"reasoning_content": piece}, len(piece)
    for piece in pieces(content or "", chunk_chars):
        yield {"content": piece}, len(piece)
    for index, (call, call_id) in enumerate(zip(calls, ids, strict=True)):
        head = {
            "index": index,
            "id": call_id,
            "type": "function",
            "function": {"name": call.name, "arguments": ""},
        }
        yield {"tool_calls": [head]}, len(call.name) + 8
        for piece in pieces(arguments(call), chunk_chars):
            yield {"tool_calls": [{"index": index, "function": {"arguments": piece}}]}, len(piece)


def chunk(
    rid: str,
    created: int,
    model: str,
    delta: dict[str, Any] | None,
    finish_reason: str | None = None,
    use: dict[str, Any] | None = None,
    extra: dict[str, Any] | None = None,
) -> bytes:
    body: dict[str, Any] = {
        "id": rid,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "choices": []
        if delta is None
        else [
            {
                "index": 0,
                "delta": delta,
                "logprobs": None,
                "finish_reason": finish_reason,
                **(extra or {}),
            }
        ],
        "usage": use,
    }
    return b"data: " + orjson.dumps(body) + b"\n\n"


DONE = b"data: [DONE]\n\n"


def error(message: str, code: int = 400, kind: str = "BadRequestError") -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "code": code, "param": None}}
