"""In-band passkeys (``--passkeys``): a fact the model cannot guess, planted early in a
session and asked back later as a tool-call argument, so the check is exact.

The passkey is a random id drawn from the session's seed (``pk-`` and 12 hex digits). The
first tool result of the session carries it (``PASSKEY: pk-...``); the tool results of turn
``ask_turn`` end with a line asking the model to call ``report_passkey`` with it before
anything else, and the answer of the next turn is checked: ``right`` (a ``report_passkey``
call with the planted id), ``wrong`` (a call with another value) or ``missing`` (no such
call). With the flag off nothing here touches a request.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Any

TOOL = "report_passkey"
PLANT_TURN = 0  # the results of this turn carry the passkey
RIGHT, WRONG, MISSING = "right", "wrong", "missing"
NOT_ASKED = "not_asked"  # the session ended before the turn that answers the ask

#: the OpenAI ``tools`` entry the sessions add with ``--passkeys``
OPENAI_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": TOOL,
        "description": "Report the session passkey you were given earlier, exactly as given.",
        "parameters": {
            "type": "object",
            "properties": {"passkey": {"type": "string", "description": "the passkey, verbatim"}},
            "required": ["passkey"],
        },
    },
}
RESULT = "passkey recorded"  # what the tool answers


def passkey_for(seed: int) -> str:
    """The session's passkey: unguessable without its seed."""
    return "pk-" + hashlib.blake2b(f"passkey|{seed}".encode(), digest_size=6).hexdigest()


def ask_turn(steps: int, max_turns: int) -> int:
    """The turn whose tool results ask for the passkey (the next turn's answer is checked):
    half way through the planned tool-call turns, at least one turn after the plant."""
    return max(PLANT_TURN + 1, min(steps, max_turns) // 2)


def plant_text(key: str) -> str:
    return f"\n\nPASSKEY: {key} (this session's id: keep it, you will be asked for it)"


ASK_TEXT = (
    f"\n\nBefore anything else, call {TOOL} with the passkey you were given earlier in this "
    "session."
)


def check(tool_calls: Sequence[Mapping[str, Any]] | None, expected: str) -> tuple[str, Any]:
    """(status, the value the model gave) of one answer to the ask."""
    for call in tool_calls or []:
        fn = call.get("function")
        c: Mapping[str, Any] = fn if isinstance(fn, Mapping) else call
        if c.get("name") != TOOL:
            continue
        args = c.get("arguments")
        if isinstance(args, str):
            try:
                args = json.loads(args)
            except json.JSONDecodeError:
                return WRONG, args
        got = args.get("passkey") if isinstance(args, Mapping) else None
        return (RIGHT if got == expected else WRONG), got
    return MISSING, None
