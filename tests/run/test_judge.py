"""The judge: --confirm's teacher-forced scores of flagged and sampled turns, checked against
the simulator's ground truth; ``harness classify --judge URL`` on saved outputs."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from harness.analysis import judge as rule
from harness.cli.main import main
from harness.client.scoring import Scorer
from harness.record.rundir import JUDGE_FILE, TRANSCRIPTS_FILE
from harness.record.transcripts import load_transcripts
from harness.record.turns import read_turns
from harness.report.build import write_report
from harness.run.judge import CANNOT_SCORE, judge_turns, sampled
from tests.run.test_replay import LOAD_SCALE, _fault_run


def _rows(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_text().splitlines()]


async def test_judge_confirms_what_the_simulator_injected(
    make_sim: Callable[..., str], tmp_path: Path
) -> None:
    url = make_sim(fault_scale=LOAD_SCALE)
    await _fault_run(url, tmp_path, 40, confirm=True, judge_sample=1.0)
    turns = read_turns(tmp_path / "turns.jsonl")
    flagged = [t for t in turns if t["corrupted"]]
    judged = _rows(tmp_path / JUDGE_FILE)
    assert flagged
    assert len(judged) >= 0.95 * len(turns)  # every turn, but the empty ones
    scored = [t for t in turns if "judge_nll" in t]
    assert len(scored) == len([j for j in judged if "judge_nll" in j])
    assert {(t["session"], t["turn"], t["attempt"]) for t in flagged} <= {
        (t["session"], t["turn"], t["attempt"]) for t in scored
    }
    confirmed = [t for t in scored if t["judge_confirmed"]]
    assert confirmed
    # against the ground truth: every confirmed turn was injected, no clean turn confirmed
    assert all(t["sim_injected"] not in (None, "none") for t in confirmed)
    clean = [t for t in scored if t["sim_injected"] == "none"]
    assert len(clean) > 100
    assert not [t for t in clean if t["judge_confirmed"]]
    # the greedy check: measured on the greedy turns written as content only (a tool call
    # is re-rendered by the template), on here (the simulator's healthy answers are its first
    # choices), and what it confirms was injected too (asserted above for every confirmed)
    gapped = [t for t in turns if "judge_gap" in t]
    assert gapped
    assert not [t for t in gapped if t.get("tool_calls")]
    [v] = write_report(tmp_path)["variants"]
    j = v["judge"]
    assert j["greedy"]["on"] is True
    assert j["greedy"]["flagged_checked"] > 0
    assert "| on (" in (tmp_path / "report.md").read_text()
    assert j["sim_precision"] == 1.0
    assert j["sim_false_positives"] == 0
    assert 0 < v["confirmed_session_corruption_rate"] <= v["session_corruption_rate"]
    assert "## Judge: teacher-forced confirmation" in (tmp_path / "report.md").read_text()


async def test_judge_samples_passed_turns_by_seed(
    make_sim: Callable[..., str], tmp_path: Path
) -> None:
    url = make_sim(index_k="fp8")
    await _fault_run(url, tmp_path, 12, confirm=True, judge_sample=0.3)
    turns = read_turns(tmp_path / "turns.jsonl")
    judged = _rows(tmp_path / JUDGE_FILE)
    keys = {(j["session"], j["turn"], j["attempt"]) for j in judged}
    want = {
        (t["session"], t["turn"], t["attempt"])
        for t in turns
        if sampled(1, (t["variant"], t["repeat"], t["session"], t["turn"], t["attempt"]), 0.3)
    }
    assert keys == want
    assert 0.15 * len(turns) < len(keys) < 0.45 * len(turns)
    assert not [j for j in judged if j["flagged"]]


def test_window_nll_and_threshold() -> None:
    mean, worst = rule.window_nll([-0.1] * 20 + [-9.0] * 4 + [-0.1] * 20, window=8)
    assert mean == pytest.approx((0.1 * 40 + 36) / 44)
    assert worst == pytest.approx((36 + 0.4) / 8)
    assert rule.threshold([0.3] * 3) == rule.ABS_FLOOR  # too few healthy references
    assert rule.threshold([0.3, 0.31, 0.29, 0.3, 0.32, 5.0]) == rule.ABS_FLOOR
    wide = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
    assert rule.threshold(wide) > 6.0


def test_greedy_gap_and_the_greedy_check() -> None:
    top = [{1: -0.1}, {2: -0.2}, {3: -0.5}, {4: -0.1}]
    # the token given, against the model's first choice; the last token left out (a length
    # cut may have re-tokenized it)
    assert rule.greedy_gap([-0.1, -0.2, -6.5, -9.0], top) == pytest.approx(6.0)
    assert rule.greedy_gap([-0.1, -0.2, -0.5, -9.0], top) == 0.0

    def row(variant: str, flagged: bool, worst: float, gap: float | None) -> dict[str, Any]:
        out = {"variant": variant, "flagged": flagged, "judge_nll": worst / 2,
               "judge_nll_worst": worst, "session": 0}  # fmt: skip
        return {**out, "judge_gap": gap} if gap is not None else out

    healthy = [row("v", False, 0.5 + i / 100, 0.0) for i in range(30)]
    loop = row("v", True, 0.6, 6.0)  # probable to the window rule, not the model's choice
    own_loop = row("v", True, 0.6, 0.4)  # the model's own greedy loop: every token its first
    tools = row("v", True, 0.6, None)  # a tool call: no greedy check
    # a server whose scoring does not reproduce its greedy decode: the check is off there
    off = [row("w", False, 0.5, 5.0 if i % 3 == 0 else 0.0) for i in range(30)]
    w_loop = row("w", True, 0.6, 6.0)
    scored, limits = rule.decide([*healthy, loop, own_loop, tools, *off, w_loop])
    by_key = {(r["variant"], r["flagged"], r.get("judge_gap")): r for r in scored}
    assert limits["v"] == rule.ABS_FLOOR
    assert by_key[("v", True, 6.0)]["judge_confirmed"] is True
    assert by_key[("v", True, 6.0)]["judge_by"] == "greedy"
    assert by_key[("v", True, 0.4)]["judge_confirmed"] is False
    assert by_key[("v", True, None)]["judge_confirmed"] is False
    assert by_key[("w", True, 6.0)]["judge_confirmed"] is False
    block = rule.variant_judge([r for r in scored if r["variant"] == "v"], limits["v"], 1)
    assert block["greedy"] == {"on": True, "floor_nats": rule.GAP_FLOOR, "reference": 30,
                               "reference_over": 0, "flagged_checked": 2,
                               "flagged_confirmed": 1}  # fmt: skip
    block = rule.variant_judge([r for r in scored if r["variant"] == "w"], limits["w"], 1)
    assert block["greedy"]["on"] is False
    assert block["greedy"]["reference_over"] == 10
    # too few healthy turns measured to know: off
    assert rule.greedy_check([0.0] * (rule.GAP_REFERENCE_MIN - 1)) is False
    assert rule.greedy_check([0.0] * 40 + [5.0]) is True  # one above: no evidence of a share


def _chat(url: str, messages: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    body = {"model": "m", "messages": messages, "stream": False, "seed": 5, **extra}
    resp = httpx.post(url + "/v1/chat/completions", json=body, timeout=10)
    resp.raise_for_status()
    message: dict[str, Any] = resp.json()["choices"][0]["message"]
    return message


def test_classify_judge_scores_saved_outputs(make_sim: Callable[..., str], tmp_path: Path) -> None:
    url = make_sim(index_k="fp8")
    lines = []
    for i in range(6):
        messages = [{"role": "user", "content": f"Question {i}: summarise the report in a line."}]
        answer = _chat(url, messages)
        lines.append({"id": f"ok{i}", "text": answer.get("content") or "", "source": "server",
                      "messages": messages})  # fmt: skip
    bad = dict(lines[0], id="changed")
    words = bad["text"].split()
    bad["text"] = " ".join(words[: len(words) // 2] + ["zebra", "quantum", "marmalade"] * 3)
    lines.append(bad)
    lines.append({"id": "no-prompt", "text": "hello"})
    src, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    src.write_text("".join(json.dumps(x) + "\n" for x in lines))
    assert main(["classify", str(src), "-o", str(out), "--judge", url]) == 0
    got = {r["id"]: r for r in _rows(out)}
    assert set(got) == {x["id"] for x in lines}
    assert all(not got[f"ok{i}"]["judge_confirmed"] for i in range(6))
    assert got["changed"]["judge_confirmed"]
    assert got["changed"]["judge_nll_worst"] > got["ok0"]["judge_nll_worst"] + 2
    assert "judge_nll" not in got["no-prompt"]  # nothing to score it after
    assert got["ok0"]["label"] == "ok_text"


def test_classify_judge_against_a_server_that_cannot_score(
    make_sim: Callable[..., str], tmp_path: Path
) -> None:
    url = make_sim()
    src = tmp_path / "in.jsonl"
    src.write_text(json.dumps({"id": "a", "text": "hi", "context": "say hi"}) + "\n")
    code = main(["classify", str(src), "--judge", url, "--scoring-api", "llamacpp"])
    assert code == 3


class _Watch:
    """The requests a scorer sent and the most it had in flight at once (httpx's own event
    hooks on the scorer's client)."""

    def __init__(self, scorer: Scorer) -> None:
        self.sent = self.now = self.peak = 0
        self.beside: list[int] = []  # per request: the requests in flight with it sent
        scorer._http.event_hooks["request"].append(self._request)
        scorer._http.event_hooks["response"].append(self._response)

    async def _request(self, _: httpx.Request) -> None:
        self.sent += 1
        self.now += 1
        self.peak = max(self.peak, self.now)
        self.beside.append(self.now)

    async def _response(self, _: httpx.Response) -> None:
        self.now -= 1


async def _judge(
    url: str, run_dir: Path, out_dir: Path, lanes: int
) -> tuple[int, str | None, _Watch]:
    """judge_turns over ``run_dir``'s transcripts (every turn) into ``out_dir``: (rows, why
    the server cannot score, what the scorer sent)."""
    out_dir.mkdir(exist_ok=True)  # noqa: ASYNC240 - a test
    transcripts = load_transcripts(run_dir / TRANSCRIPTS_FILE)
    async with Scorer(url, "sglang", model="m", connections=lanes) as scorer:
        watch = _Watch(scorer)
        n, why = await judge_turns(scorer, transcripts, out_dir / JUDGE_FILE, part=(None, None),
                                   share=1.0, seed=1, base={}, lanes=lanes)  # fmt: skip
    return n, why, watch


def _key(row: dict[str, Any]) -> tuple[Any, ...]:
    return tuple(row[k] for k in rule.KEY)


async def test_judge_lanes_score_what_one_at_a_time_scores_and_resume(
    make_sim: Callable[..., str], tmp_path: Path
) -> None:
    """Eight scores in flight on a server with no race: the same turns, each once, the same
    decisions as one at a time; a judge cut short after three rows scores only the others."""
    url = make_sim(index_k="fp8")
    run = tmp_path / "run"
    run.mkdir()
    await _fault_run(url, run, 12, judge="off", keep_transcripts=True)
    one, one_why, one_sent = await _judge(url, run, tmp_path / "one", 1)
    eight, eight_why, eight_sent = await _judge(url, run, tmp_path / "eight", 8)
    assert one_why is eight_why is None
    assert (one_sent.peak, eight_sent.peak) == (1, 8)
    alone, lanes = _rows(tmp_path / "one" / JUDGE_FILE), _rows(tmp_path / "eight" / JUDGE_FILE)
    assert one == eight == len(alone) == len(lanes) > 50
    assert {_key(r) for r in alone} == {_key(r) for r in lanes}
    assert len({_key(r) for r in lanes}) == len(lanes)  # each turn once
    assert [_key(r) for r in lanes] != [_key(r) for r in alone]  # appended as they finish
    decided = [{_key(r): r["judge_confirmed"] for r in rule.decide(rows)[0]}
               for rows in (alone, lanes)]  # fmt: skip
    assert decided[0] == decided[1]
    by_key = {_key(r): r for r in alone}
    assert all(abs(r["judge_nll"] - by_key[_key(r)]["judge_nll"]) < 0.01 for r in lanes)

    cut = tmp_path / "cut"
    cut.mkdir()
    head = (tmp_path / "eight" / JUDGE_FILE).read_bytes().splitlines(keepends=True)[:3]
    (cut / JUDGE_FILE).write_bytes(b"".join(head))
    more, why, _ = await _judge(url, run, cut, 8)
    assert why is None
    assert more == len(lanes) - 3
    resumed = _rows(cut / JUDGE_FILE)
    assert (cut / JUDGE_FILE).read_bytes().startswith(b"".join(head))
    assert sorted(_key(r) for r in resumed) == sorted(_key(r) for r in lanes)


async def test_judge_lanes_rescore_alone_what_the_rule_could_confirm(
    make_sim: Callable[..., str], tmp_path: Path
) -> None:
    """On a server whose race can perturb scores made beside others, every score the rule
    could confirm (above its floor) rests on a lone request: made in the lanes, it is held and
    scored again alone when they are done, and that lone score is the row."""
    url = make_sim(fault_scale=LOAD_SCALE)
    run = tmp_path / "run"
    run.mkdir()
    await _fault_run(url, run, 16, judge="off", keep_transcripts=True)
    _, why, sent = await _judge(url, run, tmp_path / "j", 8)
    assert why is None
    assert sent.peak > 1
    rows = _rows(tmp_path / "j" / JUDGE_FILE)
    held = [r for r in rows if "beside_nll_worst" in r]
    assert held
    assert all(
        r["beside_nll_worst"] > rule.ABS_FLOOR or r.get("beside_gap", 0.0) > rule.GAP_FLOOR
        for r in held
    )
    assert rows[-len(held) :] == held  # written after the lanes
    assert set(sent.beside[-3 * len(held) :]) == {1}  # (tokenize twice, score) each alone
    for r in rows[1:]:  # (the first is scored alone before the lanes open)
        if r.get("judge_nll_worst", 0) > rule.ABS_FLOOR or r.get("judge_gap", 0) > rule.GAP_FLOOR:
            assert "beside_nll_worst" in r
    clean = [r for r in rule.decide(rows)[0] if r["sim_injected"] == "none"]
    assert clean
    assert not [r for r in clean if r["judge_confirmed"]]


async def test_judge_lanes_on_a_server_that_cannot_score_send_one_request(
    make_sim: Callable[..., str], tmp_path: Path
) -> None:
    """The first turn is scored alone: a server that cannot score is asked once, not eight
    times, and the judge records it once."""
    url = make_sim(index_k="fp8")
    run = tmp_path / "run"
    run.mkdir()
    await _fault_run(url, run, 4, judge="off", keep_transcripts=True)
    off = make_sim(index_k="fp8", scoring=False)
    out = tmp_path / "j"
    out.mkdir()
    transcripts = load_transcripts(run / TRANSCRIPTS_FILE)
    async with Scorer(off, "sglang", model="m", connections=8) as scorer:
        watch = _Watch(scorer)
        n, why = await judge_turns(scorer, transcripts, out / JUDGE_FILE, part=(None, None),
                                   share=1.0, seed=1, base={"run_id": "r"}, lanes=8)  # fmt: skip
    assert n == 0
    assert why is not None
    assert "404" in why
    assert watch.sent == 1
    [mark] = _rows(out / JUDGE_FILE)
    assert mark[CANNOT_SCORE] == why
    assert mark["session"] is None


def test_classify_judge_greedy_check_on_saved_greedy_outputs(
    make_sim: Callable[..., str], tmp_path: Path
) -> None:
    """Lines written at temperature 0 as text get the run's greedy check (``judge_gap``): a
    word the model did not pick, in a healthy greedy answer, is far below its first choice;
    the healthy answers' every token is that choice. (The simulator's scoring model is off
    for the rest of an answer once a word differs, so its window rule confirms such a line
    too; a line that only the greedy check confirms is ``decide``'s, tested above.)"""
    url = make_sim(index_k="fp8")
    lines = []
    for i in range(rule.GAP_REFERENCE_MIN + 4):
        messages = [{"role": "user", "content": f"Question {i}: summarise the report in a line."}]
        answer = _chat(url, messages, temperature=0)
        lines.append({"id": f"ok{i}", "text": answer.get("content") or "", "source": "server",
                      "messages": messages, "temperature": 0})  # fmt: skip
    words = lines[0]["text"].split()
    assert len(words) > 12
    swapped = " ".join(words[:10] + ["and"] + words[11:])  # one word the model did not pick
    lines.append(dict(lines[0], id="swapped", text=swapped))
    lines.append(dict(lines[1], id="sampled", text=swapped, temperature=0.7))  # no check
    src, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    src.write_text("".join(json.dumps(x) + "\n" for x in lines))
    assert main(["classify", str(src), "-o", str(out), "--judge", url]) == 0
    got = {r["id"]: r for r in _rows(out)}
    healthy = [got[f"ok{i}"] for i in range(rule.GAP_REFERENCE_MIN + 4)]
    assert [r["judge_gap"] for r in healthy] == [0.0] * len(healthy)
    assert not [r for r in healthy if r["judge_confirmed"]]
    assert got["swapped"]["judge_gap"] > rule.GAP_FLOOR
    assert got["swapped"]["judge_confirmed"] is True
    assert "judge_gap" not in got["sampled"]  # sampled at 0.7: no greedy check
    assert got["sampled"]["judge_confirmed"] is True  # (the window rule's)
