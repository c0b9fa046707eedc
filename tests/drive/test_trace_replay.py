"""Recorded traces as sessions: replay and continue modes, recorded pace, both APIs, the CLI."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from harness import labels as L
from harness.analysis.rawcompare import compare_records, compare_runs
from harness.cli.main import main
from harness.client.chat import ChatClient
from harness.client.raw import RawClient
from harness.dialects import dsml
from harness.drive.driver import DriveHooks, DriveOptions, drive
from harness.drive.trace_session import TraceSession, fake_kind, session_factory, trace_plans
from harness.record.turns import TurnWriter, read_turns
from harness.workload.scenario import load_scenario
from harness.workload.trace import load_trace

EXAMPLE = Path(__file__).resolve().parents[2] / "scenarios" / "example_trace.jsonl"
BASE = {"run_id": "t", "variant": "v", "factors": {}, "repeat": 0}


async def _drive(
    url: str,
    out: Path,
    mode: str = "replay",
    pace: str = "fast",
    api: str = "chat",
    trace: Path = EXAMPLE,
) -> tuple[list[Any], list[dict[str, Any]]]:
    # raw mode renders the DeepSeek prompt: the dialect is named (the shipped one is "auto")
    scenario = load_scenario().with_overrides(dialect=None if api == "chat" else "dsml-v4")
    conversations = load_trace(trace)
    client = ChatClient(url, model="m", request_timeout=20)
    sessions_client: Any = client if api == "chat" else RawClient(client, api, scenario.dialect)
    try:
        with TurnWriter(out) as writer:
            sessions = await drive(
                sessions_client,
                scenario,
                trace_plans(conversations, scenario, mode, seed=3),
                writer,
                BASE,
                DriveOptions(concurrency=4),
                hooks=DriveHooks(make_session=session_factory(conversations, mode, pace)),
            )
    finally:
        await client.aclose()
    return sessions, read_turns(out)  # type: ignore[return-value]


def _call(c: dict[str, Any]) -> tuple[str, Any]:
    args = c["arguments"]
    return c["name"], json.loads(args) if isinstance(args, str) else args


async def test_replay_sends_every_recorded_request(
    make_sim: Callable[..., str], tmp_path: Path
) -> None:
    sessions, rows = await _drive(make_sim(fault_scale=0.0), tmp_path / "t.jsonl")
    conversations = load_trace(EXAMPLE)
    assert len(rows) == sum(len(c.turns()) for c in conversations)
    assert all(isinstance(s, TraceSession) and s.ended == "replayed" for s in sessions)
    for i, conv in enumerate(conversations):
        mine = sorted((r for r in rows if r["session"] == i), key=lambda r: r["turn"])
        assert [r["turn"] for r in mine] == list(range(len(conv.turns())))
        assert {r["trace"] for r in mine} == {conv.id}
        tokens = [r["prompt_tokens"] for r in mine]
        assert tokens == sorted(tokens)  # each request holds the recorded history before it
        assert all(r["label"] in (L.OK_TOOL_CALL, L.OK_TEXT) for r in mine)
    # the conversation's own tools went with the requests: the sim called them
    called = {c["name"] for r in rows for c in r["tool_calls"]}
    assert called <= {"list_dir", "read_file", "search", "run_tests"}


@pytest.mark.parametrize("api", ["completions", "generate"])
async def test_replay_in_raw_mode_matches_chat_mode(
    make_sim: Callable[..., str], tmp_path: Path, api: str
) -> None:
    url = make_sim(fault_scale=0.0)
    _, chat = await _drive(url, tmp_path / "chat.jsonl")
    _, raw = await _drive(url, tmp_path / "raw.jsonl", api=api)
    summary = compare_records(chat, raw)  # type: ignore[arg-type]
    assert summary["paired"] == len(chat) == len(raw)
    assert summary["verdicts"] == {"same": len(chat)}
    key = lambda r: (r["session"], r["turn"])  # noqa: E731
    for a, b in zip(sorted(chat, key=key), sorted(raw, key=key), strict=True):
        assert a["prompt_tokens"] == b["prompt_tokens"]  # the sim decoded the same prompt
        assert [_call(c) for c in a["tool_calls"]] == [_call(c) for c in b["tool_calls"]]
        assert dsml.MARK not in a["content"]
        if b["tool_calls"]:
            assert dsml.MARK in b["content"]  # raw mode records the model's text as sent


async def test_raw_mode_sees_corruption_the_chat_parser_hides_as_well(
    make_sim: Callable[..., str], tmp_path: Path
) -> None:
    url = make_sim(force_fault="salad")
    _, raw = await _drive(url, tmp_path / "raw.jsonl", api="completions")
    assert raw
    assert all(r["label"] == L.TOKEN_SALAD for r in raw)
    _, chat = await _drive(url, tmp_path / "chat.jsonl")
    summary = compare_records(chat, raw)  # type: ignore[arg-type]
    assert summary["verdicts"].get("model") == summary["paired"] > 0
    assert summary["verdict"].startswith(f"the model: {summary['paired']} of")


@pytest.mark.parametrize("api", ["chat", "generate"])
async def test_continue_keeps_recorded_results_where_the_live_call_matches(
    make_sim: Callable[..., str], tmp_path: Path, api: str
) -> None:
    sessions, rows = await _drive(
        make_sim(fault_scale=0.0), tmp_path / "t.jsonl", mode="continue", api=api
    )
    by_id = {s.conv.id: s for s in sessions}
    # the sim's first call is list_dir("."), like the recording of fix-cache-bug ...
    fix = by_id["fix-cache-bug"].messages
    first = next(i for i, m in enumerate(fix) if m["role"] == "assistant")
    assert fix[first]["tool_calls"][0]["function"]["name"] == "list_dir"
    assert fix[first + 1]["content"] == "cache/\ntests/\nREADME.md\npyproject.toml"
    # ... but not like flaky-test's (run_tests): the fake tools answer there
    flaky = by_id["flaky-test"]
    first = next(i for i, m in enumerate(flaky.messages) if m["role"] == "assistant")
    assert "test_reuse FAILED" not in flaky.messages[first + 1]["content"]
    assert flaky.diverged >= 1
    assert all(s.ended in ("answered", "max turns") for s in sessions)
    for s in sessions:  # the history keeps content without markup, whatever the API
        assert all(dsml.MARK not in (m.get("content") or "") for m in s.messages)
    assert {r["trace_mode"] for r in rows} == {"continue"}


async def test_recorded_pace_waits_for_the_offsets(
    make_sim: Callable[..., str], tmp_path: Path
) -> None:
    trace = tmp_path / "trace.jsonl"
    conv = json.loads(EXAMPLE.read_text().splitlines()[2])  # two turns
    conv["offsets_s"] = [0.0, 0.4]
    trace.write_text(json.dumps(conv) + "\n")
    _, rows = await _drive(
        make_sim(fault_scale=0.0), tmp_path / "t.jsonl", pace="recorded", trace=trace
    )
    rows.sort(key=lambda r: r["turn"])
    # a lower bound only: the second request never leaves before its recorded offset
    assert rows[1]["sent_at"] - rows[0]["sent_at"] >= 0.4 - 0.002


def test_fake_kind_follows_the_scenario_then_the_name() -> None:
    scenario = load_scenario()
    assert fake_kind(scenario.tools[0].name, scenario) == scenario.tools[0].kind
    assert fake_kind("grep_code", scenario) == "search"
    assert fake_kind("open_file", scenario) == "read_file"
    assert fake_kind("weather", scenario) == "echo"


def test_cli_runs_a_trace_in_both_modes_and_compares(
    make_sim: Callable[..., str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = make_sim(fault_scale=0.0)
    common = ["run", "--endpoint", url, "--workload", str(EXAMPLE), "--pace", "fast"]
    assert main([*common, "--out", str(tmp_path / "chat"), "--no-progress"]) == 0
    assert (
        main([*common, "--out", str(tmp_path / "raw"), "--no-progress", "--api", "completions"])
        == 0
    )
    summary = compare_runs(tmp_path / "chat", tmp_path / "raw")
    assert summary["paired"] == 11
    assert summary["verdicts"] == {"same": 11}
    capsys.readouterr()
    assert main(["trace", "compare", str(tmp_path / "chat"), str(tmp_path / "raw")]) == 0
    printed = capsys.readouterr()
    assert json.loads(printed.out)["paired"] == 11
    assert "verdict: neither the parser nor the model: 11 of 11 paired turns agree" in printed.err


def test_cli_checks_the_workload_and_the_api(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"messages": [{"role": "user", "content": "hi"}]}\n')
    out = str(tmp_path / "r")
    assert main(["run", "--workload", str(bad), "--out", out, "--dry-run"]) == 2
    assert "bad.jsonl:1: the conversation has no assistant turn" in capsys.readouterr().err
    agent = (EXAMPLE.parent / "coding_agent.toml").read_text()
    hermes = tmp_path / "h.toml"
    hermes.write_text('dialect = "hermes"\n' + agent.replace("dialect =", "# dialect ="))
    args = ["run", "--scenario", str(hermes), "--api", "generate", "--out", out, "--dry-run"]
    assert main(args) == 2
    assert "renders DeepSeek prompts only" in capsys.readouterr().err


def test_trace_convert_groups_a_request_log(tmp_path: Path) -> None:
    sys_msg = {"role": "system", "content": "s"}
    user = {"role": "user", "content": "list it"}
    answer = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "a", "type": "function", "function": {"name": "ls", "arguments": "{}"}}
        ],
    }
    result = {"role": "tool", "tool_call_id": "a", "content": "x.py"}
    log = [
        {
            "request": {"messages": [sys_msg, user]},
            "response": {"choices": [{"message": answer}]},
            "time": 100.0,
        },
        {
            "request": {"messages": [sys_msg, user, answer, result]},
            "response": {"choices": [{"message": {"role": "assistant", "content": "x.py"}}]},
            "time": 103.5,
        },
    ]
    src = tmp_path / "log.jsonl"
    src.write_text("".join(json.dumps(x) + "\n" for x in log))
    out = tmp_path / "trace.jsonl"
    assert main(["trace", "convert", str(src), "-o", str(out)]) == 0
    (conv,) = load_trace(out)
    assert len(conv.turns()) == 2
    assert conv.offsets_s == (0.0, 3.5)
    assert main(["trace", "convert", str(tmp_path / "missing.jsonl")]) == 2
