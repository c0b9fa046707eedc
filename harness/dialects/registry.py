"""The dialect registry: one small interface, one module per dialect, "auto" detection.

The dialects are the ones the modules of this package declare (their ``DIALECTS``: see
``declare``); the registry finds the modules by itself.

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

import importlib
import pkgutil
import re
from collections.abc import Callable, Sequence
from dataclasses import replace

import harness.dialects
from harness.dialects.base import ParseResult
from harness.dialects.declare import Dialect, Entry, MarkupDialect
from harness.dialects.markup import Tools
from harness.dialects.stream import Stream
from harness.errors import UsageError

__all__ = ["Dialect", "Stream", "aliases", "detect", "dialect_for_model", "get", "names", "parse"]

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


def register(entry: Entry) -> None:
    name = entry.dialect.name
    _DIALECTS[name] = entry.dialect
    for alias in entry.aliases:
        _ALIASES[alias] = name
    if entry.auto_marker is not None:
        _AUTO_MARKERS[name] = entry.auto_marker
    if entry.layout is not None:
        _LAYOUTS[name] = entry.layout
    group = _FALLBACK if entry.fallback else _AUTO
    if (entry.auto or entry.fallback) and name not in group:
        group.append(name)


def declared() -> list[Entry]:
    """Every dialect the modules of this package declare (their ``DIALECTS``), by rank."""
    entries: list[Entry] = []
    for info in pkgutil.iter_modules(harness.dialects.__path__):
        if info.name != "registry":
            module = importlib.import_module(f"{harness.dialects.__name__}.{info.name}")
            entries.extend(getattr(module, "DIALECTS", ()))
    return sorted(entries, key=lambda entry: entry.rank)


for _entry in declared():
    register(_entry)


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


def has_markup(text: str) -> bool:
    """Whether ``text`` holds the first marker of any dialect "auto" knows (a text without
    one cannot settle a dialect)."""
    return bool(_marks(text))


#: The auto and fallback dialects ``_may_mark`` was derived from (a test keeps them so).
GATED = (
    "dsml", "hermes", "qwen3-coder", "gpt-oss", "glm45", "glm47", "kimi-k2", "deepseek-v3",
    "deepseek-v31", "mistral", "mistral-v11", "llama3-json", "llama4-pythonic", "minimax-m2",
    "json",
)  # fmt: skip
#: Every match of those dialects' markers (openers, fragments, calls) holds one of these
#: characters: '<' (the tags), an ASCII or look-alike bar (DSML, DeepSeek, Kimi, Harmony),
#: '[' or ']' (Mistral, Llama 4's call list), '{' (Llama 3's and the bare JSON call); or
#: ``to=functions.`` in any case (Harmony's fragment). Fences are masked with NUL and an
#: end-of-turn token is cut off, neither of which adds one.
_MARK_CHARS = re.compile("[<|\\[\\]{\uff5c\u2016\u2223\u2502\u00a6]")
_HARMONY_TO = re.compile(r"to=functions\.", re.IGNORECASE)


def _may_mark(text: str) -> bool:
    """False when no auto dialect can find markup in ``text`` (a C-speed scan in front of
    fifteen markers, for the plain prose most texts are)."""
    if _MARK_CHARS.search(text) is not None:
        return True
    return "=" in text and _HARMONY_TO.search(text) is not None


def _marks(text: str) -> list[tuple[int, str]]:
    """(offset of the first markup, name) of the auto dialects present, earliest first."""
    if not _may_mark(text):
        return []
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
#: memory speed). Hermes texts hold none of them; a DSML v4 block holds ``\uff5ctool`` (its
#: ``<\uff5cDSML\uff5ctool_calls>``), so it is parsed by "auto" here too.
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
