"""Which dialect a run uses (decided once, said out loud) and whether a tool workload got
any tool call (a warning, and gate metrics)."""

from __future__ import annotations

from typing import Any

import pandas as pd
import pytest

from harness.analysis import coverage
from harness.analysis.gates import check_exprs, evaluate_gates
from harness.analysis.summary import summarize
from harness.errors import ConfigError
from harness.workload import dialect as dialect_choice
from harness.workload.scenario import parse_scenario


def test_a_named_dialect_is_taken_as_given() -> None:
    c = dialect_choice.choose("hermes", ["deepseek-ai/DeepSeek-V4-Flash"], from_option=True)
    assert (c.name, c.source) == ("hermes", "option")
    assert c.describe() == "hermes (from --dialect)"
    assert dialect_choice.choose("hermes", []).describe() == "hermes (from the scenario)"


def test_auto_uses_the_model_name_then_its_root() -> None:
    c = dialect_choice.choose("auto", ["deepseek-ai/DeepSeek-V4-Flash"])
    assert (c.name, c.source, c.model) == ("dsml-v4", "model name", "deepseek-ai/DeepSeek-V4-Flash")
    c = dialect_choice.choose("auto", ["served", "/models/Qwen3-8B"])
    assert (c.name, c.source) == ("hermes", "model name")
    assert c.model == "served"


def test_auto_without_a_telling_name_waits_for_the_markup() -> None:
    c = dialect_choice.choose("auto", ["acme/house-model"])
    assert (c.name, c.source) == ("auto", "markup")
    assert "does not tell" in c.describe()
    lock = dialect_choice.DialectLock()
    lock.observe({"text_score": 0.0})
    assert lock.name == "auto"
    lock.observe({"dialect": "hermes"})
    lock.observe({"dialect": "dsml-v4"})  # settled once: later markup does not move it
    assert lock.name == "hermes"


def test_the_scenario_dialect_is_checked() -> None:
    base = {"name": "x", "tools": [{"name": "t", "kind": "echo"}]}
    assert parse_scenario(base, "s.toml").dialect == "auto"
    assert parse_scenario({**base, "dialect": "hermes"}, "s.toml").dialect == "hermes"
    # a server's parser name stands for its dialect
    assert parse_scenario({**base, "dialect": "qwen3_coder"}, "s.toml").dialect == "qwen3-coder"
    with pytest.raises(ConfigError, match="dialect 'xml' is not one of auto"):
        parse_scenario({**base, "dialect": "xml"}, "s.toml")


def _turns(calls_by_session: list[list[bool]], workload: str = "tools") -> pd.DataFrame:
    rows: list[dict[str, Any]] = []
    for s, turns in enumerate(calls_by_session):
        for t, has_call in enumerate(turns):
            rows.append({
                "variant": "default", "repeat": 0, "session": s, "turn": t,
                "label": "ok_tool_call" if has_call else "parser_leak",
                "corrupted": False, "workload": workload, "dialect": "hermes",
                "dialect_from": "model name",
                "tool_calls": [{"name": "t", "arguments": {}}],
            })  # fmt: skip
    return pd.DataFrame(rows)


def test_sessions_without_tool_calls_are_counted_and_warned_about() -> None:
    summary = summarize(_turns([[False], [False], [True, True]]), "r")
    v = summary["variants"][0]
    assert v["sessions_without_tool_calls"] == 2
    assert v["tool_call_share"] == pytest.approx(0.5)
    assert v["dialect"] == "hermes"
    assert "2 of 3 sessions got no tool call" in summary["warnings"][0]
    assert "parser leak" in summary["warnings"][0]
    gates = "sessions_without_tool_calls > 0"
    check_exprs([gates, "tool_call_share < 0.9"])
    results = evaluate_gates(summary, [gates, "tool_call_share < 0.9"])
    assert [r.passed for r in results] == [False, False]


def test_a_workload_that_calls_tools_has_no_warning() -> None:
    summary = summarize(_turns([[True, False], [True]]), "r")
    assert summary["warnings"] == []
    assert summary["variants"][0]["sessions_without_tool_calls"] == 0


def test_a_chat_workload_has_no_tool_call_metrics() -> None:
    v = summarize(_turns([[False], [False]], workload="chat"), "r")["variants"][0]
    assert "sessions_without_tool_calls" not in v
    assert "warnings" not in v


def test_dialect_lines_name_each_variant_when_they_differ() -> None:
    same = {"variants": [{"label": "a", "dialect": "hermes", "dialect_from": "option"}]}
    assert coverage.dialect_lines(same) == ["tool-call dialect: hermes (from --dialect)"]
    two = {"variants": [
        {"label": "a", "dialect": "hermes", "dialect_from": "model name"},
        {"label": "b", "dialect": "dsml-v4", "dialect_from": "markup",
         "dialect_turns": {"auto": 2, "dsml-v4": 8}},
    ]}  # fmt: skip
    lines = coverage.dialect_lines(two)
    assert lines[0] == "tool-call dialect of a: hermes (from the model name)"
    assert "the first 2 turns, before any markup, were read as auto" in lines[1]
