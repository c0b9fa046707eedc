"""Hostile files and folders: no secret on disk, a run folder is data, bad files are exit 2.

The whole CLI runs as a subprocess; the servers are the hostile stand-in (a real loopback
process, launched by the harness from a target file where the test says so).
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from harness import labels as L
from harness.record.turns import read_turns
from harness.target.launch import safe_label
from harness.workload.matrix import Variant
from tests.standins import HOSTILE, running_hostile

ROOT = Path(__file__).resolve().parent.parent.parent
KEY = "sk-hostile-secret-5521"

TARGET = """
name = "hostile"
mode = "launch"
model = "m"
warm_up = false
flush_cache = false
metrics = false

[vars]
api_key = "none"

[launch]
command = ["{{python}}", "{server}", "--port", "{{port}}", "--mode", "healthy",
           "--api-key", "{key}"]
stop_grace_s = 5

[ready]
paths = ["/health"]
timeout_s = 30
interval_s = 0.1
"""


def harness(
    *args: str, env: dict[str, str] | None = None, cwd: Path = ROOT
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "harness.cli", *args],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=cwd,
        env={**os.environ, "OPENAI_API_KEY": KEY, "PYTHONPATH": str(ROOT), **(env or {})},
    )


def target_file(path: Path, key: str) -> Path:
    path.write_text(TARGET.format(server=HOSTILE, key=key))
    return path


def everything_written(folder: Path) -> str:
    return "\n".join(
        p.read_text(errors="replace") for p in sorted(folder.rglob("*")) if p.is_file()
    )


# ---- secrets -----------------------------------------------------------------------------


@pytest.mark.parametrize("how", ["target-var", "env"])
def test_a_key_reaches_the_server_and_never_a_file_or_the_terminal(
    tmp_path: Path, how: str
) -> None:
    out = tmp_path / "run"
    if how == "target-var":
        target = target_file(tmp_path / "t.toml", "{api_key}")
        given = ["--target-var", f"api_key={KEY}"]
        env = None
    else:
        target = target_file(tmp_path / "t.toml", "{env:HOSTILE_KEY}")
        given, env = [], {"HOSTILE_KEY": KEY}
    common = ["run", "--target", str(target), *given, "--sessions", "2", "--turns", "1"]
    done = harness(*common, "--out", str(out), "--workers", "1", env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = read_turns(out / "turns.jsonl")
    assert [r["label"] for r in rows] == [L.OK_TEXT] * 2  # the server accepted the key
    assert KEY not in everything_written(out)
    assert KEY not in done.stdout + done.stderr
    header = (out / "servers" / "default.log").read_text().splitlines()[0]
    assert ("***" if how == "target-var" else "{env:HOSTILE_KEY}") in header
    meta = json.loads((out / "run.json").read_text())
    if how == "target-var":
        assert meta["args"]["target_var"] == ["api_key=***"]
    plan = harness(*common, "--out", str(tmp_path / "dry"), "--dry-run", env=env)
    assert plan.returncode == 0, plan.stderr[-2000:]
    assert KEY not in plan.stdout + plan.stderr
    assert "--api-key" in plan.stdout


def test_an_env_reference_that_is_not_set_is_one_line(tmp_path: Path) -> None:
    target = target_file(tmp_path / "t.toml", "{env:HOSTILE_UNSET_VAR}")
    env = {k: v for k, v in os.environ.items() if k != "HOSTILE_UNSET_VAR"}
    gone = subprocess.run(
        [sys.executable, "-m", "harness.cli", "run", "--target", str(target), "--sessions",
         "1", "--turns", "1", "--out", str(tmp_path / "run")],
        capture_output=True, text=True, timeout=240, cwd=ROOT, env=env,
    )  # fmt: skip
    assert gone.returncode == 2, gone.stderr[-2000:]
    assert "HOSTILE_UNSET_VAR is not set" in gone.stderr
    assert "Traceback" not in gone.stderr


# ---- a run folder is data ------------------------------------------------------------------


def _evil_target(tmp_path: Path) -> tuple[Path, Path]:
    """A target file whose launch would leave a marker file behind."""
    marker = tmp_path / "evil-ran"
    evil = tmp_path / "evil.toml"
    code = f"open({str(marker)!r}, 'w').write('ran')"
    evil.write_text(
        'name = "evil"\nmode = "launch"\nmodel = "m"\n'
        f'[launch]\ncommand = ["{{python}}", "-c", "{code}"]\n'
        '[ready]\npaths = ["/health"]\ntimeout_s = 5\ninterval_s = 0.1\n'
    )
    return evil, marker


def _finished_run(tmp_path: Path) -> Path:
    out = tmp_path / "run"
    target = target_file(tmp_path / "t.toml", "{env:HOSTILE_KEY}")
    done = harness("run", "--target", str(target), "--sessions", "2", "--turns", "1",
                   "--out", str(out), "--keep-transcripts", "--workers", "1",
                   env={"HOSTILE_KEY": KEY})  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert (out / "target.toml").read_text() == target.read_text()  # the copy kept
    return out


def _point_run_json_at(run: Path, path: Path) -> None:
    meta = json.loads((run / "run.json").read_text())
    meta["target"] = str(path)
    meta["args"]["target"] = str(path)
    (run / "run.json").write_text(json.dumps(meta))


def test_replay_and_resume_never_launch_the_target_run_json_names(tmp_path: Path) -> None:
    run = _finished_run(tmp_path)
    evil, marker = _evil_target(tmp_path)
    _point_run_json_at(run, evil)
    env = {"HOSTILE_KEY": KEY}
    replayed = harness("replay", str(run), "--session", "0", "--turn", "0", "--count", "1", env=env)
    assert replayed.returncode == 0, replayed.stderr[-2000:]  # relaunched from the copy
    resumed = harness("run", "--resume", str(run), env=env)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    (run / "target.toml").unlink()
    refused = harness("replay", str(run), "--session", "0", "--turn", "0", "--count", "1", env=env)
    assert refused.returncode == 2
    assert "--target FILE" in refused.stderr
    refused = harness("run", "--resume", str(run), env=env)
    assert refused.returncode == 2
    assert "--target FILE" in refused.stderr
    assert not marker.exists()
    named = harness("replay", str(run), "--session", "0", "--turn", "0", "--count", "1", "--target",
                    str(tmp_path / "t.toml"), env=env)  # fmt: skip
    assert named.returncode == 0, named.stderr[-2000:]
    assert not marker.exists()


def test_a_label_from_a_crafted_folder_stays_inside_it(tmp_path: Path) -> None:
    run = _finished_run(tmp_path)
    meta = json.loads((run / "run.json").read_text())
    meta["variants"] = [{"label": "default", "factors": {"../../../escaped": "x/../../y"}}]
    (run / "run.json").write_text(json.dumps(meta))
    with running_hostile("healthy") as url:
        done = harness("replay", str(run), "--session", "0", "--turn", "0", "--count", "1",
                       "--endpoint", url, env={"OPENAI_API_KEY": ""})  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    written = [p for p in tmp_path.rglob("*.json") if "replays" in p.parts]
    assert len(written) == 1
    assert written[0].parent == run / "replays"
    assert not any(p.name.startswith("escaped") for p in tmp_path.rglob("*"))


@pytest.mark.parametrize(
    "label", ["../../x=a", "a=b/../../c", "..", "f=..", "/etc/passwd=x", "a=b\\c"]
)
def test_safe_label_is_a_file_name(label: str) -> None:
    name, _, level = label.partition("=")
    made = safe_label(Variant(((name, level),)))
    assert "/" not in made
    assert "\\" not in made
    assert not made.startswith(".")


# ---- the harness's own environment -----------------------------------------------------------


def _limited_file_size(limit: int) -> Callable[[], None]:
    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return apply


def test_a_full_disk_is_exit_3_in_one_line_and_the_folder_resumes(tmp_path: Path) -> None:
    """RLIMIT_FSIZE makes the run's files "full" at 20 kB (Python ignores SIGXFSZ, so the
    write that crosses the limit is cut short, as on a full disk)."""
    out = tmp_path / "run"
    args = ["run", "--sessions", "60", "--turns", "1", "--out", str(out), "--workers", "1"]
    with running_hostile("healthy") as url:
        full = subprocess.run(
            [sys.executable, "-m", "harness.cli", *args, "--endpoint", url, "--model", "m"],
            capture_output=True, text=True, timeout=240, cwd=ROOT,
            env={**os.environ, "OPENAI_API_KEY": ""}, preexec_fn=_limited_file_size(20_000),
        )  # fmt: skip
        assert full.returncode == 3, full.stderr[-2000:]
        lines = [x for x in full.stderr.splitlines() if x.startswith("harness")]
        assert len(lines) == 1, full.stderr[-2000:]  # (the others: progress announcements)
        assert "turns.jsonl: File too large" in lines[0]
        assert "Traceback" not in full.stderr
        raw = (out / "turns.jsonl").read_bytes()
        assert raw.endswith(b"\n")  # no torn last line
        kept = [json.loads(line) for line in raw.splitlines()]
        assert 0 < len(kept) < 60
        resumed = harness("run", "--resume", str(out), env={"OPENAI_API_KEY": ""})
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    rows = read_turns(out / "turns.jsonl")
    assert sorted(r["session"] for r in rows) == list(range(60))  # each session once


def test_an_out_that_cannot_be_made_is_exit_3_in_one_line(tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("")
    with running_hostile("healthy") as url:
        done = harness("run", "--endpoint", url, "--model", "m", "--sessions", "1",
                       "--out", str(tmp_path / "a-file" / "run"))  # fmt: skip
    assert done.returncode == 3, done.stderr[-2000:]
    assert done.stderr.count("\n") == 1
    assert "cannot write" in done.stderr
    assert "Not a directory" in done.stderr


def test_a_torn_line_in_sessions_jsonl_never_merges_with_the_next(tmp_path: Path) -> None:
    from harness.record.rundir import SESSIONS_FILE, RunDir
    from harness.record.turns import JsonlAppender

    path = tmp_path / SESSIONS_FILE
    path.write_text('{"variant": "default", "repeat": 0, "session": 0, "ended": "answered"}\n'
                    '{"variant": "default", "repe')  # fmt: skip
    log = JsonlAppender(path)
    log.append(b'{"variant": "default", "repeat": 0, "session": 2, "ended": "answered"}\n')
    log.close()
    assert RunDir(tmp_path).finished_sessions() == {("default", 0, 0), ("default", 0, 2)}


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b'{"messages": ' + b"[" * 100_000 + b"]" * 100_000 + b"}\n", "nested too deep"),
        (b'{"messages": [{"role": "user", "content": "caf\xe9"}]}\n', "not UTF-8"),
        (
            b'{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", '
            b'"content": "ok"}], "offsets_s": [1e9]}\n',
            "'offsets_s' holds 1000000000.0",
        ),
        (
            b'{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", '
            b'"content": "ok"}], "offsets_s": [NaN]}\n',
            "'offsets_s' holds nan",
        ),
    ],
    ids=["deep", "not-utf8", "offset-1e9", "offset-nan"],
)
def test_a_bad_workload_file_is_exit_2_in_one_line(
    tmp_path: Path, content: bytes, message: str
) -> None:
    workload = tmp_path / "w.jsonl"
    workload.write_bytes(content)
    done = harness("run", "--endpoint", "http://127.0.0.1:9", "--model", "m", "--workload",
                   str(workload), "--out", str(tmp_path / "run"))  # fmt: skip
    assert done.returncode == 2, done.stderr[-2000:]
    assert done.stderr.count("\n") == 1, done.stderr[-2000:]
    assert message in done.stderr


def test_report_md_shows_control_characters_of_model_output_escaped(tmp_path: Path) -> None:
    from harness.report import build as report
    from tests.report.test_report import make_run, turn

    evil = "fine so far \x1b]0;owned\x07\x1b[2J\x1b[31mred\x9b then salad"
    run = make_run(tmp_path / "run", [
        turn("k=a", 0), turn("k=b", 0, "token_salad", evil, evidence={"offset": 5}),
    ])  # fmt: skip
    report.write_report(run)
    md = (run / "report.md").read_text(encoding="utf-8")
    assert not any(c in md for c in "\x1b\x07\x9b")
    assert "\\x1b]0;owned\\x07\\x1b[2J\\x1b[31mred\\x9b" in md


def test_a_lone_surrogate_reaches_every_writer_as_its_escape(tmp_path: Path) -> None:
    from tests.report.test_report import make_run, turn

    lone = "\ud800"  # json.dumps writes it escaped, as the JSONL writer does
    run = make_run(tmp_path / "run", [
        turn("k=a", 0, tool_calls=[{"name": "read_file", "arguments": {"path": lone + "src"}}]),
        turn("k=b", 0, "token_salad", f"fine so far {lone} then salad", evidence={
            "offset": 12, "reason": f"salad at {lone}"}),
    ])  # fmt: skip
    meta = {"run_id": "s", "model": f"m{lone}", "started_at": "t0"}
    (run / "run.json").write_text(json.dumps(meta), "utf-8")
    junit = tmp_path / "junit.xml"
    done = harness("report", str(run), "--junit", str(junit))
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    for name in ("report.md", "report.html", "summary.json"):
        (run / name).read_bytes().decode("utf-8")  # all UTF-8
    md = (run / "report.md").read_text(encoding="utf-8")
    assert "\\ud800 then salad" in md  # shown as its escape
    assert "\\ud800" in (run / "report.html").read_text(encoding="utf-8")
    assert "m\\ud800" in junit.read_text(encoding="utf-8")
    json.loads(done.stdout.strip().splitlines()[-1])  # the last line is JSON

    import pandas as pd

    tidy = pd.read_parquet(run / "turns.parquet")
    assert tidy["tool_calls"].str.contains("\\\\ud800src", regex=False).any()


def test_shards_with_a_lone_surrogate_merge(tmp_path: Path) -> None:
    """A lone surrogate in a shard's turns (written as its escape) is carried into the merged
    turns.jsonl as its escape: the merge once wrote the rows as UTF-8 text and stopped on it."""
    from tests.report.test_report import make_run, turn

    lone = "\ud800"
    for i in (1, 2):
        run = make_run(tmp_path / f"s{i}", [
            turn("k=a", i, "token_salad", f"fine so far {lone} then salad"), turn("k=a", 10 + i),
        ])  # fmt: skip
        meta = {"run_id": f"s{i}", "plan_id": "p", "shard": {"index": i, "count": 2},
                "finished": {"exit_code": 0}, "order": [{"variant": "k=a", "repeat": 0}],
                "variants": [{"label": "k=a", "factors": {"k": "a"}}]}  # fmt: skip
        (run / "run.json").write_text(json.dumps(meta), "utf-8")
    out = tmp_path / "merged"
    done = harness("merge", str(tmp_path / "s1"), str(tmp_path / "s2"), "-o", str(out))
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    rows = read_turns(out / "turns.jsonl")
    assert [(r["session"], r["run_id"]) for r in rows] == [
        (1, "s1-merged"), (2, "s1-merged"), (11, "s1-merged"), (12, "s1-merged")
    ]  # fmt: skip
    assert rows[0]["content"] == f"fine so far {lone} then salad"
    (out / "turns.jsonl").read_bytes().decode("ascii")  # the escape, not a lone surrogate
