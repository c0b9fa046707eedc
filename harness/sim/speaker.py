"""The tool-call dialect the simulated model writes, and the server's parser of it.

A ``Speaker`` wraps a registered dialect: ``encode(content, calls)`` writes a canonical raw
turn (end-of-turn token included), ``parse`` is what the server's tool-call parser makes of a
raw output. The dialects' own encoders are used; DeepSeek DSML and Hermes have theirs in
their modules. ``DEFAULT_MODELS`` names a model that serves each dialect, so that a run's
``--dialect auto`` can tell it from ``/v1/models``.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any

from harness.dialects import dsml, hermes, registry
from harness.dialects.base import ParseResult, ToolCall
from harness.errors import UsageError

Encode = Callable[[str, Sequence[ToolCall]], str]

#: a model each dialect is served for (the sim's default --model for that dialect)
DEFAULT_MODELS = {
    "dsml-v4": "deepseek-ai/DeepSeek-V4-Flash",
    "dsml-v32": "deepseek-ai/DeepSeek-V3.2",
    "hermes": "Qwen/Qwen3-8B",
    "qwen3-coder": "Qwen/Qwen3-Coder-30B-A3B-Instruct",
    "glm45": "zai-org/GLM-4.5-Air",
    "glm47": "zai-org/GLM-4.7-Flash",
    "kimi-k2": "moonshotai/Kimi-K2-Instruct",
    "gpt-oss": "openai/gpt-oss-20b",
    "mistral": "mistralai/Mistral-7B-Instruct-v0.3",
    "mistral-v11": "mistralai/Magistral-Small-2509",
    "llama3-json": "meta-llama/Llama-3.1-8B-Instruct",
    "llama4-pythonic": "meta-llama/Llama-4-Scout-17B-16E-Instruct",
    "deepseek-v3": "deepseek-ai/DeepSeek-R1-0528",
    "deepseek-v31": "deepseek-ai/DeepSeek-V3.1",
    "minimax-m2": "MiniMaxAI/MiniMax-M2",
}

_OWN_ENCODERS: dict[str, Encode] = {
    "dsml-v4": lambda content, calls: dsml.encode_turn(content, list(calls), "v4"),
    "dsml-v32": lambda content, calls: dsml.encode_turn(content, list(calls), "v32"),
    "hermes": lambda content, calls: hermes.encode_turn(content, list(calls)),
}
#: names that are not a dialect a model writes
_NOT_SPOKEN = {"auto", "dsml", "json", "none"}


@dataclass(frozen=True)
class Speaker:
    name: str
    encode: Encode
    eos: str  # the token that ends a prose answer ("" if none; gpt-oss ends a call otherwise)
    single_call: bool = False  # one call per completion (gpt-oss: ``<|call|>`` stops it)
    calls_only: bool = False  # a tool-call turn holds the calls alone (Llama 3 JSON, pythonic)

    @property
    def coerces(self) -> bool:
        """Whether the server's parser types the values by the tools' schemas (a dialect
        that writes strings raw: ``42`` for a string parameter becomes ``"42"``)."""
        return _takes_tools(self.name)

    def parse(self, text: str, tools: Sequence[Mapping[str, Any]] | None = None) -> ParseResult:
        """What the server's tool-call parser for this dialect makes of ``text``."""
        dialect: Any = registry.get(self.name)
        if tools is not None and self.coerces:
            return dialect.parse(text, tools=list(tools))  # type: ignore[no-any-return]
        return dialect.parse(text)  # type: ignore[no-any-return]


@cache
def _takes_tools(name: str) -> bool:
    try:
        return "tools" in inspect.signature(registry.get(name).parse).parameters
    except (TypeError, ValueError):
        return False


def _encoder(name: str) -> Encode | None:
    own = getattr(registry.get(name), "encode", None)
    if callable(own):
        return lambda content, calls: str(own(content, list(calls)))
    return _OWN_ENCODERS.get(name)


def spoken() -> list[str]:
    """The registered dialects the simulator can write (the ones with an encoder)."""
    return [n for n in registry.names() if n not in _NOT_SPOKEN and _encoder(n) is not None]


@cache
def speaker(name: str) -> Speaker:
    if name in _NOT_SPOKEN or name not in registry.names():
        raise UsageError(f"the simulator cannot write dialect {name!r}: use one of "
                         f"{', '.join(spoken())}")  # fmt: skip
    encode = _encoder(name)
    if encode is None:
        raise UsageError(f"dialect {name!r} has no encoder: the simulator writes "
                         f"{', '.join(spoken())}")  # fmt: skip
    answer = encode("zq", [])  # a prose answer: what follows its text ends the turn
    eos = answer[answer.rfind("zq") + 2 :]
    return Speaker(name, encode, eos, _refuses(encode, "", 2), _refuses(encode, "zq", 1))


def _refuses(encode: Encode, content: str, calls: int) -> bool:
    """Whether the dialect cannot write ``calls`` calls after ``content`` (its encoder says
    so with a ValueError)."""
    try:
        encode(content, [ToolCall("probe", {})] * calls)
    except ValueError:
        return True
    return False
