"""The registry: every dialect and alias, what a served model's name implies, auto detection."""

from __future__ import annotations

from typing import Any

import pytest

from harness.dialects import deepseek_v3, glm, mistral, registry
from harness.dialects.base import ToolCall
from harness.errors import UsageError

MODELS = [
    ("Qwen/Qwen3-Coder-30B-A3B-Instruct", "qwen3-coder"),
    ("Qwen/Qwen3.5-4B", "qwen3-coder"),
    ("Qwen/Qwen2.5-7B-Instruct", "hermes"),
    ("Qwen/Qwen3-8B", "hermes"),
    ("/models/qwen3_0.6b", "hermes"),
    ("Qwen/QwQ-32B", "hermes"),
    ("zai-org/GLM-4.5-Air", "glm45"),
    ("zai-org/GLM-4.6-FP8", "glm45"),
    ("zai-org/GLM-4.7-Flash", "glm47"),
    ("zai-org/GLM-5", "glm47"),
    ("moonshotai/Kimi-K2-Instruct-0905", "kimi-k2"),
    ("moonshotai/Kimi-K2-Thinking", "kimi-k2"),
    ("openai/gpt-oss-120b", "gpt-oss"),
    ("mistralai/Mistral-7B-Instruct-v0.3", "mistral"),
    ("mistralai/Mistral-Nemo-Instruct-2407", "mistral"),
    ("mistralai/Mistral-Small-3.1-24B-Instruct-2503", "mistral"),
    ("mistralai/Mistral-Small-3.2-24B-Instruct-2506", "mistral-v11"),
    ("mistralai/Devstral-Small-2507", "mistral-v11"),
    ("mistralai/Magistral-Small", "mistral-v11"),
    ("meta-llama/Llama-3.1-8B-Instruct", "llama3-json"),
    ("meta-llama/Meta-Llama-3-70B-Instruct", "llama3-json"),
    ("meta-llama/Llama-4-Scout-17B-16E-Instruct", "llama4-pythonic"),
    ("deepseek-ai/DeepSeek-V3-0324", "deepseek-v3"),
    ("deepseek-ai/DeepSeek-R1-0528", "deepseek-v3"),
    ("deepseek-ai/DeepSeek-R1-Distill-Qwen-32B", "deepseek-v3"),
    ("deepseek-ai/DeepSeek-V3.1-Terminus", "deepseek-v31"),
    ("deepseek-ai/DeepSeek-V3.2-Exp", "dsml-v32"),
    ("deepseek-ai/DeepSeek-V4", "dsml-v4"),
    ("MiniMaxAI/MiniMax-M2", "minimax-m2"),
    ("my-finetune", None),
    ("", None),
]


@pytest.mark.parametrize(("model", "dialect"), MODELS)
def test_dialect_for_model(model: str, dialect: str | None) -> None:
    assert registry.dialect_for_model(model) == dialect
    if dialect is not None:
        assert registry.get(dialect).name == dialect


NAMES = {
    "qwen3-coder", "hermes", "glm45", "glm47", "kimi-k2", "gpt-oss", "mistral", "mistral-v11",
    "llama3-json", "llama4-pythonic", "deepseek-v3", "deepseek-v31", "dsml-v32", "dsml-v4",
    "minimax-m2",
}  # fmt: skip


def test_every_dialect_is_registered() -> None:
    assert set(registry.names()) >= NAMES | {"auto", "dsml", "json", "none"}


SERVER_PARSERS = {
    "qwen3_coder": "qwen3-coder", "qwen3_xml": "qwen3-coder", "qwen25": "hermes",
    "qwen3_json": "hermes", "glm45": "glm45", "glm47": "glm47", "kimi_k2": "kimi-k2",
    "openai": "gpt-oss", "gpt-oss": "gpt-oss", "mistral": "mistral", "llama3_json": "llama3-json",
    "llama3": "llama3-json", "pythonic": "llama4-pythonic", "llama4_pythonic": "llama4-pythonic",
    "deepseek_v3": "deepseek-v3", "deepseekv3": "deepseek-v3", "deepseek_v31": "deepseek-v31",
    "deepseekv31": "deepseek-v31", "deepseek_v32": "dsml-v32", "deepseekv32": "dsml-v32",
    "deepseek_v4": "dsml-v4", "deepseekv4": "dsml-v4", "minimax_m2": "minimax-m2",
    "minimax-m2": "minimax-m2", "hermes": "hermes",
}  # fmt: skip


@pytest.mark.parametrize(("alias", "name"), sorted(SERVER_PARSERS.items()))
def test_server_parser_names_are_aliases(alias: str, name: str) -> None:
    assert registry.get(alias).name == name


def test_unknown_dialect_says_what_to_use() -> None:
    with pytest.raises(UsageError, match="qwen3-coder"):
        registry.get("klingon")


CALL = ToolCall("get_weather", {"city": "Tokyo"})


@pytest.mark.parametrize("name", sorted(NAMES))
def test_auto_detects_every_dialect(name: str) -> None:
    content = "" if name.startswith("llama") else "Checking."
    text = registry.get(name).encode(content, [CALL])
    assert registry.detect(text) in (name, "dsml")
    result = registry.parse(text)
    assert result.ok, result.error
    assert result.dialect == name
    assert result.calls == (CALL,)


#: (dialect, its sibling) pairs whose markup only the layout tells apart
SIBLINGS = [("glm45", "glm47"), ("glm47", "glm45"), ("deepseek-v3", "deepseek-v31"),
            ("deepseek-v31", "deepseek-v3"), ("mistral", "mistral-v11"),
            ("mistral-v11", "mistral")]  # fmt: skip
TWO = [CALL, ToolCall("get_time", {})]


def _breaks(text: str) -> list[str]:
    """Near misses of ``text``: cut before the end, its opening marker lost (not for the
    Mistral list: without its marker it is JSON in prose, no markup)."""
    breaks = [text[: len(text) * 2 // 3], text[: len(text) // 2]]
    for opener, left in (
        ("<tool_call>", ""),
        (deepseek_v3.CALLS_BEGIN, ""),
        ("[TOOL_CALLS]g", "g"),
    ):
        if opener in text:
            breaks.append(text.replace(opener, left, 1))
    return breaks


@pytest.mark.parametrize(("name", "sibling"), SIBLINGS)
def test_auto_tells_versions_apart_by_their_layout(name: str, sibling: str) -> None:
    text = registry.get(name).encode("Checking.", TWO)
    assert registry.get(sibling).parse(text).found  # the sibling reads it too
    assert registry.parse(text).dialect == name
    for broken in _breaks(text):
        result = registry.parse(broken)
        assert not result.ok, broken
        assert (registry.detect(broken), result.dialect) == (name, name), broken


@pytest.mark.parametrize("module", [glm, deepseek_v3, mistral])
def test_a_layout_that_does_not_tell_is_none(module: Any) -> None:
    assert module.layout("Checking.") is None
    assert module.layout("<tool_call>get_time") is None  # (no tag that tells)


def test_the_markup_gate_covers_every_auto_dialect() -> None:
    """The scan in front of the markers was derived from these dialects' patterns: a new
    one (or a new fallback) needs its markers checked against it first."""
    assert [*registry._AUTO, *registry._FALLBACK] == list(registry.GATED)


@pytest.mark.parametrize("name", sorted(registry.GATED))
def test_the_markup_gate_lets_every_marker_through(name: str) -> None:
    """Each dialect's canonical turn, its broken shapes, and text without any of the gate's
    characters: markers found only where the gate lets the text through."""
    dialect = registry.get(name) if name != "dsml" else registry.get("dsml-v4")
    content = "" if name.startswith("llama") else "Checking."
    text = dialect.encode(content, [CALL]) if name != "json" else '{"name": "f", "x": {'
    for t in [text, *_breaks(text), "Harmony to=FUNCTIONS.get", "plain prose = 2 (no tags)"]:
        if dialect.first_marker(t) >= 0 or registry.has_markup(t):
            assert registry._may_mark(t), t
    assert not registry._may_mark("plain prose = 2 (no tags), a/b \\ c")
