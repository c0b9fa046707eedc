"""The whole CLI against failing servers and bad input: clean stops, one-line errors, exit codes.

Real subprocesses and real simulator servers; each test marks its simulators with a seed so
that leftover processes can be looked for.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from harness import labels as L
from harness.record.turns import read_turns
from tests.standins import sim_processes

CLI = [sys.executable, "-m", "harness.cli"]
ROOT = Path(__file__).resolve().parents[2]
KEY = "sk-sim-required-7731"

TARGET = """
name = "sim"
mode = "launch"
model = "deepseek-ai/DeepSeek-V4-Flash"
warm_up = false
flush_cache = false

[launch]
command = ["{{python}}", "-m", "harness.sim", "--host", "{{host}}", "--port", "{{port}}",
           "--model", "{{model}}", "--fault-scale", "0"{extra}]
stop_grace_s = 5

[ready]
paths = ["/health_generate", "/health"]
timeout_s = 60
interval_s = 0.1
"""


def harness(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, *args],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=ROOT,
        env={**os.environ, "OPENAI_API_KEY": "", **(env or {})},
    )


def target_file(tmp_path: Path, factors: str, extra: tuple[str, ...] = ()) -> Path:
    path = tmp_path / "target.toml"
    added = "".join(f', "{a}"' for a in extra)
    path.write_text(TARGET.format(extra=added) + factors)
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# ---------------------------------------------------------------- a server dies mid-run


@pytest.mark.slow
def test_a_crashing_variant_stops_cleanly_and_the_other_still_runs(tmp_path: Path) -> None:
    factors = """
[factors.server.crashing]
args = ["--crash-after", "8"]
[factors.server.steady]
args = ["--slow-start", "1"]
"""
    target = target_file(tmp_path, factors)
    out, seed = tmp_path / "run", "515253"
    proc = harness(
        "run",
        "--target",
        str(target),
        "--ab",
        "server=crashing,steady",
        "--sessions",
        "4",
        "--turns",
        "5",
        "--max-context",
        "12000",
        "--speed",
        "100",
        "--seed",
        seed,
        "--out",
        str(out),
        "--no-progress",
    )
    assert proc.returncode == 3, proc.stderr
    assert "Traceback" not in proc.stderr
    assert "variant server=crashing: the server process died during the run" in proc.stderr
    turns = read_turns(out / "turns.jsonl")
    crashed = [t for t in turns if t["variant"] == "server=crashing"]
    steady = [t for t in turns if t["variant"] == "server=steady"]
    assert 0 < len([t for t in crashed if t["label"] != L.TRANSPORT_ERROR]) <= 8
    assert {t["transport_error"].split(":")[0] for t in crashed if t["transport_error"]} <= {
        "cut",
        "connect",
        "cancelled",
    }
    assert not any(t["corrupted"] for t in turns)
    # the other variant ran in full, after waiting out its slow start
    assert steady
    assert not any(t["transport_error"] for t in steady)
    outcomes = {o["label"]: o for o in json.loads((out / "outcomes.json").read_text())}
    died = outcomes["server=crashing"]
    assert died["error"] == "the server process died during the run (exit code 70)"
    assert died["server_death"]["exit_code"] == 70  # the finding: how, when, what it said
    assert died["server_death"]["turns_done"] >= 1
    assert died["server_death"]["last_lines"]
    assert outcomes["server=steady"]["error"] is None
    ended = outcomes["server=steady"]["ended"]
    assert sum(ended.values()) == 4
    assert "attempts exhausted" not in ended
    assert "crash" in (out / "servers" / "server-crashing.log").read_text()
    summary = json.loads((out / "summary.json").read_text())
    assert [v["label"] for v in summary["variants"]] == ["server=crashing", "server=steady"]
    assert sim_processes(f"--seed {seed}") == []  # nothing left running


# ---------------------------------------------------------------- the API key


@pytest.mark.slow
def test_the_key_reaches_a_server_that_requires_it_and_never_the_run_folder(
    tmp_path: Path,
) -> None:
    target = target_file(tmp_path, "", extra=("--api-key-env", "SIM_REQUIRED_KEY"))
    seed = "616263"
    common = ["run", "--target", str(target), "--sessions", "3", "--turns", "3"]
    common += ["--speed", "100", "--seed", seed, "--no-progress", "--keep-transcripts"]
    env = {"SIM_REQUIRED_KEY": KEY, "HARNESS_TEST_KEY": KEY}
    good = harness(
        *common, "--out", str(tmp_path / "good"), "--api-key-env", "HARNESS_TEST_KEY", env=env
    )
    assert good.returncode == 0, good.stderr
    turns = read_turns(tmp_path / "good" / "turns.jsonl")
    assert turns
    assert not any(t["transport_error"] for t in turns)
    for path in (tmp_path / "good").rglob("*"):
        if path.is_file():
            assert KEY.encode() not in path.read_bytes(), path
    assert KEY not in good.stdout + good.stderr
    # without the key (its variable unset) the first request is refused: retrying cannot fix
    # it, the run ends at once, naming the status and the server's message (exit code 2)
    bad = harness(
        *common, "--out", str(tmp_path / "bad"), "--api-key-env", "NO_SUCH_KEY_VAR", env=env
    )
    assert bad.returncode == 2, bad.stderr
    assert "refused with HTTP 401: missing or wrong API key" in bad.stderr
    assert "too many transport errors" not in bad.stderr
    rows = read_turns(tmp_path / "bad" / "turns.jsonl")
    assert rows
    refused = [r for r in rows if r["http_status"] == 401]
    assert refused
    assert all(r["attempt"] == 0 for r in refused)  # not retried
    assert all(
        str(r["transport_error"]).startswith("http_status: missing or wrong API key")
        for r in refused
    )
    assert all(r["transport_error"].startswith("cancelled") for r in rows if r not in refused)
    result = json.loads(bad.stdout.strip().splitlines()[-1])
    assert (result["passed"], result["exit_code"]) == (False, 2)
    assert sim_processes(f"--seed {seed}") == []


def test_the_sim_refuses_to_start_without_its_key_variable() -> None:
    proc = subprocess.run(
        [*CLI, "sim", "--port", "0", "--api-key-env", "NO_SUCH_KEY_VAR"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        env={k: v for k, v in os.environ.items() if k != "NO_SUCH_KEY_VAR"},
    )
    assert proc.returncode == 2
    assert "NO_SUCH_KEY_VAR is not set" in proc.stderr
    assert "Traceback" not in proc.stderr


# ---------------------------------------------------------------- bad input


def _bad_inputs(tmp_path: Path) -> dict[str, tuple[list[str], str]]:
    """name -> (arguments, a piece of the message that says what to fix)."""
    broken_scenario = tmp_path / "broken.toml"
    broken_scenario.write_text('name = "x"\nsessions = [\n')
    bad_value = tmp_path / "zero.toml"
    bad_value.write_text('name = "x"\nsessions = 0\n[[tools]]\nname = "f"\nkind = "echo"\n')
    broken_target = tmp_path / "target-broken.toml"
    broken_target.write_text('name = "t"\nmode = launch\n')
    bad_mode = tmp_path / "target-mode.toml"
    bad_mode.write_text('name = "t"\nmode = "teleport"\nmodel = "m"\n')
    existing = tmp_path / "existing"
    existing.mkdir()
    (existing / "turns.jsonl").write_text("{}\n")
    return {
        "scenario-not-toml": (["--scenario", str(broken_scenario)], "not valid TOML"),
        "scenario-missing": (["--scenario", str(tmp_path / "nope.toml")], "file not found"),
        "scenario-bad-value": (["--scenario", str(bad_value)], "'sessions' must be at least 1"),
        "target-not-toml": (["--target", str(broken_target)], "not valid TOML"),
        "target-bad-mode": (["--target", str(bad_mode)], "'mode' must be one of"),
        "target-missing": (["--target", str(tmp_path / "nope.toml")], "file not found"),
        "unknown-factor": (["--ab", "colour=red,blue"], "add a [factors.colour.<level>] table"),
        "unknown-level": (["--ab", "index_k=fp4,bf16"], "has no level 'fp4'"),
        "bad-ab": (["--ab", "index_k"], "expected FACTOR=LEVEL1,LEVEL2"),
        "out-exists": (["--out", str(existing)], "choose another --out"),
        "bad-gate": (["--fail-if", "bogus >>"], "the accepted form is"),
    }


@pytest.mark.parametrize(
    "case",
    [
        "scenario-not-toml",
        "scenario-missing",
        "scenario-bad-value",
        "target-not-toml",
        "target-bad-mode",
        "target-missing",
        "unknown-factor",
        "unknown-level",
        "bad-ab",
        "out-exists",
        "bad-gate",
    ],
)
def test_bad_input_is_one_line_that_says_what_to_fix(tmp_path: Path, case: str) -> None:
    args, hint = _bad_inputs(tmp_path)[case]
    if "--out" not in args:
        args = [*args, "--out", str(tmp_path / "run")]
    proc = harness("run", "--sessions", "2", "--no-progress", *args)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("harness: error: ")
    assert hint in lines[0]
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "run").exists()  # nothing was started or written


def test_unreachable_endpoint_is_exit_3_naming_the_url(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    target = tmp_path / "endpoint.toml"
    target.write_text(
        f'name = "e"\nmode = "endpoint"\nmodel = "m"\nwarm_up = false\n'
        f'[ready]\ntimeout_s = 2\ninterval_s = 0.1\n[endpoints]\ndefault = "{url}"\n'
    )
    proc = harness("run", "--target", str(target), "--sessions", "2", "--out", str(tmp_path / "r"))
    assert proc.returncode == 3, proc.stderr
    assert "Traceback" not in proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("harness:")]
    assert len(errors) == 1, proc.stderr
    assert url in errors[0]
    assert "is the server up on that port?" in errors[0]


# ------------------------------------------------ an output the server cannot encode


def test_an_output_the_server_cannot_encode_is_corruption_not_a_transport_failure(
    tmp_path: Path,
) -> None:
    # as llama.cpp when a damaged cache makes it generate bytes that are no UTF-8: its JSON
    # encoder refuses them and it fails the stream, saying so. Each send is a corrupted turn
    # (re-sent as --on-corruption says, without a transport failure's backoff), and sessions
    # that run out of attempts on them are a finding, not a variant that "cannot judge"
    factors = """
[factors.server.unencodable]
args = ["--unencodable-rate", "1"]
[factors.server.clean]
args = []
"""
    target = target_file(tmp_path, factors)
    out, seed = tmp_path / "run", "616263"
    proc = harness(
        "run", "--target", str(target), "--ab", "server=unencodable,clean", "--sessions", "4",
        "--turns", "3", "--max-context", "12000", "--speed", "100", "--seed", seed,
        "--out", str(out), "--no-progress", "--judge", "off",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr  # (3, "cannot judge", when they were transport)
    assert "cannot judge" not in proc.stderr
    turns = read_turns(out / "turns.jsonl")
    bad = [t for t in turns if t["variant"] == "server=unencodable"]
    assert len(bad) == 12  # the default --on-corruption retry: three sends a session
    for t in bad:
        assert t["label"] == L.TOKEN_SALAD
        assert t["corrupted"]
        assert t["tier"] == "structural"
        assert "invalid UTF-8 byte" in t["transport_error"]
        assert t["sim_injected"] == "unencodable"
    outcomes = {o["label"]: o for o in json.loads((out / "outcomes.json").read_text())}
    assert outcomes["server=unencodable"]["ended"] == {"attempts exhausted": 4}
    summary = json.loads((out / "summary.json").read_text())
    variants = {v["label"]: v for v in summary["variants"]}
    assert variants["server=unencodable"]["corrupted_sessions"] == 4
    assert variants["server=unencodable"]["transport_errors"] == 0
    assert variants["server=unencodable"]["sim_recall"] == 1.0
    assert variants["server=clean"]["corrupted_sessions"] == 0
    assert sim_processes(f"--seed {seed}") == []
    # with --on-corruption stop, the first send ends the session
    out2 = tmp_path / "stop"
    proc = harness(
        "run", "--target", str(target), "--ab", "server=unencodable", "--sessions", "2",
        "--turns", "3", "--speed", "100", "--seed", seed, "--out", str(out2), "--no-progress",
        "--judge", "off", "--on-corruption", "stop",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert len(read_turns(out2 / "turns.jsonl")) == 2
    outcomes = json.loads((out2 / "outcomes.json").read_text())
    assert outcomes[0]["ended"] == {"corrupted": 2}
