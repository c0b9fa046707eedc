"""``--passkeys`` end to end against the simulator: its KV race breaks the recall of a planted
passkey (a fluent call with a wrong id, which no text check sees); the oracle finds exactly
the sends the simulator says it corrupted, and the same asks alone set the floor."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from harness.analysis.oracles import oracle_evidence
from harness.drive.driver import Progress
from harness.record.rundir import ORACLE_PASSKEY_ALONE_FILE, ORACLE_PASSKEY_FILE, TRANSCRIPTS_FILE
from harness.record.transcripts import load_transcripts
from harness.record.turns import read_rows, read_turns
from harness.report.build import write_report
from harness.run.execute import execute, write_run_json
from harness.workload import passkeys as pk
from tests.cli.test_cli import harness
from tests.run.endpoint_options import endpoint_options
from tests.run.test_replay import LOAD_SCALE, small_scenario


async def _run(url: str, out: Path, sessions: int, passkeys: bool, **opts: Any) -> None:
    scenario = replace(small_scenario(sessions, turns=8, max_context=16000), passkeys=passkeys)
    options = endpoint_options(scenario, out, url, sessions, **opts)
    write_run_json(options, "r1")
    await execute(options, "r1", Progress())


def _key(r: dict[str, Any]) -> tuple[Any, ...]:
    return (r["variant"], r["repeat"], r["session"], r["turn"], r["attempt"])


def _bad(r: dict[str, Any]) -> bool:
    return r["status"] in (pk.WRONG, pk.MISSING)


def _injected(r: dict[str, Any]) -> bool:
    return r["sim_injected"] not in (None, "none")


async def test_passkeys_find_the_recall_the_race_broke(
    make_sim: Callable[..., str], tmp_path: Path
) -> None:
    url = make_sim(fault_scale=LOAD_SCALE)
    await _run(url, tmp_path, 40, True)
    every = read_rows(tmp_path / ORACLE_PASSKEY_FILE)
    rows = [r for r in every if r["status"] != pk.NOT_ASKED]
    alone = read_rows(tmp_path / ORACLE_PASSKEY_ALONE_FILE)
    assert len({r["session"] for r in every}) == 40  # each session: checked, or not asked
    assert len({r["session"] for r in rows}) >= 30  # most sessions reached the ask
    assert {r["turn"] for r in rows} == {pk.ask_turn(7, 8) + 1}
    bad = [r for r in rows if _bad(r)]
    injected = [r for r in rows if _injected(r)]
    assert bad, "the race should have broken some recalls at this scale"
    assert all(_injected(r) for r in bad)  # precision 1.0
    assert len([r for r in injected if _bad(r)]) >= 0.95 * len(injected)  # recall
    assert all(r["label"] == "ok_tool_call" for r in bad if r["status"] == pk.WRONG)
    assert all(r["distance_tokens"] > 0 for r in rows)
    # alone: one per session, the model's own recall (the sim's race rarely hits alone)
    assert len(alone) == len({r["session"] for r in rows})
    assert all(_bad(r) == _injected(r) for r in alone if r["status"] != "undecided")
    assert sum(map(_bad, alone)) < len(bad)

    evidence = oracle_evidence(tmp_path)
    assert {k for k, v in evidence.items() if "passkey" in v} == {_key(r) for r in bad}

    [v] = write_report(tmp_path)["variants"]
    p = v["oracles"]["passkey"]
    assert p["loaded"]["wrong"] + p["loaded"]["missing"] == len(bad)
    assert p["loaded"]["not_asked"] == len(every) - len(rows)
    assert v["passkey_wrong_rate"] == pytest.approx(len(bad) / len(rows))
    assert p["excess_wrong_rate"] > 0
    assert p["extra_requests"] == len(alone)
    assert sum(b["checked"] for b in p["by_distance"]) == len(rows)
    md = (tmp_path / "report.md").read_text()
    assert "## Passkeys" in md
    gate = harness("report", str(tmp_path), "--fail-if", "passkey_excess_wrong_rate > 0")
    assert gate.returncode == 1, gate.stderr


async def test_passkeys_on_a_healthy_server_are_all_recalled(
    make_sim: Callable[..., str], tmp_path: Path
) -> None:
    url = make_sim(fault_scale=0.0)
    await _run(url, tmp_path, 8, True)
    rows = read_rows(tmp_path / ORACLE_PASSKEY_FILE)
    assert rows
    assert {r["status"] for r in rows} == {pk.RIGHT}
    assert {r["status"] for r in read_rows(tmp_path / ORACLE_PASSKEY_ALONE_FILE)} == {pk.RIGHT}
    assert oracle_evidence(tmp_path) == {}


async def test_without_passkeys_the_sessions_send_what_they_sent_before(
    make_sim: Callable[..., str], tmp_path: Path
) -> None:
    url = make_sim(fault_scale=0.0)
    for name in ("off", "on"):
        (tmp_path / name).mkdir()
    await _run(url, tmp_path / "off", 4, False, keep_transcripts=True)
    await _run(url, tmp_path / "on", 4, True)
    off = load_transcripts(tmp_path / "off" / TRANSCRIPTS_FILE)
    on = load_transcripts(tmp_path / "on" / TRANSCRIPTS_FILE)
    for t in off.values():
        for r in t.rows:
            wire = t.wire(r["seq"])
            assert pk.TOOL.encode() not in wire
            assert b"PASSKEY" not in wire
    assert not (tmp_path / "off" / ORACLE_PASSKEY_FILE).exists()
    scenario = small_scenario(4, turns=8, max_context=16000)
    for t in off.values():  # the scenario's own tools, nothing added
        assert t.body(0)["tools"] == [spec.openai() for spec in scenario.tools]
    # with the flag: the passkey tool, the planted line and the ask
    for t in on.values():
        assert pk.TOOL.encode() in t.wire(0)
        assert any(b"PASSKEY: pk-" in t.wire(r["seq"]) for r in t.rows)
    assert read_turns(tmp_path / "off" / "turns.jsonl")


def test_check() -> None:
    key = pk.passkey_for(42)
    assert key.startswith("pk-") and len(key) == 15  # noqa: PT018
    assert pk.check([{"name": pk.TOOL, "arguments": {"passkey": key}}], key) == (pk.RIGHT, key)
    assert pk.check([{"name": pk.TOOL, "arguments": '{"passkey": "pk-0"}'}], key)[0] == pk.WRONG
    assert pk.check([{"name": "read_file", "arguments": {}}], key) == (pk.MISSING, None)
    assert pk.ask_turn(26, 40) == 13
    assert pk.ask_turn(1, 1) == 1
