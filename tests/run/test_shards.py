"""A run spread over shards (``harness run --shard I/K``) and merged (``harness merge``): real
``harness run`` processes, each launching its own simulator, against the same run in one
process."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from harness.analysis.confirm import row_key
from harness.analysis.oracles import ORACLE_METRICS
from harness.analysis.tiers import CONFIRMED_BASIS, DETECTOR_BASIS
from harness.drive.permits import Permits
from harness.drive.session import make_plans
from harness.errors import UsageError
from harness.pool.dealing import deal, family
from harness.record.rundir import (
    JUDGE_FILE,
    ORACLE_PASSKEY_ALONE_FILE,
    ORACLE_PASSKEY_FILE,
    ORACLE_REPLAY_FILE,
    TURNS_FILE,
)
from harness.record.turns import read_rows, read_turns
from harness.run.judge import check_judges, judge_servers
from harness.run.shard import (
    Shard,
    parse_shard,
    parse_start_at,
    slice_plans,
    wait_until,
)
from harness.workload.scenario import load_scenario
from tests.standins.simtarget import SIM_FAULTS_TARGET, headline, stable_turns

CLI = [sys.executable, "-m", "harness.cli"]
ROOT = Path(__file__).resolve().parents[2]


def harness(*args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=timeout, cwd=ROOT)


def test_slices_cover_every_session_once_with_whole_families() -> None:
    scenario = load_scenario().with_overrides(sessions=23, max_turns=None, max_context=None)
    plans = make_plans(scenario, 23, seed=5)
    slices = deal(plans, 4)
    assert sorted(p.index for s in slices for p in s) == list(range(23))
    owner = {family(p): i for i, s in enumerate(slices) for p in s}
    assert all(owner[family(p)] == i for i, s in enumerate(slices) for p in s)
    assert slice_plans(plans, Shard(2, 4)) == slices[1]
    assert slice_plans(make_plans(scenario, 23, seed=5), Shard(2, 4)) == slices[1]
    sizes = [len(s) for s in slices]
    shares = [Permits(10).share(sizes, i).count for i in range(4)]
    assert sum(shares) == 10
    assert deal(plans[:2], 4)[3] == []  # more shards than sessions: some slices are empty
    assert Permits(10).share([len(s) for s in deal(plans[:2], 4)], 3).count == 1


def test_shard_and_start_time_arguments() -> None:
    assert parse_shard("2/4") == Shard(2, 4)
    for bad in ("0/4", "5/4", "2", "a/b", "2/4/1"):
        with pytest.raises(UsageError, match="I/K"):
            parse_shard(bad)
    hour_before = 1796176800.0 - 3600
    assert parse_start_at("2026-12-02T02:00:00Z", now=hour_before) == 1796176800.0
    assert parse_start_at("2026-12-02T03:00:00+01:00", now=hour_before) == 1796176800.0
    assert parse_start_at("1796176800", now=hour_before) == 1796176800.0
    with pytest.raises(UsageError, match="zone"):
        parse_start_at("2026-12-02T02:00:00", now=hour_before)
    with pytest.raises(UsageError, match="ISO 8601"):
        parse_start_at("tomorrow", now=hour_before)
    with pytest.raises(UsageError, match="ahead"):
        parse_start_at(str(time.time() + 3 * 86400))


async def test_a_shard_waits_for_its_start_time() -> None:
    t0 = time.time()
    late = await wait_until(t0 + 0.3, lambda _msg: None)
    assert time.time() - t0 >= 0.29
    assert 0 <= late < 0.2
    assert await wait_until(t0 - 5, lambda _msg: None) >= 5  # already past: no wait


def test_three_shards_merged_are_the_run_one_process_makes(tmp_path: Path) -> None:
    target = tmp_path / "target.toml"
    target.write_text(SIM_FAULTS_TARGET)
    common = ["--target", str(target), "--ab", "errors=few,many", "--sessions", "9",
              "--turns", "4", "--seed", "3", "--no-progress", "--workers", "1"]  # fmt: skip
    one = harness("run", *common, "--out", str(tmp_path / "one"))
    assert one.returncode == 0, one.stderr
    start = str(time.time() + 4)
    procs = [
        subprocess.Popen(
            [
                *CLI,
                "run",
                *common,
                "--shard",
                f"{i}/3",
                "--start-at",
                start,
                "--out",
                str(tmp_path / f"shard{i}"),
            ],  # fmt: skip
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in (1, 2, 3)
    ]
    for p in procs:
        _, err = p.communicate(timeout=240)
        assert p.returncode == 0, err
    shards = [str(tmp_path / f"shard{i}") for i in (3, 1, 2)]  # any order
    merged = harness("merge", *shards, "-o", str(tmp_path / "merged"), "--shards", "3")
    assert merged.returncode == 0, merged.stderr
    assert json.loads(merged.stdout.splitlines()[-1])["passed"] is True

    assert stable_turns(tmp_path / "merged") == stable_turns(tmp_path / "one")
    assert headline(tmp_path / "merged") == headline(tmp_path / "one")
    errors = sum(r["transport_errors"] for r in headline(tmp_path / "one")[1])  # type: ignore[misc]
    assert errors > 0  # the comparison has something to compare
    # each shard ran its slice only, and began at the time asked
    for i in (1, 2, 3):
        meta = json.loads((tmp_path / f"shard{i}" / "run.json").read_text())
        assert meta["shard"] == {"index": i, "count": 3}
        assert meta["finished"]["exit_code"] == 0
        clock = json.loads((tmp_path / f"shard{i}" / "clock.json").read_text())
        assert clock["start_unix"] >= float(start) - 0.05
        assert clock["late_s"] == pytest.approx(clock["start_unix"] - float(start), abs=0.05)
        assert clock["server_offset_s"] is not None
    info = json.loads((tmp_path / "merged" / "merge.json").read_text())
    assert info["present"] == [1, 2, 3]
    assert info["missing"] == []
    assert (tmp_path / "merged" / "report.html").is_file()

    # one shard missing: the merged folder is written, and the run fails as infrastructure
    part = harness("merge", shards[1], shards[2], "-o", str(tmp_path / "part"), "--shards", "3")
    assert part.returncode == 3
    assert "shard 3/3 is missing" in part.stderr
    assert json.loads((tmp_path / "part" / "merge.json").read_text())["missing"] == [3]

    # a shard that did not end well fails the merge too
    meta_path = tmp_path / "shard2" / "run.json"
    meta = json.loads(meta_path.read_text())
    meta["finished"]["exit_code"] = 3
    meta_path.write_text(json.dumps(meta))
    bad = harness("merge", *shards, "-o", str(tmp_path / "bad"))
    assert bad.returncode == 3
    assert "shard 2/3 ended with exit code 3" in bad.stderr

    # folders of different plans, or one shard twice, are refused before anything is written
    other = harness("run", *common[:-2], "--workers", "1", "--seed", "4", "--shard", "1/3",
                    "--out", str(tmp_path / "other"))  # fmt: skip
    assert other.returncode == 0, other.stderr
    mixed = harness("merge", shards[0], str(tmp_path / "other"), "-o", str(tmp_path / "mixed"))
    assert mixed.returncode == 2
    assert "different runs" in mixed.stderr
    twice = harness("merge", shards[0], shards[0], "-o", str(tmp_path / "twice"))
    assert twice.returncode == 2
    assert "given twice" in twice.stderr
    assert not (tmp_path / "mixed").exists()


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--shard", "1/2", "--confirm"], "--confirm needs one coordinator"),
        (["--shard", "1/2", "--fail-if", "session_corruption_rate > 0"], "harness merge"),
        (["--start-at", "1796176800"], "--start-at goes with --shard"),
        (["--shard", "3/2"], "I/K"),
        (["--shard", "1/2", "--endpoint", "http://127.0.0.1:9", "--passkeys"], "the shard's own"),
        (
            ["--shard", "1/2", "--endpoint", "http://127.0.0.1:9", "--oracle", "replay"],
            "the shard's own",
        ),
    ],
)
def test_what_a_shard_cannot_do_is_refused_at_once(
    tmp_path: Path, flags: list[str], message: str
) -> None:
    done = harness("run", "--sessions", "2", "--turns", "1", "--out", str(tmp_path / "r"), *flags)
    assert done.returncode == 2
    assert message in done.stderr
    assert not (tmp_path / "r").exists()


ORACLES = ["--ab", "fault_rate=0,0.05", "--ab", "deterministic=on", "--sessions", "12",
           "--turns", "6", "--max-context", "12000", "--speed", "1000", "--seed", "13",
           "--oracle", "replay", "--passkeys", "--no-progress"]  # fmt: skip


@pytest.mark.slow
def test_shards_with_the_exact_oracles_merge_into_the_run_one_process_makes(
    tmp_path: Path,
) -> None:
    """Each shard launches its own simulator (deterministic, an exact fault rate in one
    variant), replays its sends and re-sends its passkey asks alone on it; the merged folder
    carries every oracle row, and its summary the same oracle rates per variant as one
    process's run of the plan; a gate on them fails the merge."""
    one = harness("run", *ORACLES, "--out", str(tmp_path / "one"))
    assert one.returncode == 0, one.stderr[-3000:]
    for i in (1, 2):
        shard = harness("run", *ORACLES, "--shard", f"{i}/2", "--out", str(tmp_path / f"s{i}"))
        assert shard.returncode == 0, shard.stderr[-3000:]
    gate = ["--fail-if", "replay_diverged_turns > 0"]
    merged = harness("merge", str(tmp_path / "s1"), str(tmp_path / "s2"), "-o",
                     str(tmp_path / "merged"), *gate)  # fmt: skip
    assert merged.returncode == 1, merged.stderr[-3000:]
    assert "replay_diverged_turns" in merged.stderr

    for name in (ORACLE_REPLAY_FILE, ORACLE_PASSKEY_FILE, ORACLE_PASSKEY_ALONE_FILE):
        rows = read_rows(tmp_path / "merged" / name)
        assert {r["shard"] for r in rows} == {1, 2}, name
        assert sorted(map(row_key, rows), key=repr) == sorted(
            map(row_key, read_rows(tmp_path / "one" / name)), key=repr
        ), name
    summaries = [json.loads((tmp_path / d / "summary.json").read_text()) for d in ("one", "merged")]
    by = [{v["label"]: v for v in s["variants"]} for s in summaries]
    assert by[0].keys() == by[1].keys()
    for label in by[0]:
        assert by[1][label]["oracles"] == by[0][label]["oracles"], label
        for metric in ORACLE_METRICS:
            assert by[1][label].get(metric) == by[0][label].get(metric), (label, metric)
    assert by[1]["fault_rate=0.05,deterministic=on"]["replay_diverged_turns"] > 0
    md = (tmp_path / "merged" / "report.md").read_text()
    assert "## Replay alone (exact oracle)" in md
    assert "## Passkeys (exact oracle)" in md


def test_merge_judges_the_merged_run_on_the_server_given(
    make_sim: Callable[..., str], tmp_path: Path
) -> None:
    """No shard judges (the judge's healthy reference is the whole variant's): ``harness
    merge --judge URL`` scores the merged run's flagged turns teacher-forced, as one process
    does after its load, and the headline then counts what the judge confirmed. A variant the
    run does not have, or a server that is not there, is refused before anything is written."""
    url = make_sim(fault_rate=0.15)  # (about 20 suspects of the text detector in 240 turns)
    common = ["--endpoint", url, "--sessions", "40", "--concurrency", "40", "--turns", "6",
              "--max-context", "16000", "--seed", "3", "--no-progress",
              "--workers", "1"]  # fmt: skip
    procs = [
        subprocess.Popen(
            [*CLI, "run", *common, "--shard", f"{i}/2", "--out", str(tmp_path / f"s{i}")],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        for i in (1, 2)
    ]
    for p in procs:
        _, err = p.communicate(timeout=240)
        assert p.returncode == 0, err[-3000:]
    shards = [str(tmp_path / "s1"), str(tmp_path / "s2")]
    assert not any((tmp_path / s / JUDGE_FILE).exists() for s in ("s1", "s2"))

    plain = harness("merge", *shards, "-o", str(tmp_path / "plain"))
    assert plain.returncode == 0, plain.stderr[-3000:]
    [v] = json.loads((tmp_path / "plain" / "summary.json").read_text())["variants"]
    assert v["suspect_turns"] > 0  # the comparison has something to judge
    assert v["headline_basis"] == DETECTOR_BASIS
    assert "--judge URL" in plain.stderr  # what to do about it, said

    judged = harness("merge", *shards, "-o", str(tmp_path / "judged"), "--judge", url)
    assert judged.returncode == 0, judged.stderr[-3000:]
    assert "turns scored teacher-forced by the judge" in judged.stderr
    turns = read_turns(tmp_path / "judged" / TURNS_FILE)
    suspects = [t for t in turns if t["tier"] == "suspect"]
    assert len(suspects) == v["suspect_turns"]
    assert all("judge_nll" in t for t in suspects)  # every suspect scored
    rows = read_rows(tmp_path / "judged" / JUDGE_FILE)
    assert {r["run_id"] for r in rows} == {turns[0]["run_id"]}
    [w] = json.loads((tmp_path / "judged" / "summary.json").read_text())["variants"]
    assert w["headline_basis"] == CONFIRMED_BASIS
    assert w["judge"]["flagged_confirmed"] > 0
    assert w["turns"] == v["turns"]
    # what the judge confirmed was injected by the simulator (its ground truth)
    confirmed = [t for t in turns if t.get("judge_confirmed")]
    assert confirmed
    assert all(t["sim_injected"] not in (None, "none") for t in confirmed)

    unknown = harness("merge", *shards, "-o", str(tmp_path / "u"), "--judge", f"fp9={url}")
    assert unknown.returncode == 2
    assert "the run has no variant 'fp9'" in unknown.stderr
    closed = harness("merge", *shards, "-o", str(tmp_path / "c"), "--judge", "http://127.0.0.1:9")
    assert closed.returncode in (2, 3)
    assert "--judge http://127.0.0.1:9" in closed.stderr
    assert not (tmp_path / "u").exists()
    assert not (tmp_path / "c").exists()
    # a server that does not list the run's model: said, not refused (llama.cpp ignores it)
    meta = json.loads((tmp_path / "s1" / "run.json").read_text())
    assert asyncio.run(check_judges({"default": url}, meta)) == []
    other = {**meta, "model": "other/model", "dialects": {}}
    [warned] = asyncio.run(check_judges({"default": url}, other))
    assert "not other/model" in warned


def test_merge_judge_servers_by_variant() -> None:
    """``--judge [VARIANT=]URL``: a URL alone for every variant not named, a variant's label
    holding '=' itself, the forms ``--endpoint`` takes; what cannot be meant is refused."""
    labels = ["index_k=fp8", "index_k=bf16"]
    assert judge_servers(["http://h:30000/v1"], labels) == {
        "index_k=fp8": "http://h:30000", "index_k=bf16": "http://h:30000"
    }  # fmt: skip
    assert judge_servers(["index_k=bf16=h2:30001", "http://h:30000/?a=b"], labels) == {
        "index_k=fp8": "http://h:30000", "index_k=bf16": "http://h2:30001"
    }  # fmt: skip
    assert judge_servers(["index_k=fp8=http://a:1"], labels) == {"index_k=fp8": "http://a:1"}
    for given, message in (
        (["index_k=fp9=http://a:1"], "no variant 'index_k=fp9'"),
        (["http://a:1", "http://b:2"], "given twice"),
        (["index_k=fp8=http://a:1", "index_k=fp8=http://b:2"], "two servers"),
        (["index_k=fp8=ftp://a:1"], "--judge"),
    ):
        with pytest.raises(UsageError, match=message):
            judge_servers(given, labels)
