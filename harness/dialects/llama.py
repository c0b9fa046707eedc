"""Llama tool calls: Llama 3.x JSON (``llama3-json``; vLLM ``llama3_json``, SGLang ``llama3``)
and Llama 4 pythonic (``llama4-pythonic``; vLLM ``pythonic``/``llama4_pythonic``, SGLang
``pythonic``).

Llama 3.x answers a tool call with the call alone, ``{"name": "get_weather",
"parameters": {"city": "SF"}}<|eot_id|>`` (built-in tools: ``<|python_tag|>
brave_search.call(query="x")<|eom_id|>``). A call turn has no content, so ``encode`` refuses
content next to calls. Accepted but non-canonical: ``<|python_tag|>`` before the JSON,
``arguments`` for ``parameters``, several calls separated by ``;`` (vLLM reads them), no
end-of-turn token. Near misses: text before the call (vLLM drops it, SGLang finds no call),
text after it, bad JSON, a call object with other keys, a mangled ``<|python_tag|>``. Only an
object with ``name`` and ``parameters`` is markup: any other JSON is content.

Llama 4 writes ``[get_weather(city="SF", days=3), get_time()]``, maybe wrapped in
``<|python_start|>…<|python_end|>``, nothing around it, arguments as Python literals
(``True``, ``None``). Near misses: a list that does not parse as Python, positional
arguments, a dotted name, an argument that is not a literal, an unclosed wrapper, text
before or after. A list only counts when the output starts with ``[name(``: prose that
quotes one later is content.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Sequence
from functools import partial
from typing import Any

from harness.dialects.base import ParseResult, ToolCall
from harness.dialects.declare import Entry, MarkupDialect
from harness.dialects.jsonstrict import StrictJSONError, raw_decode_strict
from harness.dialects.markup import (
    NC_NO_EOS,
    NC_TRAILING_WS,
    Fail,
    Tools,
    failed,
    known_version,
    mask_fences,
    parsed,
    skip_ws,
    split_eos,
)

PYTHON_TAG = "<|python_tag|>"
PY_START, PY_END = "<|python_start|>", "<|python_end|>"
EOS3 = ("<|eot_id|>", "<|eom_id|>", "<|end_of_text|>")
EOS4 = ("<|eot|>", "<|eom|>", "<|eot_id|>", "<|end_of_text|>")
VERSIONS = {"json": "llama3-json", "pythonic": "llama4-pythonic"}
NC_PYTHON_TAG = "<|python_tag|> before the JSON"
NC_ARGUMENTS = "arguments instead of parameters"
NC_SEVERAL = "several calls in one turn"

_CALL3 = re.compile(r'(?m)^[ \t]*\{\s*"name"\s*:\s*"[^"\n]*"\s*,\s*"parameters"\s*:')
FRAGMENT3 = re.compile(r"<\|[ \t]?python[_ ]?tag[ \t]?\|?>|<[ \t]?python[_ ]?tag[ \t]?\|>", re.I)
_OPEN3 = re.compile(re.escape(PYTHON_TAG))
_CALL4 = re.compile(r"\A\s*\[\s*[A-Za-z_][\w.]*\(")
FRAGMENT4 = re.compile(
    r"<\|?[ \t]?python[_ ](?:start|end)[ \t]?\|?>|<\|[ \t]?python_(?:start|end)[ \t]?\|?>", re.I
)
_OPEN4 = re.compile(re.escape(PY_START))
_BUILTIN = re.compile(r"([A-Za-z_]\w*)\.call\(")


def _version(version: str) -> str:
    return known_version(version, VERSIONS, "Llama format")


def first_marker(text: str, version: str = "json") -> int:
    masked = mask_fences(split_eos(text, EOS3 if version == "json" else EOS4)[0])
    pats = (
        (_OPEN3, FRAGMENT3, _CALL3) if _version(version) == "json" else (_OPEN4, FRAGMENT4, _CALL4)
    )
    offs = [m.start() for p in pats if (m := p.search(masked))]
    if version == "pythonic" and (m := _CALL4.match(masked)):
        offs.append(skip_ws(masked, m.start()))
    return min(offs) if offs else -1


def telling_marker(text: str) -> int:
    """Where Llama 4 pythonic markup starts when it tells the dialect by itself, else -1: a
    ``<|python_start|>`` wrapper (or a mangled one), or an output that parses whole as a call
    list. A list that does not parse is prose to "auto" (an answer may open with a markdown
    link ``[f(x)](url)``); named, the dialect reads it as a near miss."""
    start = first_marker(text, "pythonic")
    if start < 0:
        return -1
    if FRAGMENT4.search(mask_fences(split_eos(text, EOS4)[0])):
        return start
    return start if _analyse(text, "pythonic", True)[0].ok else -1


def parse(
    text: str, version: str = "json", *, server_content: bool = False, tools: Tools = None
) -> ParseResult:
    """Parse one output as a Llama 3 JSON call (``json``) or a Llama 4 call list (``pythonic``)."""
    return _analyse(text, _version(version), server_content)[0]


def complete_calls(text: str, tools: Tools = None, version: str = "json") -> tuple[ToolCall, ...]:
    if _version(version) == "pythonic":
        return ()  # a list is one expression: its calls are certain only at the end
    return _analyse(text, version, True)[1]


def _analyse(
    text: str, version: str, server_content: bool
) -> tuple[ParseResult, tuple[ToolCall, ...]]:
    name = VERSIONS[version]
    body, eos = split_eos(text, EOS3 if version == "json" else EOS4)
    start = first_marker(body, version)
    if start < 0:
        return ParseResult(content=body, eos=eos), ()
    masked = mask_fences(body)
    exact = (PYTHON_TAG,) if version == "json" else (PY_START, PY_END)
    frags = (FRAGMENT3 if version == "json" else FRAGMENT4).finditer(masked)
    frag = next((f for f in frags if f.group(0) not in exact), None)
    if frag is not None:
        reason = f"mangled {frag.group(0)!r} token"
        return failed(text, reason, frag.start(), name, eos), ()
    if body[:start].strip():
        return failed(text, "text before the tool call", start, name, eos), ()
    nc: list[str] = []
    try:
        if version == "json":
            calls, end = _json_calls(body, start, nc)
        else:
            calls, end = _pythonic(body, start, nc)
    except Fail as exc:
        return failed(text, exc.reason, exc.offset, name, eos), exc.calls
    rest = body[end:]
    if rest.strip():
        return failed(text, "text after the tool call", skip_ws(body, end), name, eos), tuple(calls)
    if rest:
        nc.append(NC_TRAILING_WS)
    if not eos and not server_content:
        nc.append(NC_NO_EOS)
    return parsed("", calls, nc, eos, name), tuple(calls)


# --------------------------------------------------------------------------- Llama 3 JSON


def _json_calls(body: str, p: int, nc: list[str]) -> tuple[list[ToolCall], int]:
    calls: list[ToolCall] = []
    if body.startswith(PYTHON_TAG, p):
        p += len(PYTHON_TAG)
        m = _BUILTIN.match(body, p)
        if m is not None:
            call, end = _python_call(body, p, m.group(1), m.end() - 1)
            return [call], end
        nc.append(NC_PYTHON_TAG)
    while True:
        p = skip_ws(body, p)
        try:
            obj, end = raw_decode_strict(body, p)
        except StrictJSONError as exc:
            if exc.pos >= len(body.rstrip()):
                raise Fail("truncated tool call: JSON cut off", p, calls) from None
            raise Fail(
                f"tool call is not valid JSON ({exc.kind}: {exc.message})", exc.pos, calls
            ) from None
        calls.append(_json_call(obj, p, nc, calls))
        q = skip_ws(body, end)
        if not body.startswith(";", q):
            return calls, end
        nc.append(NC_SEVERAL)
        p = q + 1


def _json_call(obj: Any, at: int, nc: list[str], calls: list[ToolCall]) -> ToolCall:
    if not isinstance(obj, dict):
        raise Fail("tool call is JSON but not an object", at, calls)
    keys = set(obj)
    if keys not in ({"name", "parameters"}, {"name", "arguments"}):
        raise Fail(f"tool call keys {sorted(keys)} (expected name and parameters)", at, calls)
    if "arguments" in obj:
        nc.append(NC_ARGUMENTS)
    name, args = obj["name"], obj.get("parameters", obj.get("arguments"))
    if not isinstance(name, str) or not name:
        raise Fail("tool call without a string name", at, calls)
    if not isinstance(args, dict):
        raise Fail("parameters are not a JSON object", at, calls)
    return ToolCall(name, args)


def _python_call(body: str, start: int, name: str, paren: int) -> tuple[ToolCall, int]:
    """A built-in call ``NAME.call(k=v, ...)`` starting at ``start``."""
    depth, i, quote = 0, paren, ""
    while i < len(body):
        ch = body[i]
        if quote:
            if ch == "\\":
                i += 1
            elif ch == quote:
                quote = ""
        elif ch in "\"'":
            quote = ch
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
            if depth == 0:
                break
        i += 1
    if i >= len(body):
        raise Fail("truncated built-in call", start)
    src = f"f{body[paren : i + 1]}"
    node = _expression(src, start - 1)
    if not isinstance(node, ast.Call):
        raise Fail("malformed built-in call", start)
    return ToolCall(name, _kwargs(node, start, [])), i + 1


# --------------------------------------------------------------------------- Llama 4 pythonic


def _expression(src: str, base: int) -> ast.expr:
    try:
        tree = ast.parse(src, mode="eval")
    except SyntaxError as exc:
        line, col = exc.lineno or 1, (exc.offset or 1) - 1
        off = sum(len(x) + 1 for x in src.split("\n")[: line - 1]) + col
        reason = f"not a valid Python call list ({exc.msg})"
        if off >= len(src.rstrip()) or "never closed" in exc.msg or "unterminated" in exc.msg:
            reason = f"truncated call list ({exc.msg})"
        raise Fail(reason, base + min(off, len(src))) from None
    return tree.body


def _kwargs(call: ast.Call, at: int, calls: list[ToolCall]) -> dict[str, Any]:
    if call.args:
        raise Fail("positional arguments in a call", at + call.args[0].col_offset, calls)
    args: dict[str, Any] = {}
    for kw in call.keywords:
        if kw.arg is None:
            raise Fail("**arguments in a call", at + kw.col_offset, calls)
        if kw.arg in args:
            raise Fail(f"repeated argument {kw.arg!r}", at + kw.col_offset, calls)
        try:
            args[kw.arg] = ast.literal_eval(kw.value)
        except ValueError:
            raise Fail(f"argument {kw.arg!r} is not a literal", at + kw.col_offset, calls) from None
    return args


def _pythonic(body: str, start: int, nc: list[str]) -> tuple[list[ToolCall], int]:
    start = skip_ws(body, start)
    src_start, src_end = start, len(body.rstrip())
    end = src_end
    if body.startswith(PY_START, start):
        src_start = start + len(PY_START)
        close = body.find(PY_END, src_start)
        if close < 0:
            raise Fail(f"{PY_START} not closed by {PY_END}", start)
        src_end, end = close, close + len(PY_END)
    src = body[src_start:src_end]
    node = _expression(src, src_start)
    if not isinstance(node, ast.List) or not node.elts:
        raise Fail("expected a non-empty list of calls", src_start)
    calls: list[ToolCall] = []
    for elt in node.elts:
        at = src_start + elt.col_offset if elt.lineno == 1 else src_start
        if not isinstance(elt, ast.Call):
            raise Fail("an item of the call list is not a call", at, calls)
        if isinstance(elt.func, ast.Attribute):
            raise Fail("a dotted function name", at, calls)
        if not isinstance(elt.func, ast.Name):
            raise Fail("a call whose function is not a name", at, calls)
        calls.append(ToolCall(elt.func.id, _kwargs(elt, src_start, calls)))
    return calls, end


def _py(value: Any) -> str:
    if isinstance(value, bool) or value is None:
        return repr(value)
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, list):
        return "[" + ", ".join(_py(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_py(str(k))}: {_py(v)}" for k, v in value.items()) + "}"
    raise ValueError(f"cannot write {type(value).__name__} as a Python literal")


def encode(content: str, calls: Sequence[ToolCall], version: str = "json") -> str:
    """The canonical output. Llama writes a call turn with no text: content with calls
    is refused (ValueError)."""
    _version(version)
    if not calls:
        return content + ("<|eot_id|>" if version == "json" else "<|eot|>")
    if content:
        raise ValueError("a Llama tool-call turn holds the calls alone, no content")
    if version == "json":
        return (
            "; ".join(
                json.dumps({"name": c.name, "parameters": c.arguments}, ensure_ascii=False)
                for c in calls
            )
            + "<|eot_id|>"
        )
    items = []
    for c in calls:
        bad = [k for k in c.arguments if not k.isidentifier()]
        if bad:
            raise ValueError(f"argument names {bad} cannot be Python keywords")
        items.append(
            f"{c.name}(" + ", ".join(f"{k}={_py(v)}" for k, v in c.arguments.items()) + ")"
        )
    return "[" + ", ".join(items) + "]<|eot|>"


def _dialect(version: str, tokens: re.Pattern[str]) -> MarkupDialect:
    return MarkupDialect(
        VERSIONS[version],
        partial(first_marker, version=version),
        partial(parse, version=version),
        partial(encode, version=version),
        partial(complete_calls, version=version),
        tokens=tokens,
    )


DIALECTS = (
    Entry(_dialect("json", FRAGMENT3), rank=100, auto=True,
          aliases=("llama3_json", "llama4_json", "llama3")),
    # (auto only where the markup tells: an answer opening with a link "[f(x)](url)" looks
    # alike)
    Entry(_dialect("pythonic", FRAGMENT4), rank=101, auto=True,
          aliases=("pythonic", "llama4_pythonic"), auto_marker=telling_marker),
)  # fmt: skip
