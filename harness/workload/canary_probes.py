"""The canary probes: fixed texts (a prompt and a continuation) scored teacher-forced.

Prose, code, a DSML tool call, and long contexts (the same continuation after a prompt
grown to a share of the scenario's ``max_context``, up to all of it) -- long contexts are
where a cache read that races does its damage -- and, during the load, prefixes of the
sessions' own healthy turns (``session_probe``: the workload's own text). The fixed texts
are deterministic, so the probes of two runs are the same; sizes are in the harness's
estimate of about four characters a token.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from harness.dialects import dsml
from harness.dialects.base import ToolCall
from harness.errors import UsageError
from harness.workload.scenario import Scenario

CHARS_PER_TOKEN = 4
#: Shares of the scenario's max_context the long-context probes reach.
LONG_SHARES = (0.125, 0.5, 1.0)
PROBE_KINDS = ("prose", "code", "dsml", "long")

_PROSE = (
    "The river rose through the night, and by morning the low fields were a single sheet of "
    "grey water. The farmers moved their animals to the ridge and waited."
)
_PROSE_NEXT = (
    " When the rain stopped, they walked the dykes together, counting the breaches and "
    "deciding which to mend first, because the next storm was already on the radio."
)
_CODE = 'def mean(values: list[float]) -> float:\n    """The arithmetic mean."""\n'
_CODE_NEXT = (
    '    if not values:\n        raise ValueError("mean of nothing")\n'
    "    return sum(values) / len(values)\n"
)
_TOOL_PROMPT = "Run the reproduction script, then list the log folder.\n\n"
_FILLER = (
    "Section {i}. The archive keeps every report the team filed about the deployment: the "
    "dates, the servers involved, the versions that ran, what was seen and what was done. "
)


@dataclass(frozen=True)
class Probe:
    name: str
    prompt: str
    continuation: str

    @property
    def approx_tokens(self) -> int:
        return (len(self.prompt) + len(self.continuation)) // CHARS_PER_TOKEN


def _filler(tokens: int) -> str:
    out: list[str] = []
    size = 0
    i = 0
    while size < tokens * CHARS_PER_TOKEN:
        piece = _FILLER.format(i=i)
        out.append(piece)
        size += len(piece)
        i += 1
    return "".join(out)


def probes(scenario: Scenario, kinds: tuple[str, ...] = PROBE_KINDS) -> list[Probe]:
    """The probes of ``kinds`` for ``scenario`` (its max_context bounds the long ones)."""
    unknown = [k for k in kinds if k not in PROBE_KINDS]
    if unknown:
        raise UsageError(f"unknown canary probe kind {unknown[0]!r}: use {', '.join(PROBE_KINDS)}")
    calls = (ToolCall("run_shell", {"command": "echo hello-repro"}),
             ToolCall("list_dir", {"path": "logs/"}))  # fmt: skip
    out: list[Probe] = []
    if "prose" in kinds:
        out.append(Probe("prose", _PROSE, _PROSE_NEXT))
    if "code" in kinds:
        out.append(Probe("code", _CODE, _CODE_NEXT))
    if "dsml" in kinds:
        out.append(Probe("dsml", _TOOL_PROMPT, dsml.encode_block(list(calls), "v4")))
    if "long" in kinds:
        for share in LONG_SHARES:
            tokens = max(int(scenario.max_context * share) - 64, 64)
            name = f"long_{tokens // 1000}k" if tokens >= 1000 else f"long_{tokens}"
            out.append(Probe(name, _filler(tokens) + "\n\n" + _PROSE, _PROSE_NEXT))
    return out


#: The shortest healthy turn a session probe is made of (characters).
SESSION_MIN_CHARS = 160


def session_probe(record: Mapping[str, Any], index: int) -> Probe | None:
    """A probe of one of the sessions' own healthy turns (its text cut in two: the first half
    the prompt, the second the continuation), or None when the turn is not one."""
    if record.get("corrupted") or record.get("transport_error") or record.get("attempt"):
        return None
    if not str(record.get("label", "")).startswith("ok_"):
        return None
    text = str(record.get("content") or "")
    calls = record.get("tool_calls") or []
    if calls:
        text += "\n" + json.dumps(calls, ensure_ascii=False, sort_keys=True)
    if len(text) < SESSION_MIN_CHARS:
        return None
    half = len(text) // 2
    cut = text.rfind(" ", 0, half)
    cut = cut if cut > half // 2 else half
    return Probe(f"session_{index}", text[:cut], text[cut:])
