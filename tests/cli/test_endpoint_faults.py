"""What a wrong endpoint, an overloaded one and a dead one do to a real ``harness run``.

Refusals that retrying cannot fix end the run at once (exit 2, the status and the server's
message said); 429/503 wait for Retry-After; ``--endpoint`` takes HOST:PORT and .../v1; a
server that is not an OpenAI server is said at once; a server killed mid-run fails the run
(exit 3); the harness's own open-file limit is checked before anything starts.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from harness.client.door import KEY_ADVICE, KEY_REFUSED
from harness.record.turns import read_turns
from tests.cli.test_cli import CLI, ROOT
from tests.cli.test_cli_faults import free_port
from tests.standins.openai import OpenAIStandin

ONE = ["--sessions", "4", "--turns", "2", "--max-context", "12000", "--no-progress"]


def harness(
    *args: str,
    timeout: float = 180,
    preexec: Callable[[], None] | None = None,
    key: str = "",
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        env={**os.environ, "OPENAI_API_KEY": key},
        preexec_fn=preexec,
    )


def last_json(proc: subprocess.CompletedProcess[str]) -> dict[str, object]:
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


@pytest.mark.parametrize("workers", ["1", "2"])
def test_a_wrong_model_ends_the_run_at_once_naming_the_status_and_message(
    tmp_path: Path, workers: str
) -> None:
    message = "The model `no-such-model` does not exist."
    with OpenAIStandin(refuse=(404, message)) as server:
        out = tmp_path / "r"
        proc = harness(
            "run", "--endpoint", server.url, *ONE, "--out", str(out), "--workers", workers
        )
        seen = len(server.arrivals) - 1  # less the one cache-report probe before the load
    assert proc.returncode == 2, proc.stderr
    lines = [x for x in proc.stderr.splitlines() if "refused with HTTP 404" in x]
    assert len(lines) == 1, proc.stderr
    assert message.rstrip(".") in lines[0]
    assert "POST " + server.url + "/v1/chat/completions" in lines[0]
    assert "--model" in lines[0]
    assert "too many transport errors" not in proc.stderr
    rows = read_turns(out / "turns.jsonl")
    refused = [r for r in rows if r["http_status"] == 404]
    assert refused
    assert all(r["attempt"] == 0 for r in refused)  # never retried
    assert len(rows) >= seen  # every request the server saw is a row
    result = last_json(proc)
    assert (result["passed"], result["exit_code"]) == (False, 2)


@pytest.mark.slow
def test_a_refusal_of_one_variant_ends_that_variant_and_the_run_goes_on(tmp_path: Path) -> None:
    with (
        OpenAIStandin(refuse=(400, "unsupported parameter: seed")) as bad,
        OpenAIStandin() as good,
    ):
        target = tmp_path / "endpoints.toml"
        target.write_text(
            'name = "two"\nmode = "endpoint"\nmodel = "m"\nwarm_up = false\n'
            'flush_cache = false\nmetrics = false\n[ready]\npaths = ["/health"]\n'
            f'[endpoints]\n"server=strict" = "{bad.url}"\n"server=lax" = "{good.url}"\n'
        )
        out = tmp_path / "r"
        proc = harness(
            "run", "--target", str(target), "--ab", "server=strict,lax", *ONE, "--out", str(out)
        )
    assert proc.returncode == 2, proc.stderr
    assert "variant server=strict: the first request" in proc.stderr
    assert "HTTP 400: unsupported parameter: seed" in proc.stderr
    rows = read_turns(out / "turns.jsonl")
    lax = [r for r in rows if r["variant"] == "server=lax"]
    assert len({r["session"] for r in lax}) == 4  # the other variant ran in full
    assert not any(r["transport_error"] for r in lax)


def test_503_waits_for_retry_after(tmp_path: Path) -> None:
    # busy twice: the one cache-statistics probe before the load, then the session's turn
    with OpenAIStandin(busy=(2, "2")) as server:
        proc = harness(
            "run", "--endpoint", server.url, *ONE, "--sessions", "1", "--out", str(tmp_path / "r")
        )
        arrivals = list(server.arrivals)
    assert proc.returncode == 0, proc.stderr
    assert len(arrivals) == 3
    # the backoff alone is 0.5 s; the server asked for 2
    assert arrivals[2] - arrivals[1] >= 1.9


@pytest.mark.parametrize("form", ["{host}:{port}", "http://{host}:{port}/v1", "{host}:{port}/v1/"])
def test_endpoint_url_forms(tmp_path: Path, form: str) -> None:
    with OpenAIStandin() as server:
        port = server.url.rsplit(":", 1)[1]
        given = form.format(host="127.0.0.1", port=port)
        proc = harness("run", "--endpoint", given, *ONE, "--out", str(tmp_path / "r"))
    assert proc.returncode == 0, proc.stderr
    said = [x for x in proc.stderr.splitlines() if "taken as" in x]
    assert said == [f"harness: --endpoint {given} taken as {server.url}"]
    rows = read_turns(tmp_path / "r" / "turns.jsonl")
    assert rows
    assert not any(r["transport_error"] for r in rows)


def test_a_server_that_is_not_an_openai_server_is_said_at_once(tmp_path: Path) -> None:
    with OpenAIStandin(not_openai=True) as server:
        proc = harness("run", "--endpoint", server.url, *ONE, "--out", str(tmp_path / "r"))
    assert proc.returncode == 3, proc.stderr
    assert "is not an OpenAI-compatible server" in proc.stderr
    assert "answered HTTP 404" in proc.stderr
    assert "not ready after" not in proc.stderr  # said at once, not after the readiness wait
    assert last_json(proc)["passed"] is False


def timed(*args: str, key: str = "") -> tuple[subprocess.CompletedProcess[str], float]:
    t0 = time.monotonic()
    proc = harness(*args, key=key)
    return proc, time.monotonic() - t0


def test_a_web_page_on_every_path_is_not_an_openai_api_said_at_once(tmp_path: Path) -> None:
    with OpenAIStandin(html=True) as server:
        proc, took = timed("run", "--endpoint", server.url, *ONE, "--out", str(tmp_path / "r"))
        chats = len(server.arrivals)
    assert proc.returncode == 2, proc.stderr
    error = [x for x in proc.stderr.splitlines() if x.startswith("harness: error")]
    assert len(error) == 1
    assert "is not an OpenAI-compatible API" in error[0]
    assert "text/html" in error[0]
    assert "<!DOCTYPE html>" in error[0]
    assert "discovered" not in proc.stderr  # no false model line
    assert chats == 0
    assert took < 8
    assert last_json(proc)["exit_code"] == 2


def test_401_on_every_path_is_the_key_advice_at_once(tmp_path: Path) -> None:
    with OpenAIStandin(key="sesame") as server:
        proc, took = timed("run", "--endpoint", server.url, *ONE, "--out", str(tmp_path / "r"))
        right, _ = timed(
            "run", "--endpoint", server.url, *ONE, "--out", str(tmp_path / "k"), key="sesame"
        )
        wrong, _ = timed(
            "run", "--endpoint", server.url, *ONE, "--out", str(tmp_path / "w"), key="nope"
        )
    assert proc.returncode == 2, proc.stderr
    assert took < 8
    assert "not ready after" not in proc.stderr
    assert "HTTP 401" in proc.stderr
    assert "OPENAI_API_KEY" in proc.stderr
    assert "wants an API key" in proc.stderr
    assert proc.stderr.count("OPENAI_API_KEY") == 1  # said once
    assert wrong.returncode == 2
    assert "key sent was refused" in wrong.stderr
    assert right.returncode == 0, right.stderr  # the key given: the run goes on


def test_a_401_on_v1_models_alone_is_the_key_advice_not_a_discovered_model(
    tmp_path: Path,
) -> None:
    # vLLM --api-key: /health is open, /v1/models is not
    with OpenAIStandin(key="sesame", open_paths=("/health", "/health_generate")) as server:
        proc, took = timed("run", "--endpoint", server.url, *ONE, "--out", str(tmp_path / "r"))
    assert proc.returncode == 2, proc.stderr
    assert "GET /v1/models with HTTP 401" in proc.stderr
    assert "OPENAI_API_KEY" in proc.stderr
    assert "discovered" not in proc.stderr
    assert took < 8


def test_a_401_on_the_chat_path_alone_gives_the_advice_of_readiness(tmp_path: Path) -> None:
    """Readiness and the model list open, the chat path wanting a key: the one wording of
    the key advice, whichever request met the 401."""
    open_paths = ("/health", "/health_generate", "/v1/models")
    with OpenAIStandin(key="sesame", open_paths=open_paths) as server:
        chat, _ = timed("run", "--endpoint", server.url, *ONE, "--out", str(tmp_path / "c"))
        wrong, _ = timed(
            "run", "--endpoint", server.url, *ONE, "--out", str(tmp_path / "w"), key="nope"
        )
    with OpenAIStandin(key="sesame") as server:
        ready, _ = timed("run", "--endpoint", server.url, *ONE, "--out", str(tmp_path / "r"))
    assert (chat.returncode, wrong.returncode, ready.returncode) == (2, 2, 2)

    assert "/v1/chat/completions) was refused with HTTP 401" in chat.stderr  # the chat path
    assert "answered GET /health_generate with HTTP 401" in ready.stderr  # readiness
    for proc in (chat, ready):
        assert proc.stderr.count(KEY_ADVICE) == 1
        assert proc.stderr.count("OPENAI_API_KEY") == 1
    assert wrong.stderr.count(KEY_REFUSED) == 1


def test_a_500_on_every_request_fails_fast_showing_the_servers_error(tmp_path: Path) -> None:
    with OpenAIStandin(broken=(500, "CUDA error: an illegal memory access")) as server:
        proc, took = timed("run", "--endpoint", server.url, *ONE, "--out", str(tmp_path / "r"))
    assert proc.returncode == 3, proc.stderr
    assert "HTTP 500: CUDA error: an illegal memory access" in proc.stderr
    assert "not ready after" not in proc.stderr
    assert took < 8


def test_a_closed_port_asks_whether_the_server_is_up(tmp_path: Path) -> None:
    port = free_port()
    proc = harness("run", "--endpoint", f"127.0.0.1:{port}", *ONE, "--out", str(tmp_path / "r"))
    assert proc.returncode == 3, proc.stderr
    (line,) = [x for x in proc.stderr.splitlines() if "connection refused" in x]
    assert "connection refused for 2s" in line  # the grace, not the 10 s readiness wait
    assert "is the server up on that port?" in line
    assert "give --ready-timeout SECONDS" in line
    assert last_json(proc)["exit_code"] == 3


def test_ready_timeout_waits_for_a_server_that_is_starting(tmp_path: Path) -> None:
    """The server comes up after the grace of a closed port: --ready-timeout waits for it."""
    port = free_port()
    run = subprocess.Popen(
        [*CLI, "run", "--endpoint", f"127.0.0.1:{port}", "--ready-timeout", "120", *ONE]
        + ["--out", str(tmp_path / "r")],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "OPENAI_API_KEY": ""},
    )
    assert run.stderr is not None
    said = []
    for line in run.stderr:  # the harness is waiting on the closed port
        said.append(line)
        if "waiting for" in line:
            break
    time.sleep(3)  # longer than the grace of a closed port
    with OpenAIStandin(port=port):
        stdout, stderr = run.communicate(timeout=180)
    assert run.returncode == 0, "".join(said) + stderr
    assert "connection refused" not in stderr
    assert json.loads(stdout.strip().splitlines()[-1])["exit_code"] == 0


def test_an_endpoint_file_gets_the_checks_of_endpoint(tmp_path: Path) -> None:
    with OpenAIStandin(html=True) as server:
        target = tmp_path / "endpoints.toml"
        target.write_text(
            f'name = "page"\nmode = "endpoint"\nmodel = "m"\n[endpoints]\n'
            f'default = "{server.url}"\n'
        )
        proc = harness("run", "--target", str(target), *ONE, "--out", str(tmp_path / "r"))
        chats = len(server.arrivals)
    assert proc.returncode == 2, proc.stderr
    error = [x for x in proc.stderr.splitlines() if x.startswith("harness: error")]
    assert len(error) == 1
    assert "is not an OpenAI-compatible API" in error[0]
    assert "text/html" in error[0]
    assert chats == 0
    assert last_json(proc)["exit_code"] == 2


def _sim(port: int, seed: str) -> subprocess.Popen[bytes]:
    sim = subprocess.Popen(
        [sys.executable, "-m", "harness.sim", "--port", str(port), "--seed", seed]
        + ["--speed", "2", "--fault-scale", "0"],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    return sim


@pytest.mark.slow
@pytest.mark.parametrize("sessions", [20, 4])
def test_an_endpoint_killed_mid_run_fails_the_run(tmp_path: Path, sessions: int) -> None:
    """20 sessions: the recent requests all fail, the variant stops at once. 4 sessions
    (fewer failed requests than the window): every session ends with its attempts
    exhausted, and the variant cannot be judged. Either way exit 3, never a pass."""
    port, seed = free_port(), str(727200 + sessions)
    sim = _sim(port, seed)
    out = tmp_path / "r"
    try:
        run = subprocess.Popen(
            [*CLI, "run", "--endpoint", f"http://127.0.0.1:{port}", "--sessions", str(sessions)]
            + ["--turns", "30", "--max-context", "12000", "--no-progress", "--out", str(out)],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "OPENAI_API_KEY": ""},
        )
        turns = out / "turns.jsonl"
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            # 20 sessions: a turn each; 4: enough done that the failures are not half
            if turns.exists() and len(turns.read_text().splitlines()) >= max(20, 10 * sessions):
                break
            time.sleep(0.2)
        sim.send_signal(signal.SIGKILL)
        stdout, stderr = run.communicate(timeout=120)
    finally:
        sim.kill()
        sim.wait()
    assert run.returncode == 3, stderr
    if sessions == 20:
        assert "the server stopped answering: the last 20 requests all failed" in stderr
    else:
        assert "attempts exhausted" in stderr
    result = json.loads(stdout.strip().splitlines()[-1])
    assert (result["passed"], result["exit_code"]) == (False, 3)


def _limit(soft: int, hard: int) -> Callable[[], None]:
    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))

    return apply


def test_too_few_open_files_for_the_concurrency_stops_before_anything_starts(
    tmp_path: Path,
) -> None:
    out = tmp_path / "r"
    proc = harness(
        "run", "--sessions", "1000", "--out", str(out), "--no-progress", preexec=_limit(256, 256)
    )
    assert proc.returncode == 3, proc.stderr
    (line,) = [x for x in proc.stderr.splitlines() if "open files" in x]
    assert "ulimit -n" in line
    assert "--concurrency" in line
    assert not (out / "turns.jsonl").exists()


def test_the_soft_open_file_limit_is_raised_when_the_hard_one_allows(tmp_path: Path) -> None:
    with OpenAIStandin() as server:
        proc = harness(
            "run", "--endpoint", server.url, *ONE, "--sessions", "120", "--turns", "1"
            , "--out", str(tmp_path / "r"), preexec=_limit(60, 4096)
        )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "open-file limit raised from 60" in proc.stderr
    rows = read_turns(tmp_path / "r" / "turns.jsonl")
    assert len(rows) == 120
    assert not any(r["transport_error"] for r in rows)


def test_after_a_fatal_error_no_table_of_zeros_and_the_error_comes_last(tmp_path: Path) -> None:
    with OpenAIStandin(refuse=(401, "Invalid API key")) as server:
        proc = harness("run", "--endpoint", server.url, *ONE, "--out", str(tmp_path / "r"))
    assert proc.returncode == 2, proc.stderr
    assert "verdict:" not in proc.stdout
    assert "rate [95% CI]" not in proc.stdout  # no table
    err = proc.stderr.strip().splitlines()
    assert "Invalid API key" in err[-1]  # the last thing said
    assert proc.stderr.count("Invalid API key") == 1  # once
    assert last_json(proc)["exit_code"] == 2  # and stdout still ends with the result line


def test_a_warning_said_during_the_run_is_not_said_again(tmp_path: Path) -> None:
    with OpenAIStandin() as server:  # its usage has no cached tokens
        proc = harness("run", "--endpoint", server.url, *ONE, "--out", str(tmp_path / "r"))
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.count("reports no cached prompt tokens") == 1


def test_a_model_flag_the_server_does_not_serve_says_both_and_follows_the_server(
    tmp_path: Path,
) -> None:
    served = "Qwen/Qwen3-Coder-30B-A3B-Instruct"
    with OpenAIStandin(model=served) as server:
        proc = harness("run", "--endpoint", server.url, *ONE, "--model", "DeepSeek-V3",
                       "--out", str(tmp_path / "r"))  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert f"does not list DeepSeek-V3 (the requests' model); it serves {served}" in proc.stderr
    assert "dialect qwen3-coder" in proc.stderr
