"""Classify one turn: envelope checks, argument checks, reasoning apart, salad and
repetition -> Verdict.

``classify_turn`` is the one classifier used by ``harness run`` and ``harness classify``.
It never reads the simulator's ground truth.

Each corrupted verdict says how it was reached (``tier``): ``structural`` (an envelope,
schema or markup failure found exactly by the parsers) or ``suspect`` (the text detector's
guess). The after-load oracles (the judge, ``analysis.tiers``) promote a suspect turn to
``confirmed``; the headline rate counts structural + confirmed when they ran.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field, replace
from typing import Any

from harness import labels as L
from harness.dialects import dsml, registry
from harness.dialects.base import ParseResult, ToolCall
from harness.verdict import reasoning as R
from harness.verdict.detector import coherence
from harness.verdict.detector.masking import edit_blocks, original_offset, quoted_calls
from harness.verdict.detector.text import TextFinding, score_text
from harness.verdict.toolcheck import (
    check_calls,
    check_server_calls,
    schema_problems,
    server_calls_as_dicts,
)

#: Past this many characters a text is scored on bounded windows (``score_bounded``): the
#: head, the tail and evenly spaced samples between, so one answer's verdict takes bounded
#: time however long it is (1 MB of one character took the full detector 6 s).
SCORE_MAX_CHARS = 64_000
_EDGE_CHARS = 16_000  # the head and the tail
_SAMPLES = 4
_SAMPLE_CHARS = 8_000
_ALIGN_CHARS = 200  # a window starts after a line break or space this close, when there is one


#: How a corrupted verdict was reached (``Verdict.tier``; "" for a healthy turn).
STRUCTURAL = "structural"  # found exactly: an envelope, a schema, markup where it cannot be
SUSPECT = "suspect"  # the text detector's guess (salad, a loop), until an oracle confirms it
#: a suspect an oracle confirmed after the load (the judge, the exact oracles, a lone
#: re-send: analysis.tiers). Never the text alone: a loop that runs to the end of the output
#: can be the model's own (a small model's greedy answers end so) as well as the server's.
CONFIRMED = "confirmed"
TIERS = (STRUCTURAL, CONFIRMED, SUSPECT)


@dataclass(frozen=True)
class Verdict:
    label: str
    corrupted: bool
    noncanonical: bool = False
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    evidence: dict[str, Any] = field(default_factory=dict)
    tier: str = ""  # STRUCTURAL | SUSPECT | CONFIRMED for a corrupted turn, "" otherwise


def _parse_markup(
    text: str, dialect: str, server_content: bool, tools: list[dict[str, Any]] | None = None
) -> ParseResult:
    """The markup of ``dialect`` in ``text``; without it, the markup of any other known
    dialect (a turn in a dialect nobody expected is still tool-call markup). ``tools``: the
    declared tools, whose schemas type the values of the dialects that write them raw."""
    parsed = registry.parse(text, dialect, server_content=server_content, tools=tools)
    if parsed.found or dialect in ("auto", "none"):
        return replace(parsed, dialect=parsed.dialect or dialect) if parsed.found else parsed
    other = registry.detect(text)
    if other == "none":
        return parsed
    found = registry.get(other).parse(text, server_content=server_content, tools=tools)
    if not found.found or _stray_tag(text, found):
        return parsed
    name = found.dialect or other
    if not server_content and found.ok:
        # a raw output in another dialect: the calls a server of ``dialect`` would not see
        reason = f"{name} tool-call markup where {dialect} was expected"
        return replace(found, content=text, calls=(), ok=False, error=reason, dialect=name,
                       offset=registry.get(other).first_marker(text))  # fmt: skip
    return replace(found, dialect=name)


#: Tags of the XML-like dialects (Qwen3-Coder, Hermes, MiniMax, GLM) written bare: a word
#: of prose ("the closing tag </parameter>", an element named <parameter>) as much as markup.
_BARE_TAG = re.compile(r"</?(?:parameter|function|tool_call|invoke|arg_key|arg_value)>")
#: The openers that make such a tag markup: a block or a call begun.
_OPENER = re.compile(r"<(?:function|parameter)=|<tool_call>|<invoke |\[TOOL_CALLS\]|<\|tool")


def _stray_tag(text: str, parsed: ParseResult) -> bool:
    """Whether a failed parse of a dialect nobody asked for rests on one or two bare tags in
    prose and nothing that begins a call: cross-dialect leak detection needs more."""
    if parsed.ok or "outside a well-formed block" not in (parsed.error or ""):
        return False
    return len(_BARE_TAG.findall(text)) <= 2 and not _OPENER.search(text)


def _without_quoted_calls(text: str) -> tuple[str, list[tuple[int, int]]]:
    """``text`` without the raw tool-call turns shown in its code blocks and without its edit
    blocks, each replaced by a line break (``masking.original_offset`` maps offsets back),
    and their spans: a model showing the format wrote no prose there (the parsers read such
    a block as content, not as calls), and an edit's new side repeats its old one by
    design."""
    spans: list[tuple[int, int]] = []
    for a, b in sorted(quoted_calls(text) + edit_blocks(text)):
        # with the blank lines around it: the text reads on as if the block were not there
        while a > 0 and text[a - 1] in " \t\n":
            a -= 1
        while b < len(text) and text[b] in " \t\n":
            b += 1
        if spans and a <= spans[-1][1]:  # touching the span before: one span
            spans[-1] = (spans[-1][0], max(b, spans[-1][1]))
        else:
            spans.append((a, b))
    if not spans:
        return text, spans
    parts, last = [], 0
    for a, b in spans:
        parts.append(text[last:a])
        last = b
    parts.append(text[last:])
    return "\n".join(parts), spans


def _windows(n: int) -> list[tuple[int, int]]:
    """The (start, end) of the windows scored in a text of ``n`` > SCORE_MAX_CHARS chars."""
    spots = [0]
    room = n - 2 * _EDGE_CHARS - _SAMPLE_CHARS
    spots += [_EDGE_CHARS + room * (i + 1) // (_SAMPLES + 1) for i in range(_SAMPLES)]
    out = [(0, _EDGE_CHARS)]
    out += [(s, s + _SAMPLE_CHARS) for s in spots[1:]]
    out.append((n - _EDGE_CHARS, n))
    return out


def _aligned(text: str, start: int) -> int:
    """``start`` moved past the next line break (or else space) close after it."""
    if start == 0:
        return 0
    for sep in ("\n", " "):
        cut = text.find(sep, start, start + _ALIGN_CHARS)
        if cut >= 0:
            return cut + 1
    return start


def score_bounded(text: str, context: str | None = None) -> tuple[TextFinding, bool]:
    """``score_text`` in bounded time: a text past SCORE_MAX_CHARS is scored window by
    window (head, samples, tail); the first window in text order that is corrupted gives
    the finding, its offset in the whole text. Returns the finding and whether it was
    windowed."""
    if len(text) <= SCORE_MAX_CHARS:
        return score_text(text, context), False
    best = 0.0
    for start, end in _windows(len(text)):
        start = _aligned(text, start)
        found = score_text(text[start:end], context)
        if found.label is not None:
            offset = None if found.offset is None else found.offset + start
            return TextFinding(found.label, found.score, offset, found.signals), True
        best = max(best, found.score)
    return TextFinding(None, best, None, {}), True


def _verdict(
    label: str,
    calls: list[dict[str, Any]],
    evidence: dict[str, Any],
    nc: bool,
    tier: str = STRUCTURAL,
) -> Verdict:
    corrupted = L.is_corrupted(label)
    return Verdict(label, corrupted, nc, calls, evidence, tier if corrupted else "")


def _score_parts(
    reasoning: str, answer: str, context: str | None, evidence: dict[str, Any]
) -> tuple[TextFinding, bool, bool]:
    """The text detector on the reasoning, then on the answer, each on its own: (the first
    finding, or the answer's clean one; whether a text was windowed; whether the finding is
    in the reasoning). A finding the second look acquits (``coherence``) is clean, its
    reason in ``evidence["acquitted"]``."""
    windowed = False
    best = 0.0
    if reasoning.strip():
        found, windowed = _score_one(reasoning, context, evidence)
        if found.label is not None:
            return found, windowed, True
        best = found.score
    found, win = _score_one(answer, context, evidence)
    if found.label is None and best > found.score:
        found = TextFinding(None, best, None, {})
    return found, windowed or win, False


def _json_prose(text: str) -> str | None:
    """The strings of ``text`` that are prose (three words or more), one a line, when
    ``text`` is one JSON object or array (a fence around it aside): a model answering in
    JSON (or writing its tool call as a JSON object) wrote data, names and values, and only
    its sentences are text. None for anything else."""
    body = text.strip()
    if body.startswith("```") and body.endswith("```"):
        body = body[body.find("\n") + 1 : -3].strip()
    if not body or body[0] not in "[{" or body[-1] not in "]}":
        return None
    try:
        value = json.loads(body)
    except (ValueError, RecursionError):
        return None
    out: list[str] = []
    stack = [value]
    while stack and len(out) < 10_000:
        v = stack.pop()
        if isinstance(v, str):
            out.append(v)
        elif isinstance(v, dict):
            stack.extend(reversed(list(v.values())))
        elif isinstance(v, list):
            stack.extend(reversed(v))
    return "\n".join(s for s in out if s.count(" ") >= 2)


def _score_one(
    text: str, context: str | None, evidence: dict[str, Any]
) -> tuple[TextFinding, bool]:
    prose = _json_prose(text) if text.lstrip()[:1] in ("{", "[", "`") else None
    if prose is not None:  # JSON: its strings are the text (offsets are in them)
        evidence["json_answer"] = True
        text = prose
    found, windowed = score_bounded(coherence.emoji_fffd(text), context)
    if found.label == L.REPETITION:
        loop = coherence.loop_to_the_end(text)
        if loop is not None:  # what the loop is; an oracle decides whose it is
            evidence["loop_to_the_end"] = loop
            return found, windowed
    if found.label is not None:
        why = coherence.second_look(text, found.label, found.signals)
        if why is not None:
            evidence["acquitted"] = why
            return TextFinding(None, found.score, None, {}), windowed
        if prose is not None:  # an offset into the strings is none into the text
            found = TextFinding(found.label, found.score, None, found.signals)
    return found, windowed


def classify_turn(
    content: str | None,
    *,
    reasoning: str | None = "",
    tool_calls: list[dict[str, Any]] | None = None,
    tools: list[dict[str, Any]] | None = None,
    finish_reason: str | None = None,
    dialect: str = "auto",
    source: str = "server",
    context: str | None = None,
) -> Verdict:
    """Label one assistant turn.

    ``source="server"``: ``content`` is a server's message content next to its parsed
    ``tool_calls`` (OpenAI shape). ``source="raw"``: ``content`` is the raw model output and
    the calls are extracted here with ``dialect``.
    """
    content = content or ""
    reasoning = reasoning or ""
    server_calls = list(tool_calls or [])
    evidence: dict[str, Any] = {}

    if not content.strip() and not reasoning.strip() and not server_calls:
        label = L.TRUNCATED if finish_reason == "length" else L.EMPTY
        return _verdict(label, [], evidence, False)

    # Reasoning in the content (no reasoning parser on the server, or a raw output): judged
    # as text of its own, the answer parsed and judged without it.
    part = R.split(content)
    base = part.answer_start  # offsets below are in the answer; evidence maps them back
    answer = part.answer
    if part.form:
        evidence["reasoning_in_content"] = part.form
        if not part.closed:
            evidence["reasoning_unclosed"] = True
    thought = "\n".join(x for x in (reasoning, part.reasoning) if x.strip())

    parsed = _parse_markup(answer, dialect, source == "server", tools)
    noncanonical = bool(parsed.ok and parsed.found and parsed.noncanonical)
    if noncanonical:
        evidence["noncanonical"] = list(parsed.noncanonical)
    start = _markup_start(answer, parsed) if parsed.found else len(answer)

    # Reasoning markup where none can be (a block opened mid-answer, a marker glued into a
    # word): exact, like an envelope's failure.
    if part.broken is not None and part.broken[0] - base < start:
        offset, what = part.broken
        evidence.update(reason=what, offset=offset)
        return _verdict(L.TOKEN_SALAD, server_calls_as_dicts(server_calls), evidence, False)

    # Salad and loops next: they are the root symptom, and often break the envelope too.
    # score_text masks well-formed markup itself; debris in arguments counts. Reasoning tags
    # are this function's to judge (part.broken), literals to the detector. A tag the output
    # was cut inside (a block cut short) is the parser's to judge, not text.
    visible = R.neutral(answer[: _cut_tag(answer)] if _cut_inside(answer, parsed) else answer)
    shown: list[tuple[int, int]] = []
    if "```" in visible or "~~~" in visible or "<<<<<<<" in visible:
        visible, shown = _without_quoted_calls(visible)
    finding, windowed, in_reasoning = _score_parts(R.neutral(thought), visible, context, evidence)
    evidence["text_score"] = round(finding.score, 4)
    if windowed:
        evidence["scored_windows"] = True  # a long text: head, samples and tail scored
    if finding.label is not None:
        evidence["signals"] = finding.signals
        at = finding.offset
        field_len = len(reasoning) + 1 if reasoning.strip() else 0
        # in the reasoning field (the offset is in it), or in the content's reasoning
        in_field = at < field_len if at is not None else not part.reasoning.strip()
        evidence["in_reasoning"] = in_reasoning and in_field
        if in_reasoning and not in_field:
            evidence["in_content_reasoning"] = True
        if at is not None:
            if not in_reasoning:
                at = base + (original_offset(at, shown) if shown else at)
            elif at >= field_len:
                at = part.reasoning_start + at - field_len
            evidence["offset"] = at
        return _verdict(
            finding.label, server_calls_as_dicts(server_calls), evidence, noncanonical, SUSPECT
        )

    reasoning_markup = _parse_markup(reasoning, dialect, True, tools) if reasoning else None
    if reasoning_markup is not None and reasoning_markup.found:
        evidence.update(reason="tool-call markup in the reasoning", offset=reasoning_markup.offset)
        evidence["dialect"] = reasoning_markup.dialect
        evidence["in_reasoning"] = True
        label = L.PARSER_LEAK if reasoning_markup.ok else L.MALFORMED_TOOL_CALL
        return _verdict(label, [], evidence, noncanonical)

    if parsed.found and not parsed.ok:
        off = parsed.offset
        evidence.update(reason=parsed.error, offset=off if off is None or off < 0 else off + base)
        evidence["dialect"] = parsed.dialect
        return _verdict(L.MALFORMED_TOOL_CALL, [], evidence, False)

    unusable = schema_problems(tools)
    if unusable:
        evidence["schema_problems"] = unusable
    calls: list[dict[str, Any]]
    if source == "raw":
        calls = [c.to_dict() for c in parsed.calls]
        problems = check_calls(list(parsed.calls), tools)
    else:
        if parsed.found:
            # Well-formed markup left in content: the server's parser failed, not the model.
            evidence.update(
                reason=f"well-formed {parsed.dialect} tool-call markup in content",
                calls=len(parsed.calls),
                dialect=parsed.dialect,
            )
            leaked = [c.to_dict() for c in parsed.calls]
            return _verdict(
                L.PARSER_LEAK, server_calls_as_dicts(server_calls) + leaked, evidence, noncanonical
            )
        calls = server_calls_as_dicts(server_calls)
        problems = check_server_calls(server_calls, tools)
    if problems:
        evidence["problems"] = [p.to_dict() for p in problems]
        evidence["reason"] = problems[0].message
        return _verdict(L.INVALID_TOOL_CALL, calls, evidence, noncanonical)
    if finish_reason == "length":
        return _verdict(L.TRUNCATED, calls, evidence, noncanonical)
    label = L.OK_TOOL_CALL if calls else L.OK_TEXT
    return _verdict(label, calls, evidence, noncanonical)


def _cut_inside(text: str, parsed: ParseResult) -> bool:
    """Whether the output ended inside its tool-call markup: the parse failed where the text
    ends (a truncated block, a marker or an end-of-turn token cut part-way)."""
    if not parsed.found or parsed.ok:
        return False
    if (parsed.error or "").startswith("truncated"):
        return True
    off = parsed.offset
    return off is not None and off >= 0 and len(text) - off <= 40 and "\n" not in text[off:]


def _cut_tag(text: str) -> int:
    """Where a tag cut by the end of the output starts (``<｜DSML｜invoke name="get_wea``,
    ``</｜DSML｜param``): the last ``<`` with no ``>`` after it, near the end; else the end."""
    lt = text.rfind("<", max(0, len(text) - 80))
    return lt if lt >= 0 and ">" not in text[lt:] else len(text)


def _markup_start(content: str, parsed: ParseResult) -> int:
    """Where the markup of a well-formed parse starts (the content before it is prose)."""
    if parsed.dialect in ("", "auto") or parsed.dialect not in registry.names():
        return 0
    off = registry.get(parsed.dialect).first_marker(content)
    return off if off >= 0 else len(content)


def classify_text(
    text: str, context: str | None = None, tools: list[dict[str, Any]] | None = None
) -> Verdict:
    """Classify a raw model output (calls extracted from the text)."""
    return classify_turn(text, tools=tools, source="raw", dialect="auto", context=context)


__all__ = ["Verdict", "classify_turn", "classify_text", "score_bounded", "ToolCall", "dsml"]


#: what a server says when its JSON encoder meets bytes of the generated text that are not
#: UTF-8 (llama.cpp's nlohmann::json: "[json.exception.type_error.316] invalid UTF-8 byte";
#: Python servers: "'utf-8' codec can't decode"): the model produced bytes that are no text
_UNENCODABLE = re.compile(
    r"invalid UTF-?8|incomplete UTF-?8|utf-?8'? codec can'?t (?:de|en)code|"
    r"type_error\.316|surrogates not allowed",
    re.IGNORECASE,
)


def failure_verdict(failure: str) -> Verdict:
    """The verdict of a send that got no answer: a transport failure, except an error the
    server sent (an HTTP status, or an error event mid-stream) in which it says it could not
    encode its own output as UTF-8. That is the
    output's corruption (bytes that are no text, as when a cache read returns another
    sequence's or another layer's values), found exactly by the server's own encoder."""
    said_by_server = failure.startswith(("http_status", "stream_error"))
    found = _UNENCODABLE.search(failure) if said_by_server else None
    if found is None:
        return Verdict(L.TRANSPORT_ERROR, False, evidence={"failure": failure})
    return Verdict(
        L.TOKEN_SALAD,
        True,
        evidence={
            "kind": "unencodable_output",
            "why": "the server could not encode its own output as UTF-8 (its JSON encoder "
            "refused the generated bytes): the model produced bytes that are no text",
            "failure": failure[:300],
        },
        tier=STRUCTURAL,
    )
