"""The server's own alarms end to end against the simulator: speculative acceptance from
SGLang's meta_info, and kv_canary lines read from the server's log as the run goes."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from harness.analysis.oracles import oracle_evidence
from harness.drive.driver import Progress
from harness.record.rundir import ORACLE_ALARMS_FILE
from harness.record.turns import read_rows, read_turns
from harness.report.build import write_report
from harness.run.execute import execute, write_run_json
from harness.run.oracle_alarms import SpecRules, line_time, spec_alarm
from tests.cli.test_cli import harness
from tests.run.endpoint_options import endpoint_options
from tests.run.test_replay import LOAD_SCALE, _fault_run, small_scenario

RULES = SpecRules(min_length=1.4, min_tokens=8, max_rate=0.96)


def _key(r: dict[str, Any]) -> tuple[Any, ...]:
    return (r["variant"], r["repeat"], r["session"], r["turn"], r["attempt"])


def _injected(r: dict[str, Any]) -> bool:
    return r.get("sim_injected") not in (None, "none")


async def test_spec_acceptance_alarms_are_the_injected_sends(
    make_sim: Callable[..., str], tmp_path: Path
) -> None:
    url = make_sim(fault_scale=LOAD_SCALE)
    scenario = small_scenario(40, turns=8, max_context=16000).with_overrides(return_meta_info=True)
    options = endpoint_options(
        scenario, tmp_path, url, 40, stream=False, oracles=("spec_accept",), spec_rules=RULES
    )
    write_run_json(options, "r1")
    await execute(options, "r1", Progress())
    rows = [r for r in read_rows(tmp_path / ORACLE_ALARMS_FILE) if "accept_length" in r]
    turns = read_turns(tmp_path / "turns.jsonl")
    assert len(rows) == len([t for t in turns if t["label"] != "transport_error"])
    alarms = [r for r in rows if r["alarm"] == "spec_accept"]
    seen = [r for r in rows if _injected(r) and r["completion_tokens"] > RULES.min_tokens]
    assert alarms
    assert all(_injected(r) for r in alarms)  # precision 1.0
    assert sum(1 for r in seen if r["alarm"]) >= 0.95 * len(seen)
    assert {_key(r) for r in alarms} == {
        k for k, v in oracle_evidence(tmp_path).items() if "spec_accept" in v
    }
    [v] = write_report(tmp_path)["variants"]
    a = v["oracles"]["alarms"]["spec_accept"]
    assert a["alarms"] == len(alarms) == v["spec_accept_alarms"]
    assert "## The server's own alarms" in (tmp_path / "report.md").read_text()


@pytest.fixture
def sim_log(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "server.log"
    handler = logging.FileHandler(path)
    logger = logging.getLogger("harness.sim.engine")
    logger.addHandler(handler)
    logger.setLevel(logging.WARNING)
    yield path
    logger.removeHandler(handler)
    handler.close()


async def test_kv_canary_lines_are_tied_to_the_sends_in_flight(
    make_sim: Callable[..., str], tmp_path: Path, sim_log: Path
) -> None:
    url = make_sim(fault_scale=LOAD_SCALE, kv_canary=True)
    out = tmp_path / "run"
    out.mkdir()
    await _fault_run(url, out, 40, oracles=("kv_canary",), server_log=sim_log)
    turns = read_turns(out / "turns.jsonl")
    injected = {_key(t) for t in turns if _injected(t)}
    rows = read_rows(out / ORACLE_ALARMS_FILE)
    lines = [r for r in rows if r["alarm"] == "kv_canary_line"]
    assert injected
    written = sim_log.read_text().count("kv_canary violation")  # noqa: ASYNC240 - a test
    assert len(lines) == len(injected) == written
    tied = {_key(r) for r in rows if r["alarm"] == "kv_canary"}
    assert injected <= tied  # every corrupted send was in flight at a line
    evidence = oracle_evidence(out)
    assert all("kv_canary" in evidence[k] for k in injected)
    [v] = write_report(out)["variants"]
    assert v["kv_canary_alarms"] == len(lines)
    assert v["oracles"]["alarms"]["kv_canary"]["sends"] == len(tied)


def test_rules_and_log_times() -> None:
    healthy = {"completion_tokens": 200, "spec_verify_ct": 72, "spec_accept_token_num": 128,
               "spec_draft_token_num": 216}  # fmt: skip
    assert spec_alarm(healthy, SpecRules())[0] is None
    garbled = {**healthy, "spec_verify_ct": 180}
    assert spec_alarm(garbled, SpecRules())[0] == "accept_length"
    assert spec_alarm({**garbled, "completion_tokens": 100}, SpecRules())[0] is None  # short
    looping = {**healthy, "spec_accept_token_num": 212}
    assert spec_alarm(looping, SpecRules())[0] == "accept_rate"
    at, slack = line_time("[2026-01-02 03:04:05.250] kv_canary violation: x", 0.0)
    assert slack == 0.05
    assert at % 1 == pytest.approx(0.25)
    assert line_time("kv_canary violation: launch_tag=1", 7.0)[0] == 7.0


def test_spec_accept_needs_unstreamed_answers(tmp_path: Path) -> None:
    proc = harness("run", "--oracle", "spec_accept", "--out", str(tmp_path / "r"))
    assert proc.returncode == 2
    assert "--no-stream" in proc.stderr
