"""``harness run --workers N`` through the command line: real processes, real simulators.

The same records as with one process, Ctrl-C and --resume, a server that dies, trace
workloads and raw mode, and bad values. Worker processes are found as children of the run.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from harness.record.transcripts import load_transcripts
from harness.record.turns import read_turns
from tests.cli.test_cli import CLI, ROOT, harness
from tests.cli.test_cli_faults import target_file
from tests.run.test_run_lifecycle import ctrl_c_reaches_it
from tests.standins import sim_processes

SMALL = ["--turns", "6", "--max-context", "12000", "--no-progress"]
SAME = ("variant", "session", "turn", "attempt", "label", "corrupted", "content", "tool_calls",
        "prompt_tokens", "sim_injected")  # fmt: skip


def _records(out: Path) -> list[tuple[str, ...]]:
    return sorted(tuple(str(r.get(k)) for k in SAME) for r in read_turns(out / "turns.jsonl"))


def _sessions(out: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in (out / "sessions.jsonl").read_text().splitlines()]


def _workers_of(pid: int) -> list[int]:
    """The worker processes the run ``pid`` started."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            stat = Path(f"/proc/{name}/stat").read_text()
            cmd = Path(f"/proc/{name}/cmdline").read_bytes()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid and b"harness.pool.child" in cmd:
            found.append(int(name))
    return found


def _gone(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] == "Z"


@pytest.mark.slow
def test_two_workers_write_the_same_run_as_one(tmp_path: Path) -> None:
    target = target_file(tmp_path, "")  # the simulator without corruption: a fixed outcome
    common = ["run", "--target", str(target), "--sessions", "10", "--speed", "60", *SMALL]
    common += ["--keep-transcripts", "--seed", "717273"]
    one = harness(*common, "--workers", "1", "--out", str(tmp_path / "one"))
    two = harness(*common, "--workers", "2", "--out", str(tmp_path / "two"))
    assert one.returncode == 0, one.stderr
    assert two.returncode == 0, two.stderr
    a, b = tmp_path / "one", tmp_path / "two"
    assert _records(a)
    assert _records(b) == _records(a)
    key = lambda d: (d["session"], d["ended"])  # noqa: E731
    assert sorted(map(key, _sessions(b))) == sorted(map(key, _sessions(a)))
    # the transcripts rebuild the same requests
    ta, tb = load_transcripts(a / "transcripts.jsonl"), load_transcripts(b / "transcripts.jsonl")
    assert len(ta) == 10
    assert set(tb) == set(ta)
    for k, t in ta.items():
        assert [tb[k].wire(i) for i in range(len(tb[k].rows))] == [
            t.wire(i) for i in range(len(t.rows))
        ]
    sa = json.loads((a / "summary.json").read_text())
    sb = json.loads((b / "summary.json").read_text())
    assert sb["variants"][0]["turns"] == sa["variants"][0]["turns"]
    (me,) = sb["variants"][0]["harness_self"]
    assert me["workers"] == 2
    assert me["turns"] == sb["variants"][0]["turns"]
    assert len(me["per_worker"]) == 2
    assert json.loads((b / "run.json").read_text())["workers"] == 2
    # (that the in-flight count is both workers' is tests/pool/test_workers.py's, on a
    # simulator slow enough for the requests to overlap: at --speed 60 it hangs on timing)


@pytest.mark.slow
def test_ctrl_c_with_workers_then_resume_with_other_workers(tmp_path: Path) -> None:
    out, seed = tmp_path / "r", "747576"
    proc = subprocess.Popen(
        [*CLI, "run", "--sessions", "6", *SMALL, "--ab", "index_k=fp8,bf16", "--speed", "2",
         "--seed", seed, "--workers", "2", "--out", str(out)],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        preexec_fn=ctrl_c_reaches_it,
    )  # fmt: skip
    turns = out / "turns.jsonl"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # wait until some turns are on disk
        if turns.exists() and len(turns.read_text().splitlines()) >= 8:
            break
        time.sleep(0.2)
    workers = _workers_of(proc.pid)
    assert len(workers) == 2
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr
    assert "--resume" in stderr
    rows = read_turns(turns)
    stopped = "cancelled: the run was stopped"  # (or "... while the answer was classified")
    cancelled = [r for r in rows if (r["transport_error"] or "").startswith(stopped)]
    assert cancelled
    assert len({r["session"] % 2 for r in cancelled}) == 2  # both workers' shards recorded theirs
    assert (out / "summary.json").exists()
    loads = [json.loads(x) for x in (out / "selfreport.jsonl").read_text().splitlines()]
    assert loads[-1]["workers"] == 2  # the interrupted load's report was written
    assert all(_gone(pid) for pid in workers)
    assert sim_processes(f"--seed {seed}") == []

    again = harness("run", "--resume", str(out), "--workers", "3")
    assert again.returncode == 0, again.stderr
    keys = Counter((d["variant"], d["repeat"], d["session"]) for d in _sessions(out))
    assert len(keys) == 12  # every session of both variants finished
    assert max(keys.values()) == 1  # none was run twice
    rows = read_turns(turns)
    assert {(r["variant"], r["session"]) for r in rows if r["turn"] == 0} == {
        (k[0], k[2]) for k in keys
    }
    assert all(not r["transport_error"] for r in rows)  # cancelled rows were set aside


@pytest.mark.slow
def test_a_server_that_dies_stops_its_variant_with_workers(tmp_path: Path) -> None:
    factors = """
[factors.server.crashing]
args = ["--crash-after", "8"]
[factors.server.steady]
args = []
"""
    target = target_file(tmp_path, factors)
    out, seed = tmp_path / "run", "777879"
    proc = harness(
        "run", "--target", str(target), "--ab", "server=crashing,steady", "--sessions", "4",
        "--turns", "5", "--max-context", "12000", "--speed", "100", "--seed", seed,
        "--workers", "2", "--out", str(out), "--no-progress",
    )  # fmt: skip
    assert proc.returncode == 3, proc.stderr
    assert "Traceback" not in proc.stderr
    assert "variant server=crashing: the server process died during the run" in proc.stderr
    turns = read_turns(out / "turns.jsonl")
    steady = [t for t in turns if t["variant"] == "server=steady"]
    assert steady
    assert not any(t["transport_error"] for t in steady)
    outcomes = {o["label"]: o for o in json.loads((out / "outcomes.json").read_text())}
    died = outcomes["server=crashing"]
    assert died["error"] == "the server process died during the run (exit code 70)"
    assert died["server_death"]["exit_code"] == 70  # the finding: how, when, what it said
    assert died["server_death"]["turns_done"] >= 1
    assert died["server_death"]["last_lines"]
    assert sum(outcomes["server=steady"]["ended"].values()) == 4
    assert sim_processes(f"--seed {seed}") == []


@pytest.mark.slow
@pytest.mark.parametrize("api", ["chat", "completions"])
def test_trace_workloads_and_raw_mode_with_workers(tmp_path: Path, api: str) -> None:
    target = target_file(tmp_path, "")
    common = ["run", "--target", str(target), "--workload", "scenarios/example_trace.jsonl"]
    common += ["--pace", "fast", "--api", api, "--speed", "100", "--no-progress"]
    one = harness(*common, "--workers", "1", "--out", str(tmp_path / "one"))
    two = harness(*common, "--workers", "3", "--out", str(tmp_path / "two"))
    assert one.returncode == 0, one.stderr
    assert two.returncode == 0, two.stderr
    assert _records(tmp_path / "one")
    assert _records(tmp_path / "two") == _records(tmp_path / "one")
    rows = read_turns(tmp_path / "two" / "turns.jsonl")
    assert all(r["trace"] for r in rows)
    (me,) = json.loads((tmp_path / "two" / "summary.json").read_text())["variants"][0][
        "harness_self"
    ]
    assert me["workers"] == 3  # one conversation per worker


@pytest.mark.parametrize("value", ["0", "two", "-1"])
def test_a_bad_workers_value_is_a_one_line_usage_error(tmp_path: Path, value: str) -> None:
    proc = harness("run", "--workers", value, "--out", str(tmp_path / "r"))
    assert proc.returncode == 2
    assert "--workers" in proc.stderr
    assert "or auto" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "r").exists()


def test_dry_run_says_the_workers(tmp_path: Path) -> None:
    proc = harness("run", "--sessions", "200", "--workers", "3", "--dry-run")
    assert proc.returncode == 0, proc.stderr
    assert "workers: up to 3 per variant, 200 requests in flight" in proc.stdout
