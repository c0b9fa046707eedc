from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest

from harness.errors import UsageError
from harness.report import build as report

SAMPLE = Path(__file__).parent.parent / "data" / "turns_sample.jsonl"
PNG = b"\x89PNG\r\n\x1a\n"
EXPECTED_PLOTS = {"corruption_by_variant", "corruption_by_context", "corruption_by_inflight",
                  "label_mix", "latency", "server_metrics"}  # fmt: skip


@pytest.fixture(scope="module")
def sample_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    run = tmp_path_factory.mktemp("run")
    shutil.copy(SAMPLE, run / "turns.jsonl")
    variants = ("index_k=fp8,hicache=off", "index_k=bf16,hicache=on")
    metrics = [{"variant": v, "t": t, "name": "num_running_reqs", "value": t % 7}
               for v in variants for t in range(10)]  # fmt: skip
    (run / "metrics.jsonl").write_text("\n".join(json.dumps(m) for m in metrics) + "\n")
    (run / "run.json").write_text(json.dumps({"run_id": "sample-run", "started_at": "t0"}))
    return run, report.write_report(run)


def test_write_report_files(sample_run: tuple[Path, dict[str, Any]]) -> None:
    run, summary = sample_run
    on_disk = json.loads((run / "summary.json").read_text(encoding="utf-8"))
    assert on_disk == json.loads(json.dumps(summary))
    assert summary["started_at"] == "t0"
    assert set(summary["plots"]) == EXPECTED_PLOTS
    for rel in summary["plots"].values():
        data = (run / rel).read_bytes()
        assert data.startswith(PNG)
        assert len(data) > 5000
    assert (run / "turns.parquet").is_file()


def test_markdown_order_and_examples(sample_run: tuple[Path, dict[str, Any]]) -> None:
    run, summary = sample_run
    md = (run / "report.md").read_text(encoding="utf-8")
    heads = [md.index(h) for h in ("## Verdict", "## Variants", "## Plots", "## Worst examples")]
    assert heads == sorted(heads)
    assert summary["verdict"] in md
    assert "index_k=bf16,hicache=on corrupts more than index_k=fp8,hicache=off" in md
    assert "![corruption_by_variant](plots/corruption_by_variant.png)" in md
    # the salad example: the marker sits right where evidence.offset says
    assert "Checking the module layout first. ⟦verifyЖкод" in md
    # the clean baseline has no examples section
    assert "### index_k=fp8,hicache=off" not in md


def test_html_is_self_contained(sample_run: tuple[Path, dict[str, Any]]) -> None:
    run, summary = sample_run
    html = (run / "report.html").read_text(encoding="utf-8")
    assert html.count("data:image/png;base64,") == len(summary["plots"])
    assert not re.search(r"""(src|href)=["'](?!data:)""", html)
    assert '<mark class="bad">verifyЖкод' in html


def make_run(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "turns.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n", "utf-8")
    return path


def turn(
    variant: str, session: int, label: str = "ok_text", content: str = "fine", **kw: Any
) -> dict[str, Any]:
    r = {"run_id": "x", "variant": variant, "repeat": 0, "session": session, "turn": 0,
         "attempt": 0, "label": label, "corrupted": label == "token_salad", "content": content,
         "transport_error": None, "prompt_tokens": 100, "inflight": 1, "ttft_s": 0.1,
         "itl_s": None, "evidence": {}}  # fmt: skip
    r.update(kw)
    return r


def test_html_escapes_model_output(tmp_path: Path) -> None:
    evil = 'ok so far <script>alert("x")</script><img src=x onerror=alert(1)> & more'
    variant = "k=<b>bold</b>"
    rows = [
        turn("k=a", 0),
        turn(variant, 0, "token_salad", evil, evidence={"offset": 10, "why": "<i>"}),
    ]
    run = make_run(tmp_path / "evil", rows)
    report.write_report(run)
    html = (run / "report.html").read_text(encoding="utf-8")
    assert "<script>" not in html
    assert "<img src=x" not in html
    assert "<b>bold" not in html
    assert "<i>" not in html
    assert "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;" in html
    assert "k=&lt;b&gt;bold&lt;/b&gt;" in html
    # the highlighted span starts at the offset (character 10: the "<script>")
    assert '<mark class="bad">&lt;script&gt;' in html
    assert "ok so far " in html


def test_markdown_fence_survives_backticks(tmp_path: Path) -> None:
    content = "intro ```` code fence ```` then garbage"
    run = make_run(
        tmp_path / "ticks", [turn("k=a", 0, "token_salad", content, evidence={"offset": 6})]
    )
    report.write_report(run)
    md = (run / "report.md").read_text(encoding="utf-8")
    assert "`````text\nintro ⟦```` code fence ```` then garbage⟧\n`````" in md


def test_excerpt_windows() -> None:
    text = "a" * 500 + "BAD" + "b" * 500
    e = report.excerpt(text, {"offset": 500, "length": 3})
    assert e["span"] == "BAD"
    assert e["pre"] == "a" * report.BEFORE
    assert e["cut_before"]
    assert e["cut_after"]
    assert report.excerpt("short", {"offset": 99})["offset"] is None  # out of range: no marker
    assert report.excerpt("short", None)["pre"] == "short"


def test_crashed_run_with_torn_line_still_reports(tmp_path: Path) -> None:
    run = make_run(tmp_path / "crash", [turn("k=a", i) for i in range(3)])
    with open(run / "turns.jsonl", "a", encoding="utf-8") as fh:
        fh.write('{"run_id": "x", "variant": "k=a", "sess')
    summary = report.write_report(run)
    assert summary["variants"][0]["sessions"] == 3
    assert "server_metrics" not in summary["plots"]
    assert (run / "report.html").is_file()


def test_format_table(sample_run: tuple[Path, dict[str, Any]]) -> None:
    _, summary = sample_run
    text = report.format_table(summary)
    lines = text.splitlines()
    assert lines[0].startswith("verdict: ")
    assert "rate [95% CI]" in lines[1]
    assert set(lines[2]) <= {"-", " "}
    row = next(line for line in lines if line.startswith("index_k=bf16,hicache=on"))
    assert row.split()[1:3] == ["20", "9"]
    assert "45.0% [25.8–65.8]" in row
    # after the table, which tiers the rates count: no server scored these saved turns
    assert lines[3 + len(summary["variants"])].startswith("rates count structural + suspect")
    assert "the text detector alone" in text


def test_the_terminal_table_fits_80_columns_and_says_the_demo_odds(tmp_path: Path) -> None:
    rows = [turn(v, i, "token_salad" if i < 5 else "ok_text", "salad" if i < 5 else "fine")
            for v in ("index_k=fp8", "index_k=bf16") for i in range(48)]  # fmt: skip
    run = make_run(tmp_path / "run", rows)
    (run / "run.json").write_text(json.dumps({"run_id": "d", "args": {"demo": True}}))
    text = report.format_table(report.write_report(run))
    assert max(len(line) for line in text.splitlines() if "verdict" not in line) <= 80
    assert "fault odds are x6" in text


def test_compare_runs_flags_regression(tmp_path: Path) -> None:
    before = [turn("k=a", i) for i in range(30)] + [turn("k=b", i) for i in range(30)]
    after = [turn("k=a", i, "token_salad" if i < 12 else "ok_text") for i in range(30)]
    after += [turn("k=b", i, "token_salad" if i < 1 else "ok_text") for i in range(30)]
    after += [turn("k=new", i) for i in range(5)]
    ra, rb = make_run(tmp_path / "a", before), make_run(tmp_path / "b", after)
    cmp = report.compare_runs(ra, rb)
    assert cmp["regressions"] == ["k=a"]
    assert cmp["only_in_b"] == ["k=new"]
    assert cmp["only_in_a"] == []
    row = cmp["variants"][0]
    assert row["session"]["rate_a"] == 0.0
    assert row["session"]["rate_b"] == pytest.approx(0.4)
    assert row["session"]["p_increase"] < 0.001
    assert not cmp["variants"][1]["regression"]
    md = report.compare_markdown(cmp)
    assert "**Regression** in k=a" in md
    assert md.count("REGRESSION") == 1
    # reversed: an improvement is not a regression
    assert report.compare_runs(rb, ra)["regressions"] == []


def test_compare_uses_summary_json_and_rejects_non_runs(tmp_path: Path) -> None:
    run = make_run(tmp_path / "r", [turn("k=a", i) for i in range(4)])
    report.write_report(run)
    assert report.load_summary(run / "summary.json")["variants"][0]["sessions"] == 4
    with pytest.raises(UsageError, match="summary.json"):
        report.compare_runs(tmp_path / "nothing", run)


def test_offset_in_reasoning_and_metrics_with_repeats(tmp_path: Path) -> None:
    rows = [turn("k=a", 0, "token_salad", "the answer", reasoning="think: xq#Zr!!~~ garble",
                 evidence={"offset": 7, "in_reasoning": True, "text_score": 0.9})]  # fmt: skip
    run = make_run(tmp_path / "reason", rows)
    metrics = [{"variant": "k=a", "repeat": r, "t": t, "name": "running", "value": t + r}
               for r in (0, 1) for t in range(5)]  # fmt: skip
    (run / "metrics.jsonl").write_text("\n".join(json.dumps(m) for m in metrics) + "\n")
    summary = report.write_report(run)
    md = (run / "report.md").read_text(encoding="utf-8")
    assert "think: ⟦xq#Zr!!~~ garble⟧" in md
    assert "from character 7 of the reasoning" in md
    assert (run / summary["plots"]["server_metrics"]).is_file()


def test_markdown_and_html_carry_the_same_sections(tmp_path: Path) -> None:
    rows = [turn("k=a", i, sim_injected="none") for i in range(6)]
    rows += [turn("k=b", i, "token_salad" if i < 2 else "ok_text", "zq#!~ garble" if i < 2 else
                  "fine", sim_injected="salad" if i < 2 else "none",
                  cached_tokens=50) for i in range(6)]  # fmt: skip
    run = make_run(tmp_path / "r", rows)
    (run / "selfreport.jsonl").write_text(
        json.dumps({"variant": "k=b", "turns_per_s": 9.5, "cpu_percent": 12, "saturated": True})
        + "\n"
    )
    (run / "run.json").write_text(json.dumps({
        "run_id": "r1", "command": "harness run --ab k=a,b --seed 7", "harness_version": "0.1.0",
        "dialect": "dsml-v4", "scenario": "coding-agent", "seed": 7, "model": "m<x>",
        "started_at": "2026-01-01T00:00:00", "duration_s": 12.0,
    }))  # fmt: skip
    (run / "outcomes.json").write_text(json.dumps([
        {"label": "k=a", "server_version": "0.5.1", "wall_s": 6.0},
        {"label": "k=b", "server_version": "0.5.1", "wall_s": 6.0},
    ]))  # fmt: skip
    summary = report.write_report(run)
    md = (run / "report.md").read_text(encoding="utf-8")
    html = (run / "report.html").read_text(encoding="utf-8")
    md_sections = re.findall(r"^## (.+)$", md, flags=re.M)
    html_sections = [s.replace("&#x27;", "'") for s in re.findall(r"<h2>(.+?)</h2>", html)]
    assert md_sections == html_sections
    for needed in ("What was run", "The simulator's own accuracy", "Cache", "The harness itself"):
        assert needed in md_sections
    assert md_sections[0] == "What was run"
    assert summary["run"]["servers"] == {"k=a": "0.5.1", "k=b": "0.5.1"}
    assert "`harness run --ab k=a,b --seed 7`" in md
    assert "<code>harness run --ab k=a,b --seed 7</code>" in html
    assert "m&lt;x&gt;" in html  # names from the run stay text in the rendered Markdown too
    assert "| k=b | 2 | 2 | 100.0% | 100.0% | 0 |" in md  # injected, flagged, recall, precision


def test_cancelled_turns_are_no_transport_errors(tmp_path: Path) -> None:
    rows = [turn("k=a", i) for i in range(4)]
    rows.append(turn("k=a", 4, "transport_error", "", transport_error="cancelled: the run was "
                     "stopped"))  # fmt: skip
    rows.append(turn("k=a", 5, "transport_error", "", transport_error="disconnect: cut"))
    summary = report.write_report(make_run(tmp_path / "r", rows))
    v = summary["variants"][0]
    assert (v["transport_errors"], v["cancelled_turns"], v["classified_turns"]) == (1, 1, 4)
    assert v["transport_error_rate"] == pytest.approx(1 / 5)
    md = (tmp_path / "r" / "report.md").read_text(encoding="utf-8")
    assert "1 turn in flight when the run was stopped is recorded as cancelled" in md


def test_compare_table_names_every_column(tmp_path: Path) -> None:
    ra = make_run(tmp_path / "a", [turn("k=a", i) for i in range(4)])
    rb = make_run(tmp_path / "b", [turn("k=a", i) for i in range(4)])
    head = next(line for line in report.compare_markdown(report.compare_runs(ra, rb)).splitlines()
                if line.startswith("| variant"))  # fmt: skip
    assert all(cell.strip() for cell in head.strip("|").split("|"))
    assert head.rstrip(" |").endswith("regression")


def test_report_lists_a_replay_line_per_corrupted_session(tmp_path: Path) -> None:
    run = make_run(tmp_path / "run", [
        turn("k=a", 0), turn("k=b", 0), turn("k=b", 3, "token_salad", "salad"),
        turn("k=b", 3, "token_salad", "salad", turn=1),
    ])  # fmt: skip
    summary = report.write_report(run)
    assert summary["replays"] == {
        "count": 1,
        "lines": [f"harness replay {run} --session 3 --variant k=b"],
    }
    md = (run / "report.md").read_text(encoding="utf-8")
    assert f"harness replay {run} --session 3 --variant k=b" in md
    assert "harness replay" in (run / "report.html").read_text(encoding="utf-8")


def test_html_shows_cjk_dsml_and_evidence_as_a_person_reads_them(tmp_path: Path) -> None:
    dsml = '<｜DSML｜invoke name="read_file">读取文件</｜DSML｜invoke>'
    run = make_run(tmp_path / "run", [
        turn("k=a", 0),
        turn("k=b", 0, "token_salad", f"先看看 {dsml} then salad",
             evidence={"reason": "mixed scripts", "offset": 4, "score": 0.91234}),
    ])  # fmt: skip
    report.write_report(run)
    html = (run / "report.html").read_text(encoding="utf-8")
    assert "｜DSML｜" in html
    assert "读取文件" in html
    # a font stack that covers CJK and full-width forms, body and code alike
    assert html.count('"Noto Sans CJK SC"') >= 2
    assert "<li>why: mixed scripts</li>" in html
    assert "<li>score: 0.912</li>" in html
    assert "{&quot;reason" not in html  # not raw JSON
    md = (run / "report.md").read_text(encoding="utf-8")
    assert "why: mixed scripts" in md
    assert "[tool_calls] nan" not in md.lower()
