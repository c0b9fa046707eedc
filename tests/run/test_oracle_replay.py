"""``--oracle replay`` end to end against the simulator in its deterministic mode, with its
ground truth (``sim_injected``): every diverged send is an injected one (precision 1.0) and
the injected sends it replays are found (recall), compared token by token where both answers
carry their token ids (the sessions ask for them with the oracle on, as the command line
does), and each diverged send gets the judge's verdict on its loaded continuation."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from harness.analysis.oracles import oracle_evidence, replay_summary
from harness.client.chat import ChatClient
from harness.drive.driver import Progress
from harness.errors import UsageError
from harness.record.rundir import ORACLE_REPLAY_FILE, TRANSCRIPTS_FILE
from harness.record.transcripts import load_transcripts
from harness.record.turns import read_rows, read_turns
from harness.report.build import write_report
from harness.report.oracles import replay_lines
from harness.run.execute import execute, write_run_json
from harness.run.oracle_replay import (
    Access,
    Sample,
    check_sampling,
    compare,
    exactness,
    first_difference,
    output_text,
    prefix_reply,
    replay_oracle_variant,
    sampled,
)
from tests.cli.test_cli import harness
from tests.run.endpoint_options import endpoint_options
from tests.run.test_replay import LOAD_SCALE, _fault_run, small_scenario


async def _oracle_run(url: str, out: Path, sessions: int, **opts: Any) -> None:
    """A run with ``--oracle replay`` as the command line makes it: the sessions ask for the
    generated token ids (``Scenario.return_token_ids``)."""
    scenario = small_scenario(sessions, turns=8, max_context=16000)
    scenario = scenario.with_overrides(return_token_ids=True)
    options = endpoint_options(scenario, out, url, sessions, oracles=("replay",), **opts)
    write_run_json(options, "r1")
    await execute(options, "r1", Progress())


def _key(r: dict[str, Any]) -> tuple[Any, ...]:
    return (r["variant"], r["repeat"], r["session"], r["turn"], r["attempt"])


async def test_replay_finds_exactly_the_injected_sends(
    make_sim: Callable[..., str], tmp_path: Path
) -> None:
    url = make_sim(fault_scale=LOAD_SCALE, deterministic=True)
    await _oracle_run(url, tmp_path, 40)
    turns = read_turns(tmp_path / "turns.jsonl")
    rows = read_rows(tmp_path / ORACLE_REPLAY_FILE)
    assert {r["compared"] for r in rows} == {"tokens"}  # the sim returns its token ids
    answered = [t for t in turns if t["label"] != "transport_error"]
    assert sorted(map(_key, rows)) == sorted(map(_key, answered))  # every send, once
    assert {r["exact"] for r in rows} == {True}  # the sim's /server_info says deterministic
    done = [r for r in rows if r["status"] in ("identical", "diverged")]
    assert len(done) == len(rows)
    injected = [r for r in done if r["sim_injected"] not in (None, "none")]
    diverged = [r for r in done if r["status"] == "diverged"]
    assert injected, "the sim's race should have hit some sends at this scale"
    hits = [r for r in diverged if r["sim_injected"] not in (None, "none")]
    assert len(hits) == len(diverged)  # precision 1.0: no healthy send called diverged
    assert len(hits) >= 0.95 * len(injected)  # recall of what it replays
    for r in diverged:
        assert r["position"] >= 0
        assert r["loaded_text"] != r["alone_text"]
        assert r["token_index"] >= 0
        assert r["loaded_tokens"] != r["alone_tokens"]
        # the judge's verdict on the loaded continuation from the first difference
        assert r["judge_verdict"] in ("implausible", "plausible"), r
        assert r["judge_tokens"] > 0
    # the sim scores its own (clean) answer likely: a corrupted continuation is implausible
    implausible = [r for r in diverged if r["judge_verdict"] == "implausible"]
    assert len(implausible) >= 0.9 * len(diverged)

    evidence = oracle_evidence(tmp_path)
    assert set(evidence) == {_key(r) for r in diverged}
    assert all(v == ["replay"] for v in evidence.values())

    summary = write_report(tmp_path)
    [v] = summary["variants"]
    rep = v["oracles"]["replay"]
    assert rep["diverged"] == len(diverged)
    assert rep["replayed"] == len(rows)
    assert v["replay_divergence_rate"] == pytest.approx(len(diverged) / len(done))
    assert rep["extra_requests"] == len(rows)
    assert rep["load_share"] == pytest.approx(len(rows) / len(turns))
    assert rep["compared_by"] == {"tokens": len(rows)}
    assert rep["judge"]["judged"] == len(diverged)
    assert rep["judge"]["implausible"] == len(implausible)
    assert v["replay_implausible_turns"] == len(implausible)
    md = (tmp_path / "report.md").read_text()
    assert "## Replay alone (exact oracle)" in md
    assert "every divergence is a bug to report" in md
    assert f"token ids {len(rows)}" in md
    assert "the judge calls the loaded continuation corrupted" in md
    # a gate on it fails the command
    gate = harness("report", str(tmp_path), "--fail-if", "replay_diverged_turns > 0")
    assert gate.returncode == 1, gate.stderr
    ok = harness("report", str(tmp_path), "--fail-if", "replay_divergence_rate > 0.99")
    assert ok.returncode == 0, ok.stderr


async def test_replay_on_a_healthy_deterministic_server_finds_nothing(
    make_sim: Callable[..., str], tmp_path: Path
) -> None:
    url = make_sim(fault_scale=0.0, deterministic=True)
    await _oracle_run(url, tmp_path, 12, oracle_sample=0.5, stream=False)
    rows = read_rows(tmp_path / ORACLE_REPLAY_FILE)
    turns = read_turns(tmp_path / "turns.jsonl")
    assert 0 < len(rows) < len(turns)  # a seeded sample
    assert {r["status"] for r in rows} == {"identical"}
    assert {r["compared"] for r in rows} == {"tokens"}  # non-streamed: choices[0].token_ids
    [t] = list(load_transcripts(tmp_path / TRANSCRIPTS_FILE).values())[:1]
    assert t.body(0)["logprobs"] is True  # non-streamed, the ask llama.cpp answers too
    assert oracle_evidence(tmp_path) == {}
    [v] = write_report(tmp_path)["variants"]
    assert v["replay_divergence_rate"] == 0.0


async def test_the_workload_is_the_same_with_the_oracle_off(
    make_sim: Callable[..., str], tmp_path: Path
) -> None:
    url = make_sim(fault_scale=0.0, deterministic=True)
    for name in ("off", "on"):
        (tmp_path / name).mkdir()
    await _fault_run(url, tmp_path / "off", 6, keep_transcripts=True)
    await _oracle_run(url, tmp_path / "on", 6)
    off = load_transcripts(tmp_path / "off" / TRANSCRIPTS_FILE)
    on = load_transcripts(tmp_path / "on" / TRANSCRIPTS_FILE)
    assert off.keys() == on.keys()
    for key, t in off.items():
        sent_off = [t.body(r["seq"]) for r in t.rows]
        sent_on = [on[key].body(r["seq"]) for r in on[key].rows]
        assert all("return_token_ids" not in b and "logprobs" not in b for b in sent_off)
        # the oracle adds the ask for the token ids (streamed: no logprobs), nothing else
        assert all(b.pop("return_token_ids") is True and "logprobs" not in b for b in sent_on)
        assert sent_off == sent_on
    assert not (tmp_path / "off" / ORACLE_REPLAY_FILE).exists()


def test_replay_refuses_sampling_that_is_not_fixed() -> None:
    check_sampling(0.0, False)
    check_sampling(0.7, True)
    with pytest.raises(UsageError, match="needs deterministic sampling"):
        check_sampling(0.7, False, "the trace workload")


def test_comparison_pieces() -> None:
    a = output_text({"content": "hello", "tool_calls": [
        {"id": "x", "name": "f", "arguments": '{"a": 1}'}]})  # fmt: skip
    b = output_text({"content": "hello", "tool_calls": [
        {"id": "y", "name": "f", "arguments": {"a": 1}}]})  # fmt: skip
    assert a == b  # call ids and argument encoding left out
    assert first_difference("abc", "abd") == 2
    assert first_difference("abc", "abc") is None
    assert first_difference("ab", "abc") == 2
    keys = [("v", 0, s, t, 0) for s in range(50) for t in range(20)]
    picked = [k for k in keys if sampled(k, 0.1, 7)]
    assert 50 < len(picked) < 150
    assert picked == [k for k in keys if sampled(k, 0.1, 7)]
    assert json.dumps(picked)


def test_token_comparison_and_its_fallback() -> None:
    loaded = {"content": "hello world", "token_ids": [1, 2, 3, 4]}
    same = compare(loaded, {"content": "hello world", "token_ids": [1, 2, 3, 4]})
    assert same == {"compared": "tokens", "status": "identical"}
    # the same text by other tokens: a divergence only token ids see
    other = compare(loaded, {"content": "hello world", "token_ids": [1, 2, 5, 6]})
    assert other["status"] == "diverged"
    assert other["token_index"] == 2
    assert "position" not in other
    got = compare(loaded, {"content": "hello there", "token_ids": [1, 2, 9]})
    assert (got["token_index"], got["position"]) == (2, len("\x1ehello "))
    # one side without ids (or ids on one, strings on the other): the text
    text = compare(loaded, {"content": "hello there"})
    assert text["compared"] == "text"
    assert "token_index" not in text
    strs = compare({"content": "a", "token_strs": ["a"]}, {"content": "a", "token_strs": ["a"]})
    assert strs == {"compared": "token_strings", "status": "identical"}
    assert compare(loaded, {"content": "hello world", "token_strs": ["x"]})["compared"] == "text"


def test_the_judged_continuation_starts_at_the_first_difference() -> None:
    rec = {
        "reasoning": "think",
        "content": "abcdef",
        "tool_calls": [{"name": "f", "arguments": "{}"}],
    }
    text = output_text(rec)
    assert prefix_reply(rec, text.index("d"))["content"] == "abc"
    assert prefix_reply(rec, 2)["content"] is None  # in the reasoning: no common content
    assert prefix_reply(rec, len(text) - 1)["content"] == "abcdef"  # in the calls
    assert "tool_calls" not in prefix_reply(rec, len(text) - 1)
    assert prefix_reply(rec, None)["content"] is None


def test_which_servers_are_exact() -> None:
    assert exactness({}, target_says=True)[0]
    assert exactness({"server_info": {"enable_deterministic_inference": True}})[0]
    assert exactness({"launch": {"env": {"VLLM_BATCH_INVARIANT": "1"}, "command": []}})[0]
    llama = ["python", "-m", "harness.llamacpp", "--parallel", "8"]
    assert not exactness({"launch": {"command": llama}})[0]
    one = [*llama, "--parallel", "1", "--no-prompt-cache"]  # the last one given wins
    exact, why = exactness({"launch": {"command": one}})
    assert exact
    assert "--parallel 1" in why
    assert not exactness({"launch": {"command": [*llama, "--parallel", "1"]}})[0]
    assert not exactness({"server_info": {"enable_deterministic_inference": False}})[0]


def test_a_divergence_only_the_token_ids_see_is_reported_by_its_ids() -> None:
    """The same text by other tokens: the report shows the ids around the first difference."""
    base = {"variant": "v", "repeat": 0, "turn": 1, "attempt": 0, "exact": True,
            "loaded_label": "ok_text"}  # fmt: skip
    same = {**base, "session": 0, "compared": "tokens", "status": "identical"}
    loaded = {"content": "hello world", "token_ids": [1, 2, 3, 4]}
    row = {**base, "session": 1, **compare(loaded, {"content": "hello world", "token_ids": [1, 9]})}
    summary = replay_summary([same, row], 2)
    assert summary["compared_by"] == {"tokens": 2}
    assert summary["judge"] == {"judged": 0, "implausible": 0, "plausible": 0, "not_judged": 1,
                                "error": None}  # fmt: skip
    md = "\n".join(replay_lines([{"label": "v", "oracles": {"replay": summary}}]))
    assert "first difference at token 1 (loaded: ok_text)" in md
    assert "loaded tokens: `[1, 2, 3, 4]`" in md
    assert "| v | yes | 2 | token ids 2 | 1 | 1 | - | 0 |" in md


@pytest.mark.slow
@pytest.mark.parametrize(
    "faults",
    [{"fault_rate": 0.05}, {"fault_scale": LOAD_SCALE}],
    ids=["exact-fault-rate", "load-race"],
)
async def test_replay_with_concurrency_gives_the_verdicts_of_one_at_a_time(
    make_sim: Callable[..., str], tmp_path: Path, faults: dict[str, float]
) -> None:
    """``--oracle-concurrency 8`` on the deterministic simulator: the same verdict for every
    send as the replay one at a time of the same run, precision 1.0 and recall of at least
    0.95 against the ground truth. Under the load-dependent race the replay's own sends can
    be raced beside each other: those are re-sent alone before they count."""
    url = make_sim(deterministic=True, **faults)
    one = tmp_path / "one"
    one.mkdir()
    await _oracle_run(url, one, 40)
    many = tmp_path / "many"
    shutil.copytree(one, many)
    (many / ORACLE_REPLAY_FILE).unlink()
    first = read_rows(one / ORACLE_REPLAY_FILE)
    client = ChatClient(url, model="m", max_connections=16)
    try:
        rows = await replay_oracle_variant(client, many, "r1", (first[0]["variant"], 0), Sample(),
                                           access=Access(None, "off"), lanes=8)  # fmt: skip
    finally:
        await client.aclose()
    alone = {_key(r): r["status"] for r in first}
    together = {_key(r): r["status"] for r in rows}
    assert together == alone  # every send, once, with the same verdict
    assert {r.get("concurrency") for r in rows if "concurrent_diverged" not in r} == {8}
    injected = {_key(r) for r in rows if r["sim_injected"] not in (None, "none")}
    diverged = {k for k, status in together.items() if status == "diverged"}
    assert injected
    assert diverged <= injected  # precision 1.0
    assert len(diverged) >= 0.95 * len(injected)  # recall
    assert all("concurrent_diverged" in r for r in rows if r["status"] == "diverged")
    assert all("concurrent_diverged" in r for r in rows if r["loaded_corrupted"])
    again = sum(1 for r in rows if "concurrent_diverged" in r)
    [v] = write_report(many)["variants"]
    assert v["oracles"]["replay"]["rechecked_alone"] == again
    assert v["oracles"]["replay"]["extra_requests"] == len(rows) + again
