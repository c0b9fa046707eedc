"""Token estimates, conversation hashing and the prefix cache of the simulated server.

Every message is hashed once per request into a chain (``h_i = H(h_{i-1} + message_i)``), so
``h_i`` names the whole prefix up to message ``i``. The prefix cache remembers chain hashes
with the tokens each message adds, evicts least recently used entries (leaves before their
parents, like a radix cache) to stay under a token capacity, and answers "how many tokens
of this prompt were already seen".
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

CHARS_PER_TOKEN = 4
MESSAGE_OVERHEAD = 4  # role and turn tokens around each message
TOOLS_OVERHEAD = 8


def estimate_tokens(text: str) -> int:
    """A cheap, consistent token estimate: about four characters per token."""
    return (len(text) + CHARS_PER_TOKEN - 1) // CHARS_PER_TOKEN


def content_text(content: Any) -> str:
    """The text of an OpenAI message ``content`` (a string, a list of parts, or null)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, Mapping) and isinstance(part.get("text"), str):
                parts.append(part["text"])
            elif isinstance(part, str):
                parts.append(part)
        return "".join(parts)
    return str(content)


def refresh(entries: OrderedDict[bytes, int], prompt: Prompt) -> list[tuple[bytes, int]]:
    """Make every prefix of ``prompt`` the most recent in ``entries`` (an LRU of prefix keys
    and their tokens), the leaf first so that parents end up more recent than children; add
    the ones missing, and return those (key, tokens), leaf first."""
    added = []
    for i in range(len(prompt.chain) - 1, -1, -1):
        key = prompt.chain[i]
        if key in entries:
            entries.move_to_end(key)
        else:
            entries[key] = prompt.tokens[i]
            added.append((key, prompt.tokens[i]))
    return added


def call_parts(message: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(name, canonical arguments JSON) of an assistant message's ``tool_calls``."""
    calls = message.get("tool_calls")
    if not isinstance(calls, list):
        return []
    out = []
    for call in calls:
        fn = call.get("function") if isinstance(call, Mapping) else None
        if not isinstance(fn, Mapping):
            continue
        name = str(fn.get("name", ""))
        args = fn.get("arguments", "")
        if isinstance(args, str):
            try:
                args = orjson.loads(args) if args else {}
            except orjson.JSONDecodeError:
                out.append((name, args))
                continue
        out.append((name, orjson.dumps(args, option=orjson.OPT_SORT_KEYS).decode()))
    return out


def message_key(role: str, text: str, calls: Sequence[tuple[str, str]]) -> tuple[bytes, int]:
    """Canonical bytes of one message (ids ignored) and its token estimate."""
    data = orjson.dumps([role, text, list(calls)])
    tokens = estimate_tokens(text) + MESSAGE_OVERHEAD
    for name, args in calls:
        tokens += estimate_tokens(name) + estimate_tokens(args) + 2
    return data, tokens


def _h(prev: bytes, data: bytes) -> bytes:
    return hashlib.blake2b(prev + data, digest_size=16).digest()


@dataclass(frozen=True)
class Prompt:
    """One request's prompt, hashed: ``chain[i]`` names the prefix ending at entry ``i``.

    Entry 0 is the tool declarations (the system prompt's tool section); entry ``i >= 1`` is
    message ``i - 1``. ``tokens[i]`` is the tokens entry ``i`` adds; ``cumulative[i]`` the
    tokens of the prefix ending there.
    """

    chain: tuple[bytes, ...]
    tokens: tuple[int, ...]
    cumulative: tuple[int, ...]

    @property
    def total(self) -> int:
        return self.cumulative[-1]

    @property
    def digest(self) -> bytes:
        return self.chain[-1]

    def extended(self, data: bytes, tokens: int) -> Prompt:
        """This prompt followed by one more message (the answer, once generated)."""
        return Prompt(
            self.chain + (_h(self.chain[-1], data),),
            self.tokens + (tokens,),
            self.cumulative + (self.cumulative[-1] + tokens,),
        )


def hash_prompt(messages: Sequence[Mapping[str, Any]], tools_bytes: bytes) -> Prompt:
    """Hash each message once; ``tools_bytes`` is the raw JSON of the declared tools."""
    tools_tokens = estimate_tokens(tools_bytes.decode("utf-8", "replace")) + TOOLS_OVERHEAD
    head = _h(b"tools", tools_bytes)
    chain = [head]
    tokens = [tools_tokens if tools_bytes not in (b"", b"null", b"[]") else 0]
    for message in messages:
        data, n = message_key(
            str(message.get("role", "")), content_text(message.get("content")), call_parts(message)
        )
        chain.append(_h(chain[-1], data))
        tokens.append(n)
    cumulative = []
    total = 0
    for n in tokens:
        total += n
        cumulative.append(total)
    return Prompt(tuple(chain), tuple(tokens), tuple(cumulative))


class PrefixCache:
    """Chain hashes of prompts seen, LRU-bounded by the tokens they hold."""

    def __init__(self, capacity_tokens: int) -> None:
        self.capacity = capacity_tokens
        self._entries: OrderedDict[bytes, int] = OrderedDict()
        self.tokens = 0

    def __len__(self) -> int:
        return len(self._entries)

    def cached_tokens(self, prompt: Prompt) -> int:
        """Tokens of the longest prefix of ``prompt`` already in the cache."""
        for i in range(len(prompt.chain) - 1, -1, -1):
            if prompt.chain[i] in self._entries:
                return prompt.cumulative[i]
        return 0

    def insert(self, prompt: Prompt) -> None:
        """Remember every prefix of ``prompt``; parents end up more recent than children."""
        entries = self._entries
        for _, n in refresh(entries, prompt):
            self.tokens += n
        while self.tokens > self.capacity and entries:
            _, n = entries.popitem(last=False)
            self.tokens -= n

    def flush(self) -> None:
        self._entries.clear()
        self.tokens = 0
