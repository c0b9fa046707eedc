"""Envelope and value damage for any dialect the simulator writes (DSML has its own list).

The damage is what a corrupted decode does to markup: one marker token lost (the closer, the
opener), a marker token misspelt (a letter or an underscore lost, a space inside it, ASCII
bars for the fullwidth ones or the reverse), typographic quotes, a tool name written twice,
the output ending inside the call; and, for the values, broken JSON (a bracket or a quote
lost, a value written twice). A mangled turn is kept only when the server's parser reads it
differently from the clean one (no calls, or other calls: damage that changes nothing is
not damage) and some of the dialect's markup is left (an envelope erased whole is prose).
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from harness.dialects import registry
from harness.dialects.base import ToolCall
from harness.sim.speaker import Speaker

#: markup tokens: tags and special tokens (``<tool_call>``, ``<|call|>``, ``<｜tool▁sep｜>``,
#: ``<parameter=city>``) and bracketed ones (``[TOOL_CALLS]``, ``[ARGS]``)
_TOKEN = re.compile(r"<[^<>\n]{1,80}>|\[[A-Z_]{3,20}\]")
_CLOSER = re.compile(r"^</|end|\|call\|", re.I)

Tools = Sequence[Mapping[str, Any]] | None
Mutation = Callable[[str, int, Sequence[ToolCall], random.Random], str | None]


def _tokens(text: str, start: int, eos: str) -> list[re.Match[str]]:
    end = len(text) - len(eos) if eos and text.endswith(eos) else len(text)
    return [m for m in _TOKEN.finditer(text, start, end)]


def _structural(tokens: list[re.Match[str]], calls: Sequence[ToolCall]) -> list[re.Match[str]]:
    """The tokens that are the envelope itself, not a name or a key written in a tag
    (``<parameter=city>`` misspelt is another parameter: no envelope damage)."""
    words = {c.name for c in calls} | {k for c in calls for k in c.arguments}
    return [m for m in tokens if "=" not in m[0] and not any(w in m[0] for w in words)]


def _replace(text: str, m: re.Match[str], new: str) -> str:
    return text[: m.start()] + new + text[m.end() :]


def _closer_lost(eos: str) -> Mutation:
    def mutate(text: str, start: int, calls: Sequence[ToolCall], rng: random.Random) -> str | None:
        closers = [m for m in _tokens(text, start, eos) if _CLOSER.search(m.group(0))]
        return _replace(text, rng.choice(closers), "") if closers else None

    return mutate


def _opener_lost(eos: str) -> Mutation:
    def mutate(text: str, start: int, calls: Sequence[ToolCall], rng: random.Random) -> str | None:
        tokens = _tokens(text, start, eos)
        return _replace(text, tokens[0], "") if tokens else None

    return mutate


def _misspelt(eos: str) -> Mutation:
    def mutate(text: str, start: int, calls: Sequence[ToolCall], rng: random.Random) -> str | None:
        tokens = _structural(_tokens(text, start, eos), calls)
        tokens = [m for m in tokens if re.search(r"[A-Za-z_\u2581]{4}", m[0])]
        if not tokens:
            return None
        m = rng.choice(tokens)
        token = m.group(0)
        joints = [i for i, ch in enumerate(token) if ch in "_\u2581"]
        if joints and rng.random() < 0.5:
            i = rng.choice(joints)
        else:
            letters = [i for i, ch in enumerate(token) if ch.isalpha()][1:-1]
            if not letters:
                return None
            i = rng.choice(letters)
        return _replace(text, m, token[:i] + token[i + 1 :])

    return mutate


def _spaced(eos: str) -> Mutation:
    def mutate(text: str, start: int, calls: Sequence[ToolCall], rng: random.Random) -> str | None:
        tokens = _structural(_tokens(text, start, eos), calls)
        if not tokens:
            return None
        m = rng.choice(tokens)
        token = m.group(0)
        return _replace(text, m, token[0] + " " + token[1:])

    return mutate


def _bars(eos: str) -> Mutation:
    def mutate(text: str, start: int, calls: Sequence[ToolCall], rng: random.Random) -> str | None:
        tokens = _structural(_tokens(text, start, eos), calls)
        tokens = [m for m in tokens if "|" in m[0] or "\uff5c" in m[0]]
        if not tokens:
            return None
        m = rng.choice(tokens)
        token = m.group(0)
        swapped = (
            token.replace("\uff5c", "|") if "\uff5c" in token else token.replace("|", "\uff5c")
        )
        return _replace(text, m, swapped)

    return mutate


def _quotes(text: str, start: int, calls: Sequence[ToolCall], rng: random.Random) -> str | None:
    i = text.find('"', start)
    return text[:i] + "\u201c" + text[i + 1 :] if i >= 0 else None


def _doubled_name(
    text: str, start: int, calls: Sequence[ToolCall], rng: random.Random
) -> str | None:
    if not calls:
        return None
    name = rng.choice(list(calls)).name
    i = text.find(name, start)
    return text[:i] + name + text[i:] if i >= 0 else None


def _cut_inside(eos: str) -> Mutation:
    """The output ends inside the call, at a token boundary (never inside a marker: a
    marker is one token, or a few, of the model's vocabulary), after the opener."""

    def mutate(text: str, start: int, calls: Sequence[ToolCall], rng: random.Random) -> str | None:
        body = text[: len(text) - len(eos)] if eos and text.endswith(eos) else text
        tokens = _tokens(body, start, "")
        if not tokens:
            return None
        inside = [i for m in tokens for i in range(m.start() + 1, m.end())]
        after = tokens[0].end()
        cuts = sorted(set(range(after, len(body) - 1)) - set(inside))
        return body[: rng.choice(cuts)] if cuts else None

    return mutate


def mutations(eos: str) -> dict[str, Mutation]:
    return {
        "closer lost": _closer_lost(eos),
        "opener lost": _opener_lost(eos),
        "marker misspelt": _misspelt(eos),
        "space in a marker": _spaced(eos),
        "bars swapped": _bars(eos),
        "typographic quotes": _quotes,
        "tool name doubled": _doubled_name,
        "output cut inside the call": _cut_inside(eos),
    }


def _reads_differently(
    sp: Speaker, text: str, calls: Sequence[ToolCall], tools: Tools = None
) -> bool:
    """The server's parser reads ``text`` otherwise than the clean calls, and some of the
    dialect's markup is left (an envelope erased whole, such as Mistral's one
    ``[TOOL_CALLS]`` token lost, is prose that quotes JSON: not a damaged envelope)."""
    if _first_marker(sp, text) < 0:
        return False
    parsed = sp.parse(text, tools)
    return not (parsed.ok and parsed.found and list(parsed.calls) == list(calls))


def markup_start(sp: Speaker, clean: str, content: str) -> int:
    """Where the calls' markup starts in ``clean`` (after the content)."""
    off = _first_marker(sp, clean)
    return off if off >= 0 else min(len(content), len(clean))


def _first_marker(sp: Speaker, text: str) -> int:
    return int(registry.get(sp.name).first_marker(text))


@dataclass(frozen=True)
class Written:
    """A clean turn as its speaker wrote it: the ``text`` of its ``content`` and ``calls``, and
    the tools the request declared (None: the parser reads the calls against none)."""

    sp: Speaker
    text: str
    content: str
    calls: Sequence[ToolCall]
    tools: Tools = None

    def markup_start(self) -> int:
        return markup_start(self.sp, self.text, self.content)


def broken_envelope(turn: Written, rng: random.Random) -> str | None:
    """The turn's text with one piece of its envelope damaged, or None when nothing applies."""
    sp, clean, calls, tools = turn.sp, turn.text, turn.calls, turn.tools
    start = turn.markup_start()
    table = mutations(sp.eos)
    names = list(table)
    rng.shuffle(names)
    for name in names:
        text = table[name](clean, start, calls, rng)
        if text is not None and text != clean and _reads_differently(sp, text, calls, tools):
            return text
    return None


def _json_forms(value: Any) -> list[str]:
    return list(
        dict.fromkeys(
            json.dumps(value, ensure_ascii=ascii, separators=seps)
            for ascii in (False, True)
            for seps in ((", ", ": "), (",", ":"))
        )
    )


def json_breaks(value: str, rng: random.Random, candidates: Sequence[str]) -> list[str]:
    """Ways to break the JSON ``value``: the ``candidates``, and ``value`` with one of its
    quotes dropped (when it has one), that do not parse."""
    found = list(candidates)
    if '"' in value:
        i = rng.choice([i for i, ch in enumerate(value) if ch == '"'])
        found.append(value[:i] + value[i + 1 :])
    out = []
    for c in found:
        try:
            json.loads(c)
        except ValueError:
            out.append(c)
    return out


def _broken(value: str, rng: random.Random) -> str | None:
    out = json_breaks(value, rng, [value[:-1], "{" + value, value + "}", value + value])
    return rng.choice(out) if out else None


def broken_values(turn: Written, rng: random.Random) -> str | None:
    """The turn's text with the JSON of a call's arguments (or of one non-string value)
    broken, or None when nothing applies."""
    sp, clean, calls, tools = turn.sp, turn.text, turn.calls, turn.tools
    start = turn.markup_start()
    spots: list[tuple[int, str]] = []
    for call in calls:
        values: list[Any] = [call.arguments] if call.arguments else []
        values += [v for v in call.arguments.values() if not isinstance(v, str)]
        for value in values:
            for form in _json_forms(value):
                i = clean.find(form, start)
                if i >= 0:
                    spots.append((i, form))
                    break
    rng.shuffle(spots)
    for i, form in spots:
        broken = _broken(form, rng)
        if broken is None:
            continue
        text = clean[:i] + broken + clean[i + len(form) :]
        if _reads_differently(sp, text, calls, tools):
            return text
    return None
