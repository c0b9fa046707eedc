"""Reasoning inside a turn's content: split off, judged as text of its own, never debris.

A reasoning model writes its reasoning before the answer. A server with a reasoning parser
returns it apart (``reasoning_content``, ``reasoning``); without one it stays in ``content``,
in one of these forms:

* a think block at the start: ``<think>...</think>`` (DeepSeek R1/V3.1/V4, Qwen3, QwQ,
  GLM, MiniMax), ``<thinking>...</thinking>``, ``<seed:think>...</seed:think>``, Kimi's
  ``◁think▷...◁/think▷``;
* the block opened by the chat template (R1, V3.1 thinking mode): the output starts inside
  the block, so only its closer appears, at the end of a line: ``reasoning...</think>\n
  answer`` (a closer glued to text, or after chat-token debris, is debris itself);
* gpt-oss Harmony channels: ``<|channel|>analysis<|message|>...<|end|>`` messages before the
  final answer or the call (``<|start|>assistant<|channel|>final<|message|>...``).

``split`` returns the reasoning and the answer with their offsets in the content. The answer
is what the dialect parsers read (a tool call after the reasoning is parsed as usual), and the
two parts are scored by the text detector one at a time: the markup itself is never evidence
of salad. Broken reasoning markup is: a block opened in the middle of the answer and never
closed, a closer with no block, a marker glued between two letters (``Par</think>is``). Tags
in code (fenced blocks, inline code) and inside the tool-call markup are literals.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from harness.dialects import registry
from harness.dialects.markup import mask_fences
from harness.verdict.detector.salad import SPECIAL

#: (opener, closer) of each think-block family.
_PAIRS = (
    ("<think>", "</think>"),
    ("<thinking>", "</thinking>"),
    ("<seed:think>", "</seed:think>"),
    ("\u25c1think\u25b7", "\u25c1/think\u25b7"),
)
_OPENERS = {o: c for o, c in _PAIRS}
_CLOSERS = {c: o for o, c in _PAIRS}
_TAG = re.compile("|".join(re.escape(t) for pair in _PAIRS for t in pair), re.IGNORECASE)
_INLINE = re.compile(r"`(`?)[^`\n]{1,300}?`\1")
_HARMONY_ANALYSIS = re.compile(
    r"\s*(?:<\|start\|>assistant)?<\|channel\|>analysis<\|message\|>(.*?)<\|end\|>", re.S
)
_HARMONY_FINAL = re.compile(
    r"\s*(?:<\|start\|>assistant)?<\|channel\|>final<\|message\|>(.*?)(?:<\|return\|>|<\|end\|>)?\s*\Z",
    re.S,
)

THINK = "think"  # a think block at the start
OPEN_BY_TEMPLATE = "open_by_template"  # only the closer: the template opened the block
HARMONY = "harmony"  # gpt-oss analysis channel


@dataclass(frozen=True)
class Split:
    """``content`` = ... reasoning ... answer; offsets into the content."""

    reasoning: str = ""
    answer: str = ""
    answer_start: int = 0
    reasoning_start: int = 0
    form: str = ""  # "" (no reasoning in the content) | THINK | OPEN_BY_TEMPLATE | HARMONY
    closed: bool = True  # False: a block at the start never closed (the output is all reasoning)
    #: broken reasoning markup in the answer: (offset in the content, what)
    broken: tuple[int, str] | None = None


def literal_mask(text: str) -> str:
    """``text`` with fenced code and inline code spans blanked (same length)."""
    masked = mask_fences(text)
    if "`" in masked:
        masked = _INLINE.sub(lambda m: " " * len(m.group(0)), masked)
    return masked


def _tags(text: str) -> list[re.Match[str]]:
    if not _tags_possible(text):
        return []
    return _without_sections(list(_TAG.finditer(literal_mask(text))))


def _without_sections(tags: list[re.Match[str]]) -> list[re.Match[str]]:
    """``tags`` less the sections an answer writes: a capitalized opener after the start
    (``<Thinking>``, ``<THINKING>``), not glued into a word, closed by the same spelling's
    closer next, or the last tag at the start of a line (the output ended inside the
    section: a token limit). A reasoning marker is a chat template's token, lower case; a
    section a prompt asked for is content, a heading in angle brackets. Unclosed anywhere
    else, or at the very start, it is read as before."""
    out: list[re.Match[str]] = []
    i = 0
    while i < len(tags):
        t = tags[i]
        word, text = t.group(0), t.string
        nxt = tags[i + 1].group(0) if i + 1 < len(tags) else None
        capital = (
            word != word.lower()
            and word.lower() in _OPENERS
            and text[: t.start()].strip() != ""
            and not _glued(text, t)
        )
        if capital and nxt == word[:1] + "/" + word[1:]:
            i += 2
            continue
        if capital and nxt is None and text[: t.start()].endswith("\n"):
            i += 1
            continue
        out.append(tags[i])
        i += 1
    return out


def _harmony(content: str) -> Split | None:
    pieces: list[str] = []
    pos, first = 0, -1
    while True:
        m = _HARMONY_ANALYSIS.match(content, pos)
        if m is None:
            break
        first = m.start(1) if first < 0 else first
        pieces.append(m.group(1))
        pos = m.end()
    if not pieces:
        return None
    final = _HARMONY_FINAL.match(content, pos)
    if final is not None:  # the answer's wrapper is the server's to strip, not the model's text
        return Split("\n".join(pieces), final.group(1), final.start(1), first, HARMONY)
    start = len(content) - len(content[pos:].lstrip())
    return Split("\n".join(pieces), content[start:], start, first, HARMONY)


def split(content: str) -> Split:
    """The reasoning and the answer of ``content``. A ``broken`` mark may point into tool-call
    markup, where a tag is a literal of the call's arguments: the caller decides."""
    if "<|channel|>analysis" in content[:200]:
        found = _harmony(content)
        if found is not None:
            return found
    tags = _tags(content)
    if not tags:
        return Split(answer=content)
    first = tags[0]
    word = first.group(0).lower()
    lead = content[: first.start()]
    out = Split(answer=content)
    rest = tags
    if word in _OPENERS and not lead.strip():
        closer = _OPENERS[word]
        close = next((t for t in tags[1:] if t.group(0).lower() == closer), None)
        if close is None:
            if len(tags) == 1:  # still thinking when the output ended: all reasoning
                return Split(content[first.end() :], "", len(content), first.end(), THINK,
                             closed=False)  # fmt: skip
            return Split(answer=content, broken=(tags[1].start(), _what(tags[1])))
        start = _skip_ws(content, close.end())
        out = Split(content[first.end() : close.start()], content[start:], start, first.end(),
                    THINK)  # fmt: skip
        rest = [t for t in tags if t.start() >= close.end()]
        inner = [t for t in tags if first.end() <= t.start() < close.start()]
        if inner:  # a tag inside the block: another opener, a closer of another family
            return Split(answer=content, broken=(inner[0].start(), _what(inner[0])))
    elif (
        word in _CLOSERS
        and not any(t.group(0).lower() in _OPENERS for t in tags)
        and _ends_reasoning(content, first)
        and first.start() < _markup_start(content)
    ):
        start = _skip_ws(content, first.end())
        out = Split(lead, content[start:], start, 0, OPEN_BY_TEMPLATE)
        rest = tags[1:]
    if rest:
        t = rest[0]
        return Split(out.reasoning, out.answer, out.answer_start, out.reasoning_start,
                     out.form, broken=(t.start(), _what(t)))  # fmt: skip
    return out


def _markup_start(text: str) -> int:
    """Where tool-call markup of any dialect starts (a closer after it is an argument's)."""
    name = registry.detect(text)
    if name in ("none", "auto"):
        return len(text)
    at = registry.get(name).first_marker(text)
    return at if at >= 0 else len(text)


def neutral(text: str) -> str:
    """``text`` with every reasoning tag in parentheses (``(think)``, the same length): this
    module judges the tags, the text detector's debris scan must not see them again."""
    if not _tags_possible(text):
        return text
    return _TAG.sub(lambda m: m.group(0).translate(_PARENS), text)


_PARENS = str.maketrans("<>\u25c1\u25b7", "()()")


def _tags_possible(text: str) -> bool:
    return "hink" in text or "HINK" in text


def _ends_reasoning(text: str, closer: re.Match[str]) -> bool:
    """Whether a closer with no opener can end reasoning the template opened: followed by a
    line break or the end (``...</think>\n\nanswer``), not glued into a word, and no
    special-token debris before it (a closer among chat tokens is debris, not a block)."""
    after = text[closer.end() : closer.end() + 1]
    if after not in ("", "\n", "\r") or _glued(text, closer):
        return False
    return SPECIAL.search(text, 0, closer.start()) is None


def _what(tag: re.Match[str]) -> str:
    text = tag.group(0)
    if _glued(tag.string, tag):
        return f"reasoning marker {text!r} glued into the text"
    if text.lower() in _OPENERS:
        return f"reasoning block {text!r} opened inside the answer"
    return f"reasoning marker {text!r} with no block to close"


def _glued(text: str, tag: re.Match[str]) -> bool:
    a, b = tag.start(), tag.end()
    return a > 0 and b < len(text) and text[a - 1].isalnum() and text[b].isalnum()


def _skip_ws(text: str, pos: int) -> int:
    while pos < len(text) and text[pos].isspace():
        pos += 1
    return pos
