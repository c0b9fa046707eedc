"""The simulated model's reasoning (``harness sim --reasoning``), and where the server puts it.

A reasoning model thinks before it answers. Where that text goes depends on the server:

- ``off``: no reasoning (the default);
- ``field``: a reasoning parser on the server: ``reasoning_content`` beside ``content``
  (streamed as ``reasoning_content`` deltas before the answer), as SGLang and vLLM return it;
- ``content``: no reasoning parser: ``<think>...</think>`` at the start of ``content``;
- ``template``: no parser, the block opened by the chat template (R1, V3.1): only the
  closer appears, ``...</think>`` and then the answer.

The text is a few sentences about the turn (what was asked, the last tool result, the call
to make), seeded like the answer, so a conversation sent twice thinks the same thing.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from harness.dialects.base import ToolCall

REASONING = ("off", "field", "content", "template")

_OPEN = (
    "Let me think about what the user needs here.",
    "Okay, so the task is still open.",
    "Hmm, I should look at where we are before answering.",
    "First, let me recall what has been done so far.",
)
_CALL = (
    "The next useful step is to call {name} with {args}.",
    "I'll use {name} now; the arguments should be {args}.",
    "Calling {name} ({args}) should tell me what I am missing.",
)
_PROSE = (
    "I have enough information now, so I can write the answer directly.",
    "No tool is needed for this step; a short summary will do.",
    "I think the right move is to explain the findings clearly.",
)
_CLOSE = (
    "That seems right.",
    "Let me make sure the arguments are valid before sending it.",
    "I'll keep the answer short.",
    "",
)


def think(calls: Sequence[ToolCall], rng: random.Random) -> str:
    """A short reasoning text for a turn that makes ``calls`` (none: a prose answer)."""
    parts = [rng.choice(_OPEN)]
    for call in calls[:2]:
        args = ", ".join(f"{k}={v!r}" for k, v in list(call.arguments.items())[:3])
        parts.append(rng.choice(_CALL).format(name=call.name, args=args or "no arguments"))
    if not calls:
        parts.append(rng.choice(_PROSE))
    parts.append(rng.choice(_CLOSE))
    return " ".join(p for p in parts if p)


def in_content(mode: str, reasoning: str, content: str) -> str:
    """``content`` with the reasoning where a server without a reasoning parser leaves it."""
    if mode == "content":
        return f"<think>\n{reasoning}\n</think>\n\n{content}"
    if mode == "template":
        return f"{reasoning}\n</think>\n\n{content}"
    return content
