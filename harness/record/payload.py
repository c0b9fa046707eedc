"""A growing history's request bodies, each message encoded once.

A session's history only grows: every request holds the messages of the one before and a few
more. Encoding the whole body every turn costs the history's length each time (quadratic
over a session: at 35k tokens, 140 KB encoded again for the 2 KB a turn adds). ``HistoryEncoder``
keeps the encoded bytes of each message it has seen and joins them, so a turn encodes only its
new messages and the few parameters around them. The bytes are exactly ``orjson.dumps`` of the
same payload (``tests/record/test_payload.py`` compares them); whenever they might not be
(a message orjson cannot encode, which the whole body's fallback encoder escapes differently),
``encode`` returns None and the caller encodes the body as a whole.

Messages are taken as immutable once sent (a session only appends to its history): a message
is recognised by its identity, and its bytes are never looked at again. The cache holds the
history's messages and their bytes (about the history's size again) until ``clear``: the
driver clears it when a session hands its slot on, as it drops the history.
"""

from __future__ import annotations

from typing import Any

import orjson

_OPEN = b'{"messages":['


class HistoryEncoder:
    """The encoded messages of one session's history, in order."""

    __slots__ = ("_messages", "_parts")

    def __init__(self) -> None:
        self._messages: list[object] = []  # the message objects encoded, in order
        self._parts: list[bytes] = []  # their bytes

    def clear(self) -> None:
        """Forget the history (its messages and their bytes): a session that ended."""
        self._messages.clear()
        self._parts.clear()

    def __len__(self) -> int:
        return len(self._parts)

    def encode(self, payload: dict[str, Any]) -> bytes | None:
        """``orjson.dumps(payload)``, the messages (its first key) from the cache; None when
        the payload does not start with a list of messages or a message does not encode."""
        messages = payload.get("messages")
        if not isinstance(messages, list) or next(iter(payload)) != "messages":
            return None
        parts = self._parts
        seen = self._messages
        same = 0
        limit = min(len(seen), len(messages))
        while same < limit and seen[same] is messages[same]:
            same += 1
        if same < len(seen):  # a history that is not the one before, grown: start again
            del seen[same:], parts[same:]
        try:
            for message in messages[same:]:
                if not isinstance(message, dict):
                    return None  # (anything else: the whole body's encoder says what)
                # each message after the first with its comma: one join makes the body (a
                # join of the joined messages would copy the history twice, and a body that
                # large is memory the allocator maps afresh each time: 5 times slower)
                parts.append(b"," + orjson.dumps(message) if parts else orjson.dumps(message))
                seen.append(message)
        except (TypeError, orjson.JSONEncodeError):
            return None  # a lone surrogate, nesting too deep: the fallback escapes the body
        rest = {k: v for k, v in payload.items() if k != "messages"}
        try:
            tail = orjson.dumps(rest)
        except (TypeError, orjson.JSONEncodeError):
            return None
        # '{"messages":[' m1 ',m2' ... ']' then ',' and the other keys, or '}'
        close = b"]}" if tail == b"{}" else b"]," + tail[1:]
        return b"".join([_OPEN, *parts, close])
