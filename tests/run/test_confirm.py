"""``--confirm`` (corrupted turns re-sent alone) and ``--reference-sessions`` (divergence)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from harness import labels as L
from harness.analysis.confirm import CONFIRMED_UNDER_LOAD, REPRODUCES_ALONE, compare_session
from harness.record.rundir import CONFIRM_FILE, REFERENCE_ENDS_FILE, REFERENCE_FILE
from harness.record.turns import read_turns
from harness.report.build import write_report
from tests.run.test_replay import LOAD_SCALE, Proxy, _fault_run


def _confirm_rows(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in (run_dir / CONFIRM_FILE).read_text().splitlines()]


def _key(r: dict[str, Any]) -> tuple[Any, ...]:
    return (r["variant"], r["repeat"], r["session"], r["turn"], r["attempt"])


async def test_load_only_corruption_is_confirmed_under_load_and_sessions_do_not_diverge(
    make_sim: Callable[..., str], tmp_path: Path
) -> None:
    url = make_sim(fault_scale=LOAD_SCALE)
    await _fault_run(url, tmp_path, 40, confirm=True, reference_sessions=5)
    turns = read_turns(tmp_path / "turns.jsonl")
    bad = [r for r in turns if r["corrupted"]]
    rows = _confirm_rows(tmp_path)
    assert bad
    assert sorted(map(_key, rows)) == sorted(map(_key, bad))  # every corrupted send, once
    for r in rows:
        assert r["status"] == (REPRODUCES_ALONE if r["corrupted"] else CONFIRMED_UNDER_LOAD)
        assert r["inflight"] == 1
    under_load = sum(r["status"] == CONFIRMED_UNDER_LOAD for r in rows)
    assert under_load >= 0.8 * len(rows)

    # the loaded run is untouched: reference sessions go to their own file
    assert {r["session"] for r in turns} == set(range(40))
    reference = read_turns(tmp_path / REFERENCE_FILE)
    assert {r["session"] for r in reference} == set(range(5))
    assert max(r["inflight"] for r in reference) == 1

    summary = write_report(tmp_path)
    [v] = summary["variants"]
    c = v["confirm"]
    assert c["confirmed"] == v["structural_turns"] + v["suspect_turns"] == len(bad)
    # the headline counts what the parsers found and what the judge confirmed of the rest
    assert v["corrupted_turns"] == v["structural_turns"] + v["confirmed_turns"]
    assert v["headline_basis"] == "structural+confirmed"
    assert c[CONFIRMED_UNDER_LOAD] == under_load
    split = c["turn_rate_under_load"] + c["turn_rate_alone"]
    assert split == pytest.approx(len(bad) / v["classified_turns"])
    # the simulator's output depends only on the seed and the conversation: once the
    # corrupted sends are re-sent, the loaded sessions say what the lone ones say
    d = v["divergence"]
    assert d["reference_sessions"] == 5
    assert d["compared_turns"] >= 5
    assert d["diverged_turns"] == 0
    md = (tmp_path / "report.md").read_text()
    assert "## Corrupted turns re-sent alone" in md
    assert "## Divergence under load" in md


async def test_corruption_that_happens_alone_too_reproduces_alone(
    make_sim: Callable[..., str], tmp_path: Path
) -> None:
    url = make_sim(force_fault="salad")
    await _fault_run(url, tmp_path, 3, confirm=True)
    rows = _confirm_rows(tmp_path)
    assert len(rows) == len([r for r in read_turns(tmp_path / "turns.jsonl") if r["corrupted"]])
    assert {r["status"] for r in rows} == {REPRODUCES_ALONE}
    assert {r["label"] for r in rows} == {L.TOKEN_SALAD}
    [v] = write_report(tmp_path)["variants"]
    assert v["confirm"]["turn_rate_alone"] == v["turn_corruption_rate"] == 1.0
    assert v["confirm"]["turn_rate_under_load"] == 0.0


async def test_resume_finishes_an_interrupted_after_load(
    make_sim: Callable[..., str], tmp_path: Path
) -> None:
    """Every session done, but the run stopped while it confirmed and re-ran references:
    --resume starts the server again for the after-load work only, re-runs the reference
    sessions that did not run to their end (one cut short from its start, its partial rows
    dropped) and confirms the sends not confirmed yet, each once."""
    from harness.drive.driver import Progress
    from harness.record.rundir import RunDir
    from harness.run.execute import execute

    url = make_sim(force_fault="salad")
    opts = await _fault_run(url, tmp_path, 4, confirm=True, reference_sessions=3)
    confirm = _confirm_rows(tmp_path)
    assert len(confirm) >= 2
    reference = read_turns(tmp_path / REFERENCE_FILE)
    ends = [json.loads(line) for line in (tmp_path / REFERENCE_ENDS_FILE).read_text().splitlines()]
    assert [e["session"] for e in ends] == [0, 1, 2]
    first = [r for r in reference if r["session"] == 0]
    second = [r for r in reference if r["session"] == 1]
    assert len(second) >= 2
    # cut the after-load short: one confirmed send, one reference session run to its end,
    # the second cut after its first turn
    (tmp_path / CONFIRM_FILE).write_text(json.dumps(confirm[0]) + "\n")
    cut = first + second[:1]
    (tmp_path / REFERENCE_FILE).write_text("".join(json.dumps(r) + "\n" for r in cut))
    (tmp_path / REFERENCE_ENDS_FILE).write_text(json.dumps(ends[0]) + "\n")
    turns_before = (tmp_path / "turns.jsonl").read_text()

    skip = RunDir(tmp_path).finished_sessions()
    assert len(skip) == 4
    outcomes = await execute(opts, "r1", Progress(), skip=skip)
    assert len(outcomes) == 1
    assert outcomes[0].sessions == 0  # no session was driven again
    assert (tmp_path / "turns.jsonl").read_text() == turns_before
    again = _confirm_rows(tmp_path)
    assert sorted(map(_key, again)) == sorted(map(_key, confirm))  # each send once
    reference = read_turns(tmp_path / REFERENCE_FILE)
    assert {r["session"] for r in reference} == {0, 1, 2}
    assert [r for r in reference if r["session"] == 0] == first  # not run twice

    def sends(rows: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
        return [(r["turn"], r["attempt"], r["label"]) for r in rows]

    # run again from its start, its first row not kept (the simulator's salad differs: it
    # counts the sends of a conversation)
    rerun = [r for r in reference if r["session"] == 1]
    assert sends(rerun) == sends(second)
    ends = [json.loads(line) for line in (tmp_path / REFERENCE_ENDS_FILE).read_text().splitlines()]
    assert sorted(e["session"] for e in ends) == [0, 1, 2]

    # nothing left to do: a second resume starts no server
    assert await execute(opts, "r1", Progress(), skip=RunDir(tmp_path).finished_sessions()) == []


async def test_resume_of_a_run_folder_from_before_the_reference_ends(
    make_sim: Callable[..., str], tmp_path: Path
) -> None:
    """No reference_sessions.jsonl (a run folder of an earlier version): a session with rows
    counts as run, as it did then, and is noted so; the others run."""
    from harness.drive.driver import Progress
    from harness.record.rundir import RunDir
    from harness.run.execute import execute

    opts = await _fault_run(make_sim(index_k="fp8"), tmp_path, 3, reference_sessions=3)
    first = [r for r in read_turns(tmp_path / REFERENCE_FILE) if r["session"] == 0]
    (tmp_path / REFERENCE_FILE).write_text("".join(json.dumps(r) + "\n" for r in first))
    (tmp_path / REFERENCE_ENDS_FILE).unlink()
    await execute(opts, "r1", Progress(), skip=RunDir(tmp_path).finished_sessions())
    reference = read_turns(tmp_path / REFERENCE_FILE)
    assert [r for r in reference if r["session"] == 0] == first
    assert {r["session"] for r in reference} == {0, 1, 2}
    ends = [json.loads(line) for line in (tmp_path / REFERENCE_ENDS_FILE).read_text().splitlines()]
    assert [(e["session"], e["ended"] is None) for e in ends] == [(0, True), (1, False), (2, False)]


def _other_path(data: bytes) -> bytes:
    """A non-streamed response whose first string argument is changed (still well-formed)."""
    doc = json.loads(data)
    for call in doc["choices"][0]["message"].get("tool_calls") or []:
        args = json.loads(call["function"]["arguments"])
        for key, value in args.items():
            if isinstance(value, str):
                args[key] = value.rstrip("/") + "/other"
                call["function"]["arguments"] = json.dumps(args)
                return json.dumps(doc).encode()
    return data


async def test_well_formed_but_different_calls_under_load_are_divergence(
    make_sim: Callable[..., str], tmp_path: Path
) -> None:
    proxy = Proxy(make_sim(index_k="fp8"), rewrite=_other_path)
    url = await proxy.start()
    try:
        await _fault_run(url, tmp_path, 4, stream=False, reference_sessions=3)
    finally:
        await proxy.stop()
    assert proxy.rewritten > 0
    [v] = write_report(tmp_path)["variants"]
    assert v["corrupted_turns"] == 0  # no text classifier sees it
    d = v["divergence"]
    assert d["diverged_turns"] >= 1
    ex = d["examples"][0]
    assert ex["loaded"] != ex["alone"]
    assert ex["loaded"][0]["name"] == ex["alone"][0]["name"]


def _row(turn: int, calls: list[dict[str, Any]], attempt: int = 0, **kw: Any) -> dict[str, Any]:
    return {"turn": turn, "attempt": attempt, "label": L.OK_TOOL_CALL, "tool_calls": calls,
            "content": "", "prompt_tokens": 1000 + turn, **kw}  # fmt: skip


def test_compare_session_stops_at_the_first_difference() -> None:
    a = [{"name": "read_file", "arguments": {"path": "a.py"}}]
    b = [{"name": "read_file", "arguments": '{"path": "b.py"}'}]
    same = [_row(0, a), _row(1, a), _row(2, a)]
    assert compare_session(same, same) == (3, [])
    # arguments given as a JSON string compare by value
    as_text = [_row(0, [{"name": "read_file", "arguments": '{"path": "a.py"}'}])]
    assert compare_session(same[:1], as_text) == (1, [])
    n, found = compare_session(same, [_row(0, a), _row(1, b), _row(2, b)])
    assert (n, [f["turn"] for f in found]) == (2, [1])
    # a corrupted send re-sent: the accepted (last) attempt is compared
    retried = [_row(0, [], label=L.TOKEN_SALAD), _row(0, a, attempt=1), _row(1, a), _row(2, a)]
    assert compare_session(retried, same) == (3, [])
    # different prompts: not the same request any more, nothing more is compared
    assert compare_session(same, [_row(0, a), _row(1, a, prompt_tokens=5)]) == (1, [])
    # one side malformed: a corruption, not a divergence
    broken = [_row(0, a), _row(1, [], label=L.MALFORMED_TOOL_CALL)]
    assert compare_session(same, broken) == (1, [])
