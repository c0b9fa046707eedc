"""The dialect registry: one small interface, one module per dialect, "auto" detection.

A dialect has a ``name``, ``first_marker(text) -> int`` (offset of its first markup, exact
or near-miss, or -1), ``parse(text, *, server_content=False, tools=None) -> ParseResult``,
``encode(content, calls) -> str`` (the canonical raw text a model writes) and ``stream()``
(an incremental parser with ``feed``/``flush``/``finish`` that ends in the same result).
``get`` accepts the servers' ``--tool-call-parser`` names as aliases; ``dialect_for_model``
names the dialect a served model's name implies.

``parse(text, "auto")`` tries every auto dialect whose markup appears. The one that parses
(earliest markup first) wins; markup of another dialect in the content before it makes the
turn a near miss ("mixed dialects"). When none parses, the failure of the dialect whose
markup comes first is returned (on a tie, the one that got furthest). Between two versions
of one markup (GLM-4.5 and 4.7, DeepSeek V3 and V3.1, Mistral v3 and v11) their layout
decides (the modules' ``layout``) when both parse or both fail. Llama 4 pythonic counts for
"auto" only when its markup tells it by itself (``llama.telling_marker``: a
``<|python_start|>`` wrapper, or an output that is a call list): a bare ``[f(x)]`` opening
an answer may be a markdown link.

Names besides the model dialects: "dsml" (V3.2 or V4, whichever appears), "json" (near
misses of a bare JSON tool call only: ``{...}{...}``, an unbalanced call object), "none".
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from functools import partial
from typing import Protocol

from harness.dialects import (
    deepseek_v3,
    dsml,
    glm,
    harmony,
    hermes,
    jsoncall,
    kimi_k2,
    llama,
    minimax_m2,
    mistral,
    qwen3_coder,
)
from harness.dialects.base import ParseResult, ToolCall
from harness.dialects.markup import Tools
from harness.dialects.stream import Event, MarkupStream, StreamParser
from harness.errors import UsageError


class Stream(Protocol):
    def feed(self, delta: str) -> list[Event]: ...

    def flush(self) -> list[Event]: ...

    def finish(self) -> ParseResult: ...


class Dialect(Protocol):
    @property
    def name(self) -> str: ...

    def first_marker(self, text: str) -> int: ...

    def parse(
        self, text: str, *, server_content: bool = False, tools: Tools = None
    ) -> ParseResult: ...

    def encode(self, content: str, calls: Sequence[ToolCall]) -> str: ...

    def stream(self, *, server_content: bool = False, tools: Tools = None) -> Stream: ...


@dataclass(frozen=True)
class DsmlDialect:
    name: str
    version: str  # "auto" | "v4" | "v32"

    def first_marker(self, text: str) -> int:
        return dsml.first_marker(text)

    def parse(self, text: str, *, server_content: bool = False, tools: Tools = None) -> ParseResult:
        return dsml.parse(text, self.version, server_content=server_content)

    def encode(self, content: str, calls: Sequence[ToolCall]) -> str:
        return dsml.encode_turn(content, calls, "v32" if self.version == "v32" else "v4")

    def stream(self, *, server_content: bool = False, tools: Tools = None) -> Stream:
        return StreamParser(self.version, server_content=server_content)


@dataclass(frozen=True)
class MarkupDialect:
    """A dialect made of a module's functions (its stream is a ``MarkupStream``)."""

    name: str
    marker_fn: Callable[[str], int]
    parse_fn: Callable[..., ParseResult]
    encode_fn: Callable[[str, Sequence[ToolCall]], str]
    calls_fn: Callable[[str, Tools], tuple[ToolCall, ...]]
    holds: tuple[str, ...] = ()
    #: any piece of the markup, exact or mangled (``markup_spans`` masks them)
    tokens: re.Pattern[str] | None = None

    def first_marker(self, text: str) -> int:
        return self.marker_fn(text)

    def parse(self, text: str, *, server_content: bool = False, tools: Tools = None) -> ParseResult:
        return self.parse_fn(text, server_content=server_content, tools=tools)

    def encode(self, content: str, calls: Sequence[ToolCall]) -> str:
        return self.encode_fn(content, calls)

    def complete_calls(self, text: str, tools: Tools = None) -> tuple[ToolCall, ...]:
        return self.calls_fn(text, tools)

    def stream(self, *, server_content: bool = False, tools: Tools = None) -> Stream:
        return MarkupStream(self, server_content=server_content, tools=tools, holds=self.holds)


@dataclass(frozen=True)
class JsonCallDialect:
    """Bare JSON tool calls: only their near misses are markup (valid JSON is content)."""

    name: str = "json"

    def first_marker(self, text: str) -> int:
        return jsoncall.first_marker(text)

    def parse(self, text: str, *, server_content: bool = False, tools: Tools = None) -> ParseResult:
        return jsoncall.parse(text, server_content=server_content)

    def encode(self, content: str, calls: Sequence[ToolCall]) -> str:
        raise UsageError("the json dialect only finds near misses: it has no encoding")

    def complete_calls(self, text: str, tools: Tools = None) -> tuple[ToolCall, ...]:
        return ()

    def stream(self, *, server_content: bool = False, tools: Tools = None) -> Stream:
        return MarkupStream(self, server_content=server_content)


@dataclass(frozen=True)
class NoDialect:
    """No tool-call markup expected: the whole text is content."""

    name: str = "none"

    def first_marker(self, text: str) -> int:
        return -1

    def parse(self, text: str, *, server_content: bool = False, tools: Tools = None) -> ParseResult:
        return ParseResult(content=text)

    def encode(self, content: str, calls: Sequence[ToolCall]) -> str:
        if calls:
            raise UsageError("the none dialect cannot write tool calls")
        return content

    def complete_calls(self, text: str, tools: Tools = None) -> tuple[ToolCall, ...]:
        return ()

    def stream(self, *, server_content: bool = False, tools: Tools = None) -> Stream:
        return MarkupStream(self, server_content=server_content)


_DIALECTS: dict[str, Dialect] = {}
_ALIASES: dict[str, str] = {}
#: Dialects tried by "auto", in order of preference on a tie.
_AUTO: list[str] = []
#: Dialects tried by "auto" only when no other one finds markup (bare JSON is what every
#: envelope holds, so it never makes a turn "mixed").
_FALLBACK: list[str] = []
#: Where "auto" sees a dialect's markup, when that is less than where the dialect named
#: finds it (markup that may be prose counts only when named).
_AUTO_MARKERS: dict[str, Callable[[str], int]] = {}
#: The versions of one markup that only their layout tells apart, and what tells it.
_LAYOUTS: dict[str, Callable[[str], str | None]] = {}


def register(
    dialect: Dialect,
    *,
    auto: bool = False,
    fallback: bool = False,
    aliases: Sequence[str] = (),
    auto_marker: Callable[[str], int] | None = None,
    layout: Callable[[str], str | None] | None = None,
) -> None:
    _DIALECTS[dialect.name] = dialect
    for alias in aliases:
        _ALIASES[alias] = dialect.name
    if auto_marker is not None:
        _AUTO_MARKERS[dialect.name] = auto_marker
    if layout is not None:
        _LAYOUTS[dialect.name] = layout
    group = _FALLBACK if fallback else _AUTO
    if (auto or fallback) and dialect.name not in group:
        group.append(dialect.name)


def _module(
    name: str,
    module: object,
    *,
    holds: tuple[str, ...] = (),
    tokens: re.Pattern[str] | None = None,
    **fixed: str,
) -> MarkupDialect:
    def bind(fn_name: str) -> Callable[..., object]:
        fn: Callable[..., object] = getattr(module, fn_name)
        return partial(fn, **fixed) if fixed else fn

    return MarkupDialect(
        name,
        bind("first_marker"),  # type: ignore[arg-type]
        bind("parse"),  # type: ignore[arg-type]
        bind("encode"),  # type: ignore[arg-type]
        bind("complete_calls"),  # type: ignore[arg-type]
        holds,
        tokens if tokens is not None else getattr(module, "FRAGMENT", None),
    )


register(DsmlDialect("dsml-v4", "v4"), aliases=("deepseek_v4", "deepseekv4"))
register(DsmlDialect("dsml-v32", "v32"), aliases=("deepseek_v32", "deepseekv32"))
register(DsmlDialect("dsml", "auto"), auto=True)
register(
    _module("hermes", hermes),
    auto=True,
    aliases=("qwen3_json", "qwen25", "qwen"),
)
register(_module(qwen3_coder.NAME, qwen3_coder), auto=True, aliases=("qwen3_coder", "qwen3_xml"))
register(
    _module(harmony.NAME, harmony, holds=("to=functions.",)),
    auto=True,
    aliases=("openai", "gpt_oss", "harmony"),
)
register(
    _module("glm45", glm, version="glm45"),
    auto=True,
    aliases=("glm4_moe", "glm-4.5"),
    layout=glm.layout,
)
register(_module("glm47", glm, version="glm47"), auto=True, aliases=("glm-4.7",), layout=glm.layout)
register(_module(kimi_k2.NAME, kimi_k2), auto=True, aliases=("kimi_k2", "kimi"))
register(
    _module("deepseek-v3", deepseek_v3, version="v3"),
    auto=True,
    aliases=("deepseek_v3", "deepseekv3", "deepseek-r1"),
    layout=deepseek_v3.layout,
)
register(
    _module("deepseek-v31", deepseek_v3, version="v31"),
    auto=True,
    aliases=("deepseek_v31", "deepseekv31"),
    layout=deepseek_v3.layout,
)
register(
    _module("mistral", mistral, holds=mistral.HOLDS, version="v3"),
    auto=True,
    aliases=("mistral-v3",),
    layout=mistral.layout,
)
register(
    _module("mistral-v11", mistral, holds=mistral.HOLDS, version="v11"),
    auto=True,
    layout=mistral.layout,
)
register(
    _module("llama3-json", llama, tokens=llama.FRAGMENT3, version="json"),
    auto=True,
    aliases=("llama3_json", "llama4_json", "llama3"),
)
# (auto only where the markup tells: an answer opening with a link "[f(x)](url)" looks alike)
register(
    _module("llama4-pythonic", llama, tokens=llama.FRAGMENT4, version="pythonic"),
    auto=True,
    aliases=("pythonic", "llama4_pythonic"),
    auto_marker=llama.telling_marker,
)
register(_module(minimax_m2.NAME, minimax_m2), auto=True, aliases=("minimax_m2", "minimax"))
register(JsonCallDialect(), fallback=True)
register(NoDialect())


def _canonical(name: str) -> str:
    return _ALIASES.get(name, name) if name not in _DIALECTS else name


def names() -> list[str]:
    return ["auto", *_DIALECTS]


def aliases() -> dict[str, str]:
    """Every alias (the servers' parser names) and the dialect it stands for."""
    return dict(_ALIASES)


def get(name: str) -> Dialect:
    try:
        return _DIALECTS[_canonical(name)]
    except KeyError:
        raise UsageError(f"unknown dialect {name!r}: use one of {', '.join(names())}") from None


def detect(text: str) -> str:
    """The name of the auto dialect that explains the markup in ``text``, or "none"."""
    return _auto(text, False, None)[0]


def _marks(text: str) -> list[tuple[int, str]]:
    """(offset of the first markup, name) of the auto dialects present, earliest first."""
    for group in (_AUTO, _FALLBACK):
        marks = [(off, name) for name in group if (off := _auto_marker(name, text)) >= 0]
        if marks:
            order = {name: i for i, name in enumerate(group)}
            return sorted(marks, key=lambda m: (m[0], order[m[1]]))
    return []


def _auto_marker(name: str, text: str) -> int:
    told = _AUTO_MARKERS.get(name)
    return told(text) if told is not None else _DIALECTS[name].first_marker(text)


def _by_layout(
    text: str, chosen: tuple[int, str, ParseResult], rivals: Sequence[tuple[int, str, ParseResult]]
) -> tuple[int, str, ParseResult]:
    """``chosen``, or the rival version of its markup whose layout ``text`` has (when that
    rival got as far: both parsed, or both failed)."""
    layout = _LAYOUTS.get(chosen[1])
    told = layout(text) if layout is not None else None
    if told is None or told == chosen[1]:
        return chosen
    return next((r for r in rivals if r[1] == told and r[0] == chosen[0]), chosen)


def parse(
    text: str, dialect: str = "auto", *, server_content: bool = False, tools: Tools = None
) -> ParseResult:
    """Parse ``text`` with the named dialect ("auto": see the module doc)."""
    if dialect != "auto":
        return get(dialect).parse(text, server_content=server_content, tools=tools)
    return _auto(text, server_content, tools)[1]


def _auto(text: str, server_content: bool, tools: Tools) -> tuple[str, ParseResult]:
    marks = _marks(text)
    if not marks:
        return "none", ParseResult(content=text)
    results = [
        (off, name, _DIALECTS[name].parse(text, server_content=server_content, tools=tools))
        for off, name in marks
    ]
    good = [r for r in results if r[2].ok and r[2].found]
    if good:
        least = min(good, key=lambda r: (r[0], len(r[2].noncanonical)))
        tie = [r for r in good if len(r[2].noncanonical) == len(least[2].noncanonical)]
        off, name, result = _by_layout(text, least, tie)
        before = [(o, n) for o, n, _ in results if o < off and _family(n) != _family(name)]
        if before:
            return name, replace(
                result,
                content=text,
                calls=(),
                ok=False,
                error=f"mixed dialects: {name} markup after {before[0][1]} markup",
                offset=off,
            )
        return name, result
    first = marks[0][0]
    tied = [r for r in results if r[0] == first and r[2].found] or results[:1]
    best = max(tied, key=lambda r: r[2].offset if r[2].offset is not None else -1)
    best = _by_layout(text, best, tied)
    return best[1], best[2]


#: Substrings one of which the markup of the dialects besides DSML and Hermes holds in its
#: canonical or usual broken shapes: a text with none of them has none (``in`` runs at
#: memory speed; DSML and Hermes texts hold none of them).
_NEEDLES = (
    "<|", "|>", "<\uff5ctool", "\uff5ctool", "[TOOL_CALL", "TOOL_CALLS]", "[ARGS]", "[CALL_ID]",
    "<function=", "</function>", "<parameter=", "</parameter>", "<arg_", "</arg_",
    "<invoke ", "</invoke>", "minimax:", "to=functions.", '"parameters"',
)  # fmt: skip


def markup_spans(text: str) -> list[tuple[int, int]]:
    """Where the text holds tool-call markup of the dialects besides DSML and Hermes.

    The dialect "auto" settles on (the one whose markup parses, or the one blamed for the
    broken markup) contributes everything from its first marker on: the calls are judged
    by the parser and the argument checks, not as prose, and a near miss reads as a near
    miss rather than as special-token debris or symbol soup. Any other dialect contributes
    its tokens only (a broken Hermes block is also a broken Qwen3-Coder or GLM one: its
    text stays readable), but Llama 4 pythonic, whose call list counts when it parses. For
    the salad detector's masking; a text holding none of ``_NEEDLES`` costs a few scans.
    """
    spans: list[tuple[int, int]] = []
    if text.lstrip()[:1] == "[":
        pythonic = _DIALECTS["llama4-pythonic"]
        if pythonic.first_marker(text) >= 0 and pythonic.parse(text, server_content=True).ok:
            spans.append((pythonic.first_marker(text), len(text)))
    if not any(needle in text for needle in _NEEDLES):
        return spans
    chosen, result = _auto(text, True, None)
    for name in _AUTO:
        dialect = _DIALECTS[name]
        if not isinstance(dialect, MarkupDialect) or dialect.tokens is None or name == "hermes":
            continue
        if name == chosen and result.found:
            span = (dialect.first_marker(text), len(text))
            if span not in spans:
                spans.append(span)
        elif name != "llama4-pythonic":
            spans.extend(m.span() for m in dialect.tokens.finditer(text))
    return spans


def _family(name: str) -> str:
    return "dsml" if name.startswith("dsml") else name


def _mistral(base: str) -> str:
    """v11 and later tokenizers (compact calls) from the mid-2025 releases on."""
    dates = [int(d) for d in re.findall(r"(?<!\d)(2[3-9][01]\d)(?!\d)", base)]
    if dates:
        return "mistral-v11" if max(dates) >= 2506 else "mistral"
    return "mistral-v11" if "magistral" in base else "mistral"


#: (pattern on the lower-case model name, dialect), first match wins.
_MODELS: list[tuple[re.Pattern[str], str | Callable[[str], str]]] = [
    (re.compile(p), d)
    for p, d in [
        (r"qwen3-?coder|qwen3\.5", "qwen3-coder"),
        (r"qwen2\.5|qwen3|qwq", "hermes"),
        (r"glm-?4\.[56]", "glm45"),
        (r"glm-?(?:4\.7|5)", "glm47"),
        (r"kimi-?k2", "kimi-k2"),
        (r"gpt-?oss", "gpt-oss"),
        (r"llama-?4", "llama4-pythonic"),
        (r"llama-?3", "llama3-json"),
        (r"deepseek-?v4", "dsml-v4"),
        (r"deepseek-?v3\.2", "dsml-v32"),
        (r"deepseek-?v3\.1", "deepseek-v31"),
        (r"deepseek-?(?:v3|r1)", "deepseek-v3"),
        (r"minimax-?m2", "minimax-m2"),
    ]
] + [(re.compile(r"mistral|mixtral|ministral|devstral|magistral|codestral"), _mistral)]


def dialect_for_model(model_id: str) -> str | None:
    """The dialect a served model's name (or path) implies, or None when it names none.

    From the family names of the servers' docs: Qwen3-Coder and Qwen3.5 speak
    qwen3-coder, other Qwen2.5/Qwen3/QwQ hermes, GLM-4.5/4.6 glm45, GLM-4.7/5 glm47, and
    so on; Mistral models released from mid-2025 on (a date code of 2506 or later, and
    Magistral) mistral-v11, older ones mistral.
    """
    base = model_id.rstrip("/").rsplit("/", 1)[-1].lower().replace("_", "-")
    for pattern, dialect in _MODELS:
        if pattern.search(base):
            return dialect if isinstance(dialect, str) else dialect(base)
    return None
