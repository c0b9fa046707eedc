"""``--workers ray:ADDRESS``: the worker processes as actors of a real Ray cluster, started on
loopback, give the records ``--workers 2`` gives."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.argtypes import workers
from tests.standins.simtarget import SIM_FAULTS_TARGET, stable_turns

ray = pytest.importorskip("ray", reason="Ray is not installed (pip install -e '.[ray]')")

CLI = [sys.executable, "-m", "harness.cli"]
ROOT = Path(__file__).resolve().parents[2]
# a cluster on this host's loopback only: Ray otherwise swaps 127.0.0.1 for the host's address
ENV = {
    **os.environ,
    "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
    "RAY_AUTH_MODE": "disabled",
    "RAY_USAGE_STATS_ENABLED": "0",
}


@pytest.fixture(scope="module")
def cluster() -> Iterator[str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ray_cli = Path(sys.executable).with_name("ray")
    start = [str(ray_cli), "start", "--head", "--node-ip-address", "127.0.0.1", "--port",
             str(port), "--num-cpus", "2", "--include-dashboard", "false",
             "--disable-usage-stats"]  # fmt: skip
    done = subprocess.run(start, env=ENV, capture_output=True, text=True, timeout=180)
    if done.returncode != 0:
        pytest.fail(f"ray start failed: {done.stderr[-2000:]}")
    try:
        yield f"127.0.0.1:{port}"
    finally:
        subprocess.run([str(ray_cli), "stop", "--force"], env=ENV, capture_output=True,
                       timeout=120, check=False)  # fmt: skip


def test_the_workers_argument_takes_a_cluster() -> None:
    assert workers("ray") == "ray"
    assert workers("ray:10.1.2.3:6379") == "ray:10.1.2.3:6379"
    assert workers("3") == 3


def test_a_variant_over_a_ray_cluster_has_the_records_of_two_local_workers(
    tmp_path: Path, cluster: str
) -> None:
    target = tmp_path / "target.toml"
    target.write_text(SIM_FAULTS_TARGET)
    common = ["run", "--target", str(target), "--ab", "errors=few,many", "--sessions", "9",
              "--turns", "4", "--seed", "3", "--no-progress"]  # fmt: skip
    runs = {}
    for name, flag in (("local", "2"), ("ray", f"ray:{cluster}")):
        done = subprocess.run(
            [*CLI, *common, "--workers", flag, "--out", str(tmp_path / name)],
            cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr[-3000:]
        runs[name] = stable_turns(tmp_path / name)
    assert runs["ray"] == runs["local"]
    assert any(r["transport_error"] for r in runs["ray"])  # the faults came through
    # each variant ran on one worker per CPU of the cluster, each sending its self-report back
    meta = json.loads((tmp_path / "ray" / "run.json").read_text())
    assert meta["args"]["workers"] == f"ray:{cluster}"
    for line in (tmp_path / "ray" / "selfreport.jsonl").read_text().splitlines():
        row = json.loads(line)
        assert row["workers"] == 2
        assert sum(w["turns"] for w in row["per_worker"]) == row["turns"]


def test_an_unreachable_cluster_is_a_configuration_error(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens there
    done = subprocess.run(
        [*CLI, "run", "--sessions", "2", "--turns", "1", "--no-progress",
         "--workers", f"ray:127.0.0.1:{port}", "--out", str(tmp_path / "r")],
        cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr[-2000:]
    assert f"--workers ray:127.0.0.1:{port}" in done.stderr
