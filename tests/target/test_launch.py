"""Launch / endpoint / hook targets against real subprocesses; nothing is left running."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import sys
from pathlib import Path
from types import MappingProxyType
from typing import Any

import httpx
import pytest

from harness.errors import InfrastructureError, UsageError
from harness.target.launch import (
    EndpointMapTarget,
    HookTarget,
    LaunchTarget,
    make_target,
)
from harness.target.readiness import _LIVE
from harness.target.spec import LevelSpec
from harness.target.targetfile import default_sim_target, load_target
from harness.workload.matrix import Variant, parse_ab, variants
from tests.standins import SERVER, group_gone, pid_gone, running_standin
from tests.standins.openai import OpenAIStandin

pytestmark = pytest.mark.filterwarnings("ignore::ResourceWarning")


def standin_target(tmp_path: Path, *flags: str, timeout_s: float = 30, name: str = "t") -> Path:
    """A launch-mode target file running the stand-in; factor 'mode' picks its behaviour."""
    base = ", ".join(f'"{f}"' for f in flags)
    text = f"""
name = "standin"
mode = "launch"
[launch]
command = ["{{python}}", "{SERVER}", "--host", "{{host}}", "--port", "{{port}}",
           "--max-life", "60" {", " + base if base else ""}]
stop_grace_s = 3
[ready]
paths = ["/health_generate", "/health"]
timeout_s = {timeout_s}
interval_s = 0.1
[factors.mode.slow]
args = ["--delay", "1.0"]
env = {{ STANDIN_MARK = "slow-{{port}}" }}
[factors.mode.die]
args = ["--die"]
[factors.mode.never]
args = ["--never-ready"]
[factors.mode.child]
args = ["--spawn-child", "child.pid"]
[factors.mode.plain]
args = []
"""
    path = tmp_path / f"{name}.toml"
    path.write_text(text)
    return path


def variant(**levels: str) -> Variant:
    return Variant(tuple(levels.items()))


async def test_slow_start_becomes_ready_and_group_is_killed(tmp_path: Path) -> None:
    spec = load_target(standin_target(tmp_path))
    target = make_target(spec, variant(mode="slow"), tmp_path / "run")
    assert isinstance(target, LaunchTarget)
    url = await target.start()
    try:
        assert target.proc is not None
        pgid = os.getpgid(target.proc.pid)
        assert pgid == target.proc.pid  # its own process group
        assert target.proc in _LIVE
        async with httpx.AsyncClient(trust_env=False) as http:
            assert (await http.get(url + "/health")).status_code == 200
    finally:
        await target.stop()
    assert group_gone(pgid)
    with pytest.raises(ProcessLookupError):
        os.killpg(pgid, 0)
    assert target.proc not in _LIVE
    await target.stop()  # idempotent
    log = (tmp_path / "run" / "servers" / "mode-slow.log").read_text()
    port = url.rsplit(":", 1)[1]
    assert f"STANDIN_MARK=slow-{port}" in log  # the level's env, with {port} filled in
    assert "'--delay', '1.0'" in log  # the level's args
    assert log.startswith("=== ")


async def test_server_dying_during_startup_fails_fast_with_log_tail(tmp_path: Path) -> None:
    # A 600 s timeout: the error must come from the exit, not from the timeout.
    spec = load_target(standin_target(tmp_path, timeout_s=600))
    target = make_target(spec, variant(mode="die"), tmp_path / "run")
    with pytest.raises(InfrastructureError) as info:
        await target.start()
    msg = str(info.value)
    assert "exited with code 1" in msg
    assert "mode-die.log" in msg
    assert "cannot allocate the KV cache" in msg
    assert "not ready after" not in msg
    assert isinstance(target, LaunchTarget)
    assert target.proc is not None
    assert group_gone(target.proc.pid)


async def test_a_dying_server_is_said_at_once_whatever_the_poll_interval(tmp_path: Path) -> None:
    """Polled every 60 s: the wait between polls ends the moment the process exits."""
    path = tmp_path / "slow-poll.toml"
    path.write_text(
        f'mode = "launch"\n[launch]\ncommand = ["{{python}}", "{SERVER}", "--port", "{{port}}",'
        ' "--die"]\n[ready]\ntimeout_s = 600\ninterval_s = 60\n'
    )
    target = make_target(load_target(path), Variant(()), tmp_path / "run")
    with pytest.raises(InfrastructureError) as info:
        await asyncio.wait_for(target.start(), 30)
    assert "exited with code 1" in str(info.value)
    assert "cannot allocate the KV cache" in str(info.value)


async def test_server_never_ready_times_out_and_is_killed(tmp_path: Path) -> None:
    spec = load_target(standin_target(tmp_path, timeout_s=1.5))
    target = make_target(spec, variant(mode="never"), tmp_path / "run")
    with pytest.raises(InfrastructureError) as info:
        await target.start()
    assert "not ready after" in str(info.value)
    assert "HTTP 503" in str(info.value)
    assert "mode-never.log" in str(info.value)
    assert isinstance(target, LaunchTarget)
    assert target.proc is not None
    assert group_gone(target.proc.pid)


async def test_group_kill_takes_the_grandchild(tmp_path: Path) -> None:
    spec = dataclasses.replace(
        load_target(standin_target(tmp_path)),
        launch=dataclasses.replace(
            load_target(standin_target(tmp_path)).launch,  # type: ignore[arg-type]
            cwd=tmp_path,
        ),
    )
    target = make_target(spec, variant(mode="child"), tmp_path / "run")
    await target.start()
    child_pid = int((tmp_path / "child.pid").read_text())
    assert isinstance(target, LaunchTarget)
    assert target.proc is not None
    pgid = target.proc.pid
    assert os.getpgid(child_pid) == pgid
    await target.stop()
    assert pid_gone(child_pid)
    assert group_gone(pgid)


async def test_cancel_during_startup_kills_the_group(tmp_path: Path) -> None:
    spec = load_target(standin_target(tmp_path, timeout_s=600))
    target = make_target(spec, variant(mode="never"), tmp_path / "run")
    assert isinstance(target, LaunchTarget)
    task = asyncio.create_task(target.start())
    for _ in range(200):
        if target.proc is not None:
            break
        await asyncio.sleep(0.02)
    assert target.proc is not None
    await asyncio.sleep(0.3)
    task.cancel()  # what Ctrl-C does to the run
    with pytest.raises(asyncio.CancelledError):
        await task
    assert group_gone(target.proc.pid)
    assert target.proc not in _LIVE


async def test_missing_program_is_an_infrastructure_error(tmp_path: Path) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(
        'mode = "launch"\n[launch]\ncommand = ["no-such-server-binary-x", "--port", "{port}"]\n'
    )
    target = make_target(load_target(path), Variant(()), tmp_path / "run")
    with pytest.raises(InfrastructureError, match="no-such-server-binary-x"):
        await target.start()


def test_undefined_level_is_refused_before_anything_starts(tmp_path: Path) -> None:
    spec = load_target(standin_target(tmp_path))
    with pytest.raises(UsageError) as info:
        make_target(spec, variant(mode="turbo"), tmp_path / "run")
    msg = str(info.value)
    assert str(spec.path) in msg
    assert "'mode'" in msg
    assert "'turbo'" in msg
    assert "slow, die, never, child, plain" in msg
    with pytest.raises(UsageError, match="not defined in this target file"):
        make_target(spec, variant(speed="fast"), tmp_path / "run")
    assert not (tmp_path / "run").exists()


async def test_sim_target_file_launches_the_real_simulator(tmp_path: Path) -> None:
    spec = default_sim_target()
    v = variants(parse_ab(["index_k=fp8", "hicache=off"]))[0]
    target = make_target(spec, v, tmp_path / "run", extra_args=["--speed", "50"])
    assert isinstance(target, LaunchTarget)
    assert target.argv(1234)[:2] == [sys.executable, "-m"]
    assert target.argv(1234)[-6:] == ["--index-k", "fp8", "--hicache", "off", "--speed", "50"]
    url = await target.start()
    try:
        assert target.proc is not None
        pgid = target.proc.pid
        async with httpx.AsyncClient(trust_env=False) as http:
            models = (await http.get(url + "/v1/models")).json()
            info = (await http.get(url + "/server_info")).json()
        assert models["data"][0]["id"] == spec.model
        assert info["index_k_dtype"] == "fp8"
        assert info["enable_hierarchical_cache"] is False
    finally:
        await target.stop()
    assert group_gone(pgid)
    with pytest.raises(ProcessLookupError):
        os.killpg(pgid, 0)


# -- endpoint mode ----------------------------------------------------------------------------


async def test_endpoint_map_target_uses_the_variant_url(tmp_path: Path) -> None:
    with running_standin() as url_a, running_standin() as url_b:
        path = tmp_path / "ep.toml"
        path.write_text(
            f"""mode = "endpoint"
[ready]
timeout_s = 10
interval_s = 0.1
[endpoints]
"x=a" = "{url_a}/"
"x=b" = "{url_b}"
"""
        )
        spec = load_target(path)
        ta = make_target(spec, variant(x="a"), tmp_path)
        tb = make_target(spec, variant(x="b"), tmp_path)
        assert isinstance(ta, EndpointMapTarget)
        assert await ta.start() == url_a
        assert await tb.start() == url_b
        await ta.stop()
        with pytest.raises(UsageError, match=r"x=a, x=b"):
            make_target(spec, variant(x="c"), tmp_path)
        with pytest.raises(UsageError, match="no endpoint for variant"):
            make_target(spec, Variant(()), tmp_path)


def endpoint_file(tmp_path: Path, url: str, timeout_s: float = 10) -> Path:
    path = tmp_path / "ep.toml"
    path.write_text(
        f'mode = "endpoint"\n[ready]\ntimeout_s = {timeout_s}\ninterval_s = 0.1\n'
        f'[endpoints]\ndefault = "{url}"\n'
    )
    return path


async def test_endpoint_down_says_whether_the_server_is_up_and_how_to_wait(
    tmp_path: Path,
) -> None:
    from tests.standins import free_port

    path = endpoint_file(tmp_path, f"http://127.0.0.1:{free_port()}", timeout_s=600)
    target = make_target(load_target(path), Variant(()), tmp_path)
    # the file's 600 s are for a server that answers 503 while it loads; a closed port is
    # said after the grace
    with pytest.raises(InfrastructureError) as info:
        await asyncio.wait_for(target.start(), 60)
    msg = str(info.value)
    assert "connection refused for 2s" in msg
    assert "is the server up on that port?" in msg
    assert "--ready-timeout SECONDS" in msg
    waited = load_target(path)
    waited = dataclasses.replace(waited, ready=waited.ready.waiting(0.5))
    with pytest.raises(InfrastructureError, match=r"refused for 0.5s\): is the server up"):
        await make_target(waited, Variant(()), tmp_path).start()


@pytest.mark.parametrize(
    ("standin", "error", "said"),
    [
        (
            {"html": True},
            UsageError,
            ["is not an OpenAI-compatible API", "text/html", "<!DOCTYPE html>"],
        ),
        ({"key": "sesame"}, UsageError, ["HTTP 401", "wants an API key", "OPENAI_API_KEY"]),
        (
            {"broken": (500, "CUDA error: an illegal memory access")},
            InfrastructureError,
            ["is up but failing", "HTTP 500: CUDA error: an illegal memory access"],
        ),
        ({"not_openai": True}, InfrastructureError, ["all answered HTTP 404"]),
    ],
)
async def test_an_endpoint_file_gets_the_checks_of_endpoint(
    tmp_path: Path, standin: dict[str, Any], error: type[Exception], said: list[str]
) -> None:
    """What cannot become ready is said at once, as for ``--endpoint`` (the file's 600 s
    readiness timeout is never waited)."""
    with OpenAIStandin(**standin) as server:
        target = make_target(load_target(endpoint_file(tmp_path, server.url, 600)), Variant(()),
                             tmp_path)  # fmt: skip
        with pytest.raises(error) as info:
            await asyncio.wait_for(target.start(), 60)
    for text in said:
        assert text in str(info.value)
    assert "not ready after" not in str(info.value)


async def test_an_endpoint_file_sends_the_key(tmp_path: Path) -> None:
    with OpenAIStandin(key="sesame") as server:
        spec = load_target(endpoint_file(tmp_path, server.url))
        assert await make_target(spec, Variant(()), tmp_path, api_key="sesame").start() == (
            server.url
        )
        with pytest.raises(UsageError, match="the API key sent was refused"):
            await make_target(spec, Variant(()), tmp_path, api_key="nope").start()


# -- hook mode --------------------------------------------------------------------------------


def hook_file(tmp_path: Path, url: str, before: str, after: str, timeout: float = 30) -> Path:
    path = tmp_path / "hook.toml"
    path.write_text(
        f"""mode = "hook"
base_url = "{url}"
[vars]
ns = "staging-a"
[hook]
before = '''{before}'''
after = '''{after}'''
timeout_s = {timeout}
env = {{ NAMESPACE = "{{ns}}" }}
[ready]
timeout_s = 10
interval_s = 0.1
[factors]
hicache = ["on", "off"]
[factors.index_k.bf16]
env = {{ DTYPE = "bfloat16" }}
[factors.index_k.fp8]
env = {{ DTYPE = "fp8" }}
"""
    )
    return path


DUMP = (
    'printf "%s|%s|%s|%s|%s|%s\\n" "$HARNESS_PHASE" "$HARNESS_VARIANT" '
    '"$HARNESS_FACTOR_INDEX_K" "$HARNESS_FACTOR_HICACHE" "$DTYPE" "$NAMESPACE" >> hooks.txt'
)


async def test_hooks_get_levels_as_environment(tmp_path: Path) -> None:
    with running_standin() as url:
        path = hook_file(tmp_path, url, DUMP, DUMP)
        spec = load_target(path)
        v = variants(parse_ab(["index_k=bf16", "hicache=off"]))[0]
        target = make_target(spec, v, tmp_path / "run", repeat=2)
        assert isinstance(target, HookTarget)
        assert await target.start() == url
        await target.stop()
        await target.stop()  # the after hook runs once
    lines = (tmp_path / "hooks.txt").read_text().splitlines()
    assert lines == [
        "before|index_k=bf16,hicache=off|bf16|off|bfloat16|staging-a",
        "after|index_k=bf16,hicache=off|bf16|off|bfloat16|staging-a",
    ]
    log = (tmp_path / "run" / "servers" / "index_k-bf16_hicache-off.hook.log").read_text()
    assert "=== before (repeat 2)" in log


async def test_a_level_reaches_hooks_only_as_data(tmp_path: Path) -> None:
    # The matrix parser refuses shell text as a level...
    with pytest.raises(UsageError):
        parse_ab(["index_k=$(touch pwned)"])
    # ...and even a level that got past every parser only travels in the environment.
    evil = "$(touch pwned);touch pwned2"
    with running_standin() as url:
        path = hook_file(
            tmp_path,
            url,
            'printf \'%s\' "$HARNESS_FACTOR_INDEX_K" > got.txt; echo "$HARNESS_VARIANT" > v.txt',
            "true",
        )
        spec = load_target(path)
        factors = {**spec.factors, "index_k": MappingProxyType({evil: LevelSpec()})}
        spec = dataclasses.replace(spec, factors=MappingProxyType(factors))
        target = make_target(spec, variant(index_k=evil), tmp_path / "run")
        await target.start()
        await target.stop()
    assert (tmp_path / "got.txt").read_text() == evil
    assert (tmp_path / "v.txt").read_text().strip() == f"index_k={evil}"
    assert not (tmp_path / "pwned").exists()
    assert not (tmp_path / "pwned2").exists()
    assert not Path("pwned").exists()  # noqa: ASYNC240


async def test_failing_before_hook_is_an_error_and_after_still_runs(tmp_path: Path) -> None:
    with running_standin() as url:
        path = hook_file(
            tmp_path, url, "echo rollout failed: quota; exit 7", "echo cleaned > after.txt"
        )
        target = make_target(load_target(path), variant(index_k="fp8"), tmp_path / "run")
        with pytest.raises(InfrastructureError) as info:
            await target.start()
        await target.stop()
    assert "exited with code 7" in str(info.value)
    assert "rollout failed: quota" in str(info.value)
    assert (tmp_path / "after.txt").read_text().strip() == "cleaned"


async def test_hook_timeout_kills_the_hook(tmp_path: Path) -> None:
    with running_standin() as url:
        path = hook_file(tmp_path, url, "echo $$ > hook.pid; sleep 30", "true", timeout=0.5)
        target = make_target(load_target(path), variant(index_k="fp8"), tmp_path / "run")
        with pytest.raises(InfrastructureError, match="did not finish"):
            await target.start()
        await target.stop()
    assert pid_gone(int((tmp_path / "hook.pid").read_text()))
