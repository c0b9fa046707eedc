"""Turn a clean assistant turn into a corrupted one of a given kind.

Every function returns raw model text (what the server's parser sees). Envelope, JSON and
schema faults need a tool call; for prose turns they fall back to salad. JSON faults need a
``string="false"`` parameter; without one they fall back to an envelope fault.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from harness.dialects import dsml
from harness.dialects.base import ToolCall
from harness.dialects.dsml import MARK, encode_turn
from harness.sim import envelopes, salad
from harness.sim.agent import Tool, Turn
from harness.sim.args import ArgMaker, schema_type
from harness.sim.speaker import Speaker, speaker

CHARS_PER_TOKEN = 4


@dataclass(frozen=True)
class Injected:
    raw: str
    kind: str
    hit_limit: bool = False  # the output ran to max_tokens


def inject(
    kind: str,
    turn: Turn,
    tools: Sequence[Tool],
    rng: random.Random,
    maker: ArgMaker,
    max_tokens: int,
    sp: Speaker | None = None,
) -> Injected:
    """``sp``: the dialect the turn is written in (default: DSML V4)."""
    sp = sp or speaker("dsml-v4")
    dsml_turn = sp.name.startswith("dsml")
    clean = sp.encode(turn.content, turn.calls)
    declared = [{"type": "function", "function": {"name": t.name, "parameters": t.parameters}}
                for t in tools]  # fmt: skip
    written = envelopes.Written(sp, clean, turn.content, turn.calls, declared)
    limit = max_tokens * CHARS_PER_TOKEN
    if kind in ("envelope", "json", "schema") and not turn.calls:
        kind = "salad"
    if kind == "json":
        raw = (
            broken_json(turn, tools, rng, maker, sp)
            if dsml_turn
            else envelopes.broken_values(written, rng)
        )
        if raw is not None:
            return Injected(raw, "json")
        kind = "envelope"
    if kind == "envelope":
        if dsml_turn:
            return Injected(broken_envelope(clean, rng), "envelope")
        raw = envelopes.broken_envelope(written, rng)
        if raw is not None:
            return Injected(raw, "envelope")
        kind = "salad"
    if kind == "schema":
        return Injected(schema_violation(turn, tools, rng, sp), "schema")
    if kind == "repetition":
        start = clean[: salad.cut_point(rng, turn.content or clean, 0.3, 1.0, sp.eos)]
        if not turn.content:
            start = ""
        words = re.findall(r"`([^`]+)`", turn.content) or re.findall(r"[A-Za-z_]{5,}", clean)
        loop = salad.repetition(rng, turn.content, words, max(0, limit - len(start)))
        return Injected(start + loop, "repetition", hit_limit=True)
    if kind == "debris":
        return _debris(turn, clean, rng, limit, sp)
    if kind == "soup":
        return _soup(clean, rng, sp.eos)
    return _salad(clean, rng, limit, sp.eos)


def _soup(clean: str, rng: random.Random, eos: str) -> Injected:
    """Short cross-script sub-word soup: the answer cut, 20 to 120 characters of salad, the
    end of the turn (what a KV fault leaves when it hits the last tokens)."""
    start = clean[: salad.cut_point(rng, clean, 0.3, 0.9, eos)]
    return Injected(start + salad.salad(rng, rng.randint(20, 120)) + eos, "soup")


def _salad(clean: str, rng: random.Random, limit: int, eos: str) -> Injected:
    start = clean[: salad.cut_point(rng, clean, 0.15, 0.7, eos)]
    runs_out = rng.random() < 0.3
    n = limit - len(start) if runs_out else rng.randint(80, 400) * 3
    n = max(40, min(n, limit - len(start)))
    text = start + salad.salad(rng, n)
    return Injected(text if runs_out else text + eos, "salad", hit_limit=runs_out)


def _debris(turn: Turn, clean: str, rng: random.Random, limit: int, sp: Speaker) -> Injected:
    burst = salad.debris_run(rng) + salad.salad(rng, rng.randint(30, 120), debris=0.15)
    if turn.calls and not sp.calls_only and rng.random() < 0.5:
        # debris inside the content, the block itself intact
        content = turn.content
        cut = salad.cut_point(rng, content, 0.3, 1.0, sp.eos) if content else 0
        dirty = content[:cut] + burst + content[cut:]
        return Injected(sp.encode(dirty, turn.calls), "debris")
    start = clean[: salad.cut_point(rng, clean, 0.1, 0.6, sp.eos)]
    tail = salad.salad(rng, min(rng.randint(200, 900), max(40, limit - len(start))), debris=0.1)
    return Injected(start + burst + tail + sp.eos, "debris")


# ----------------------------------------------------------------------------- envelope

_OPEN = f"<{MARK}tool_calls>"
_CLOSE = f"</{MARK}tool_calls>"


def _once(old: str, new: str) -> Callable[[str, random.Random], str]:
    return lambda text, rng: text.replace(old, new, 1)


def _nth_marker(new: str) -> Callable[[str, random.Random], str]:
    def mutate(text: str, rng: random.Random) -> str:
        spots = [m.start() for m in re.finditer(re.escape(MARK), text)]
        i = rng.choice(spots)
        return text[:i] + new + text[i + len(MARK) :]

    return mutate


def _quotes(text: str, rng: random.Random) -> str:
    return re.sub(r'invoke name="([^"]*)"', "invoke name=\u201c\\1\u201d", text, count=1)


def _drop_invoke_opener(text: str, rng: random.Random) -> str:
    return re.sub(rf'<{MARK}invoke name="[^"]*">\n', "", text, count=1)


def _drop_string_attr(text: str, rng: random.Random) -> str:
    return re.sub(r' string="(?:true|false)">', ">", text, count=1)


ENVELOPE_MUTATIONS: dict[str, Callable[[str, random.Random], str]] = {
    "block name toolcalls": _once(_OPEN, f"<{MARK}toolcalls>"),
    "block name calls": _once(_OPEN, f"<{MARK}calls>"),
    "closer renamed": _once(_CLOSE, f"</{MARK}toolcalls>"),
    "marker lost": _once(_OPEN, "< calls>"),
    "doubled bars": _nth_marker("\uff5c\uff5cDSML\uff5c\uff5c"),
    "ascii bars": _nth_marker("|DSML|"),
    "double vertical line": _nth_marker("\u2016DSML\u2016"),
    "space after marker": _nth_marker(MARK + " "),
    "typographic quotes": _quotes,
    "missing invoke opener": _drop_invoke_opener,
    "parameter without string=": _drop_string_attr,
    "parameter without marker": _once(f"<{MARK}parameter", "<parameter"),
    "mixed dialects": _once(_CLOSE, f"</{MARK}function_calls>"),
}


def broken_envelope(clean: str, rng: random.Random) -> str:
    """One token of the envelope wrong, arguments untouched; never parses."""
    names = list(ENVELOPE_MUTATIONS)
    rng.shuffle(names)
    for name in names:
        text = ENVELOPE_MUTATIONS[name](clean, rng)
        if text != clean and not dsml.parse(text, "v4").ok:
            return text
    return clean.replace(_OPEN, "< calls>", 1)  # unreachable for a turn with calls


# ----------------------------------------------------------------------------- json

_JSON_PARAM = re.compile(
    rf'(<{MARK}parameter name="[^"]*" string="false">)(.*?)(</{MARK}parameter>)', re.S
)


def _broken_values(value: str, rng: random.Random) -> list[str]:
    candidates = [value + value, value + value + value, value[:-1], "{" + value, value + "}"]
    return envelopes.json_breaks(value, rng, candidates)


def broken_json(
    turn: Turn,
    tools: Sequence[Tool],
    rng: random.Random,
    maker: ArgMaker,
    sp: Speaker | None = None,
) -> str | None:
    """A ``string="false"`` argument with broken JSON, or None when no call can have one."""
    by_name = {t.name: t for t in tools}
    calls = list(turn.calls)
    if not any(not isinstance(v, str) for c in calls for v in c.arguments.values()):
        for i, call in enumerate(calls):
            tool = by_name.get(call.name)
            props = (tool.parameters.get("properties") or {}) if tool else {}
            extra = {
                k: maker.value(call.name, k, s)
                for k, s in props.items()
                if k not in call.arguments and schema_type(s) not in ("string", "enum", "const")
            }
            extra = {k: v for k, v in extra.items() if not isinstance(v, str)}
            if extra:
                calls[i] = ToolCall(call.name, {**call.arguments, **extra})
                break
        else:
            return None
    text = sp.encode(turn.content, calls) if sp is not None else encode_turn(turn.content, calls)
    spots = list(_JSON_PARAM.finditer(text))
    if not spots:
        return None
    m = rng.choice(spots)
    broken = rng.choice(_broken_values(m.group(2), rng))
    return text[: m.start(2)] + broken + text[m.end(2) :]


# ----------------------------------------------------------------------------- schema

_PLAIN_TYPES = ("string", "integer", "number", "boolean", "array", "object")
_OTHER_NAMES = ["execute_command", "open_file", "grep_repo", "read_files", "shell"]


def schema_violation(
    turn: Turn, tools: Sequence[Tool], rng: random.Random, sp: Speaker | None = None
) -> str:
    """A well-formed turn (DSML unless ``sp``) whose first call breaks the declared schema."""
    by_name = {t.name: t for t in tools}
    call = turn.calls[0]
    params = by_name[call.name].parameters if call.name in by_name else {}
    props = params.get("properties") or {}
    required = [k for k in params.get("required") or () if k in call.arguments]
    options = ["unknown tool"]
    typed = [k for k in call.arguments if k in props and schema_type(props[k]) in _PLAIN_TYPES]
    if sp is not None and sp.coerces:  # its server turns a number for a string into the string
        typed = [k for k in typed if schema_type(props[k]) != "string"]
    if typed:
        options.append("wrong type")
    if required:
        options.append("missing required")
    choice = rng.choice(options)
    args = dict(call.arguments)
    name = call.name
    if choice == "unknown tool":
        candidates = [name + "s", name.replace("_", ""), name[:-1], *_OTHER_NAMES]
        name = rng.choice([c for c in candidates if c and c not in by_name])
    elif choice == "wrong type":
        key = rng.choice(typed)
        kind = schema_type(props[key])
        args[key] = rng.choice(["all", "ten", "yes"]) if kind != "string" else rng.randint(2, 99)
    else:
        del args[rng.choice(required)]
    calls = [ToolCall(name, args), *turn.calls[1:]]
    return sp.encode(turn.content, calls) if sp is not None else encode_turn(turn.content, calls)
