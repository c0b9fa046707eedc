"""gpt-oss Harmony messages (vLLM ``openai``, SGLang ``gpt-oss``).

The prompt ends ``<|start|>assistant``; the model writes messages, the first one without
its ``<|start|>assistant``::

    <|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant<|channel|>commentary
    to=functions.get_weather <|constrain|>json<|message|>{"location":"SF"}<|call|>

(one line in the output). ``analysis`` is reasoning (not content); ``commentary`` without a
recipient is a preamble the user sees (content); ``commentary to=functions.NAME`` is a call,
JSON arguments, ended by ``<|call|>``; ``final`` is the answer, ended by ``<|return|>``.
``<|call|>`` and ``<|return|>`` stop generation: one call per completion (``MAX_CALLS``),
nothing after it.

Accepted but non-canonical: the recipient in the role header (``<|start|>assistant
to=functions.f<|channel|>commentary``), a recipient without ``functions.``, no
``<|constrain|>json`` (or a bare ``json`` content type), whitespace between messages, a
repeated ``<|start|>assistant`` on the first message, a final message ended by ``<|end|>``,
and no stop token (servers strip it). Near misses: a mangled token (``<|channel>``,
``|message|``), ``to=functions.`` with the tokens lost (what a leak with special tokens
skipped looks like), a malformed header, an unknown channel, bad JSON arguments, a message
cut off, text after the call or the answer, text before the first message.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence

from harness.dialects.base import ParseResult, ToolCall
from harness.dialects.declare import Entry, MarkupDialect
from harness.dialects.jsonstrict import StrictJSONError, loads_strict
from harness.dialects.markup import (
    NC_NO_EOS,
    NC_TRAILING_WS,
    Fail,
    Tools,
    failed,
    mask_fences,
    parsed,
    skip_ws,
)

NAME = "gpt-oss"
MAX_CALLS = 1
START, END, MESSAGE, CHANNEL = "<|start|>", "<|end|>", "<|message|>", "<|channel|>"
CONSTRAIN, RETURN, CALL = "<|constrain|>", "<|return|>", "<|call|>"

NC_ROLE_RECIPIENT = "recipient in the role header"
NC_BARE_RECIPIENT = "recipient without functions."
NC_NO_CONSTRAIN = "no <|constrain|>json"
NC_BETWEEN = "whitespace between messages"
NC_REPEATED_ROLE = "<|start|>assistant on the first message"
NC_FINAL_END = "final message ended by <|end|>"

_WORDS = "start|end|message|channel|constrain|return|call"
_TOKEN = re.compile(rf"<\|(?:{_WORDS})\|>")
FRAGMENT = re.compile(
    rf"<\|[ \t]?(?:{_WORDS})[ \t]?\|?>|<[ \t]?(?:{_WORDS})[ \t]?\|>"
    rf"|(?<!<)\|(?:{_WORDS})\|"
    r"|to=functions\.",
    re.IGNORECASE,
)
_HEADER = re.compile(
    r"(?: to=(?P<r1>[^\s<]+))?<\|channel\|>(?P<ch>[A-Za-z_]+)(?: to=(?P<r2>[^\s<]+))?"
    r"(?:(?P<sp> ?)<\|constrain\|>(?P<ct>[A-Za-z_]+)| (?P<bare>json))?[ ]?"
)
_ENDS = re.compile(r"<\|(end|call|return)\|>")


def first_marker(text: str) -> int:
    masked = mask_fences(text, _TOKEN)
    offs = [m.start() for m in (_TOKEN.search(masked), FRAGMENT.search(masked)) if m]
    return min(offs) if offs else -1


def parse(text: str, *, server_content: bool = False, tools: Tools = None) -> ParseResult:
    """Parse one gpt-oss output (raw text, or a server's content) as Harmony messages."""
    return _analyse(text, server_content)[0]


def complete_calls(text: str, tools: Tools = None) -> tuple[ToolCall, ...]:
    """The call, once its ``<|call|>`` is there (or was parsed before a later error)."""
    return _analyse(text, True)[1]


def _analyse(text: str, server_content: bool) -> tuple[ParseResult, tuple[ToolCall, ...]]:
    masked = mask_fences(text, _TOKEN)
    tok = _TOKEN.search(masked)
    frag = FRAGMENT.search(masked, 0, tok.start() if tok else len(masked))
    if frag is not None:
        reason = f"Harmony-like token {frag.group(0)!r} outside a well-formed message"
        return failed(text, reason, frag.start(), NAME), ()
    if tok is None:
        return ParseResult(content=text), ()
    if text[: tok.start()].strip():
        return failed(text, "text before the first Harmony message", tok.start(), NAME), ()
    nc: list[str] = []
    if tok.start():
        nc.append(NC_BETWEEN)
    try:
        content, calls, eos = _messages(text, tok.start(), nc, server_content)
    except Fail as exc:
        return failed(text, exc.reason, exc.offset, NAME), exc.calls
    result = parsed(content, calls, nc, eos, NAME)
    return result, result.calls if eos else ()  # a call is certain once <|call|> is seen


def _messages(
    text: str, pos: int, nc: list[str], server_content: bool
) -> tuple[str, list[ToolCall], bool]:
    pieces: list[str] = []
    first = True
    while True:
        if text.startswith(START, pos):
            p = pos + len(START)
            if not text.startswith("assistant", p):
                raise Fail("a message whose role is not assistant", p)
            p += len("assistant")
            if first:
                nc.append(NC_REPEATED_ROLE)
        elif first:
            p = pos
        else:
            raise Fail(f"expected {START}assistant (a new message)", pos)
        first = False
        mi = text.find(MESSAGE, p)
        stray = _TOKEN.search(text, p, mi if mi >= 0 else len(text))
        if stray is not None and stray.group(0) not in (CHANNEL, CONSTRAIN):
            raise Fail(f"message header broken by {stray.group(0)}", stray.start())
        if mi < 0:
            raise Fail("truncated message: header without <|message|>", p)
        header = _HEADER.fullmatch(text, p, mi)
        if header is None:
            raise Fail(f"malformed message header {text[p:mi]!r}", p)
        channel = header.group("ch")
        recipient = header.group("r1") or header.group("r2")
        if header.group("r1"):
            nc.append(NC_ROLE_RECIPIENT)
        body_start = mi + len(MESSAGE)
        inner = _TOKEN.search(text, body_start)
        end = _ENDS.search(text, body_start)
        if inner is not None and (end is None or inner.start() < end.start()):
            raise Fail(f"message not ended before {inner.group(0)}", inner.start())
        body = text[body_start : end.start() if end else len(text)]
        how = end.group(1) if end else ""
        after = end.end() if end else len(text)
        if channel not in ("analysis", "commentary", "final"):
            raise Fail(f"unknown channel {channel!r}", header.start("ch"))
        if recipient:
            call = _call(text, header, body, body_start, how, nc, server_content)
            _tail(text, after, "call", nc, [call])
            return "\n".join(pieces), [call], how == "call"
        if channel == "final":
            if how == "end":
                nc.append(NC_FINAL_END)
            elif how == "call":
                raise Fail("a final message ended by <|call|>", end.start() if end else after)
            elif not how and not server_content:
                nc.append(NC_NO_EOS)
            pieces.append(body)
            _tail(text, after, "final answer", nc, [])
            return "\n".join(pieces), [], how == "return"
        if how != "end":
            if not how:
                raise Fail(f"truncated {channel} message", len(text))
            raise Fail(f"{channel} message ended by <|{how}|>", end.start() if end else after)
        if channel == "commentary":
            pieces.append(body)
        pos = skip_ws(text, after)
        if pos != after:
            nc.append(NC_BETWEEN)
        if pos >= len(text):
            raise Fail("truncated turn: no final answer and no call after <|end|>", pos)


def _tail(text: str, pos: int, what: str, nc: list[str], calls: list[ToolCall]) -> None:
    """Nothing may follow the call or the answer (whitespace aside)."""
    rest = text[pos:]
    if rest.strip():
        raise Fail(f"text after the {what}", skip_ws(text, pos), calls)
    if rest:
        nc.append(NC_TRAILING_WS)


def _call(
    text: str,
    header: re.Match[str],
    body: str,
    body_start: int,
    how: str,
    nc: list[str],
    server_content: bool,
) -> ToolCall:
    channel = header.group("ch")
    recipient = header.group("r1") or header.group("r2")
    if channel != "commentary":
        raise Fail(f"a call on the {channel} channel", header.start("ch"))
    name = recipient.removeprefix("functions.")
    if name == recipient:
        nc.append(NC_BARE_RECIPIENT)
    if not name:
        raise Fail("a call without a function name", header.start())
    if header.group("ct"):
        if header.group("ct") != "json":
            raise Fail(f"content type {header.group('ct')!r} for a call", header.start("ct"))
        if header.group("sp") != " ":
            nc.append(NC_NO_CONSTRAIN)
    else:
        nc.append(NC_NO_CONSTRAIN)
    try:
        args = loads_strict(body)
    except StrictJSONError as exc:
        if not how:
            raise Fail("truncated call: arguments cut off", len(text)) from None
        raise Fail(
            f"call arguments are not valid JSON ({exc.kind}: {exc.message})", body_start + exc.pos
        ) from None
    if not isinstance(args, dict):
        raise Fail("call arguments are JSON but not an object", body_start)
    if how in ("end", "return"):
        raise Fail(f"a call ended by <|{how}|> instead of <|call|>", body_start + len(body))
    if not how and not server_content:
        nc.append(NC_NO_EOS)
    return ToolCall(name, args)


def encode(content: str, calls: Sequence[ToolCall]) -> str:
    """The canonical output: a final answer, or a call (after a preamble when content)."""
    if len(calls) > MAX_CALLS:
        raise ValueError(f"gpt-oss writes one tool call per completion, not {len(calls)}")
    if not calls:
        return f"{CHANNEL}final{MESSAGE}{content}{RETURN}"
    pre = f"{CHANNEL}commentary{MESSAGE}{content}{END}{START}assistant" if content else ""
    call = calls[0]
    args = json.dumps(call.arguments, ensure_ascii=False, separators=(",", ":"))
    return f"{pre}{CHANNEL}commentary to=functions.{call.name} {CONSTRAIN}json{MESSAGE}{args}{CALL}"


# (the recipient may stand before the tokens: held back while streaming)
DIALECTS = (
    Entry(MarkupDialect(NAME, first_marker, parse, encode, complete_calls, ("to=functions.",),
                        FRAGMENT), rank=40, auto=True, aliases=("openai", "gpt_oss", "harmony")),
)  # fmt: skip
