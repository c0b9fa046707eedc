"""Mistral tool calls: the JSON list of tokenizers v2-v7 (``mistral``) and the compact form of
v11 and later (``mistral-v11``); vLLM and SGLang ``mistral``.

v3 / v7 (SentencePiece) decode as ``[TOOL_CALLS] [{"name": "get_weather", "arguments":
{"city": "A"}, "id": "abc123XYZ"}]``, Tekken (Nemo) as ``[TOOL_CALLS][{…}]``: both are
canonical. v11+ write each call as ``[TOOL_CALLS]get_weather[ARGS]{"city": "A"}``, with
an optional ``[CALL_ID]id`` before ``[ARGS]``. The turn ends with ``</s>``; text may come
before the calls (it is content), not after.

Arguments are a strict JSON object (a JSON-encoded string is accepted as non-canonical in
the list form). Accepted but non-canonical: other whitespace around the markers, no
end-of-turn token. Near misses: a mangled marker (``[TOOL_CALL]``, ``TOOL_CALLS]``), an
``[ARGS]`` outside a call, a list that is not JSON or holds something other than calls,
a compact call without ``[ARGS]`` (SGLang drops it), the other version's form, bad JSON,
text after the calls.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

from harness.dialects.base import ToolCall
from harness.dialects.declare import Versions
from harness.dialects.jsonstrict import StrictJSONError, loads_strict, raw_decode_strict
from harness.dialects.markup import (
    NC_NEWLINES,
    BlockGrammar,
    Fail,
    Scanner,
    Tools,
    Writer,
    next_block,
    skip_ws,
    snippet,
)

TOOL_CALLS, ARGS, CALL_ID = "[TOOL_CALLS]", "[ARGS]", "[CALL_ID]"
EOS = "</s>"
VERSIONS = {"v3": "mistral", "v11": "mistral-v11"}
NC_STRING_ARGS = "arguments as a JSON string"
#: Pieces of markup that do not start with a trigger character (for the stream parser).
HOLDS = ("TOOL_CALLS]",)

_OPENER = re.compile(re.escape(TOOL_CALLS))
FRAGMENT = re.compile(
    r"\[[ \t]?TOOL_?CALLS?[ \t]?\]?|(?<!\[)TOOL_CALLS\]|\[[ \t]?ARGS[ \t]?\]|\[CALL_ID\]"
)
_NAME = re.compile(r"[A-Za-z0-9_.\-]+")
_ID = re.compile(r"[A-Za-z0-9_\-]+")
_KEYS = {"name", "arguments", "id"}


def _decode(body: str, pos: int, what: str, calls: Sequence[ToolCall]) -> tuple[Any, int]:
    try:
        return raw_decode_strict(body, pos)
    except StrictJSONError as exc:
        cut = exc.message.startswith("Unterminated string") and '"' not in body[exc.pos + 1 :]
        if exc.pos >= len(body.rstrip()) or cut:
            raise Fail(f"truncated {what}: JSON cut off", pos, calls) from None
        raise Fail(
            f"{what} is not valid JSON ({exc.kind}: {exc.message})", exc.pos, calls
        ) from None


def _list_call(item: Any, at: int, nc: list[str], calls: list[ToolCall]) -> ToolCall:
    if not isinstance(item, dict):
        raise Fail("an item of the call list is not an object", at, calls)
    extra = set(item) - _KEYS
    if extra:
        raise Fail(f"unexpected keys in a call: {sorted(extra)}", at, calls)
    name = item.get("name")
    if not isinstance(name, str) or not name:
        raise Fail("a call without a string name", at, calls)
    args = item.get("arguments", {})
    if isinstance(args, str):
        nc.append(NC_STRING_ARGS)
        try:
            args = loads_strict(args)
        except StrictJSONError as exc:
            raise Fail(f"arguments string is not valid JSON ({exc.message})", at, calls) from None
    if not isinstance(args, dict):
        raise Fail("arguments are not a JSON object", at, calls)
    if "id" in item and not isinstance(item["id"], str):
        raise Fail("a call id that is not a string", at, calls)
    return ToolCall(name, args)


def _scan_v3(body: str, start: int, nc: list[str], tools: Tools) -> tuple[list[ToolCall], int]:
    p = start + len(TOOL_CALLS)
    q = skip_ws(body, p)
    if body[p:q] not in ("", " "):
        nc.append(NC_NEWLINES)
    if _NAME.match(body, q) and not body.startswith("[", q):
        raise Fail("a v11 call ([TOOL_CALLS]NAME[ARGS]) in a v3 turn", start)
    if not body.startswith("[", q):
        if not body[q:].strip():
            raise Fail("truncated call list", q)
        raise Fail(f"expected a JSON list of calls, found {snippet(body, q)}", q)
    value, end = _decode(body, q, "call list", [])
    if not isinstance(value, list) or not value:
        raise Fail("the call list is empty", q)
    calls: list[ToolCall] = []
    for item in value:
        calls.append(_list_call(item, q, nc, calls))
    return calls, end


def _scan_v11(body: str, start: int, nc: list[str], tools: Tools) -> tuple[list[ToolCall], int]:
    calls: list[ToolCall] = []
    while True:
        p = start + len(TOOL_CALLS)
        q = skip_ws(body, p)
        if q != p:
            nc.append(NC_NEWLINES)
        if body.startswith("[", q):
            raise Fail("a v3 call list in a v11 turn", start, calls)
        m = _NAME.match(body, q)
        if m is None:
            if not body[q:].strip():
                raise Fail("truncated call: no function name", q, calls)
            raise Fail(f"expected a function name, found {snippet(body, q)}", q, calls)
        p = m.end()
        if body.startswith(CALL_ID, p):
            idm = _ID.match(body, p + len(CALL_ID))
            if idm is None:
                raise Fail("[CALL_ID] without an id", p, calls)
            p = idm.end()
        if not body.startswith(ARGS, p):
            if not body[p:].strip() or ARGS.startswith(body[p:]):
                raise Fail("truncated call: no [ARGS]", p, calls)
            raise Fail(f"call {m.group(0)!r} without [ARGS]", p, calls)
        p += len(ARGS)
        q = skip_ws(body, p)
        if q != p:
            nc.append(NC_NEWLINES)
        args, end = _decode(body, q, "arguments", calls)
        if not isinstance(args, dict):
            raise Fail("arguments are JSON but not an object", q, calls)
        calls.append(ToolCall(m.group(0), args))
        if (start := next_block(body, end, TOOL_CALLS, "", nc)) < 0:
            return calls, end


def _write_v3(calls: Sequence[ToolCall]) -> str:
    items = [
        {"name": c.name, "arguments": c.arguments, "id": f"call{i:05d}"}
        for i, c in enumerate(calls)
    ]
    return f"{TOOL_CALLS} {json.dumps(items, ensure_ascii=False)}"


def _write_v11(calls: Sequence[ToolCall]) -> str:
    return "".join(
        f"{TOOL_CALLS}{c.name}{ARGS}{json.dumps(c.arguments, ensure_ascii=False)}" for c in calls
    )


_SCANNERS: dict[str, Scanner] = {"v3": _scan_v3, "v11": _scan_v11}
_WRITERS: dict[str, Writer] = {"v3": _write_v3, "v11": _write_v11}
GRAMMARS = {
    v: BlockGrammar(name, _OPENER, FRAGMENT, _SCANNERS[v], eos=(EOS,), separator="",
                    what="Mistral", write=_WRITERS[v])
    for v, name in VERSIONS.items()
}  # fmt: skip


_V3_LAYOUT = re.compile(r"\[TOOL_CALLS\][ \t]*\[")
_V11_LAYOUT = re.compile(r"\[ARGS\]|\[CALL_ID\]")


#: ``layout``: ``mistral`` when the calls are mostly JSON lists after ``[TOOL_CALLS]``,
#: ``mistral-v11`` when they are mostly ``name[ARGS]{…}``.
#: ``encode(content, calls, version)``: in the v3 list (``v3``) or v11 compact (``v11``) form.
FAMILY = Versions("Mistral version", GRAMMARS, (_V3_LAYOUT, _V11_LAYOUT))
layout, encode = FAMILY.layout, FAMILY.encode

DIALECTS = FAMILY.entries(90, {"v3": ("mistral-v3",)}, holds=HOLDS)
