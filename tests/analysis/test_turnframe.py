"""The turns frame in bounded memory: the text kept only where the report quotes it, the rest
read back from turns.jsonl (for the after-load findings and for turns.parquet)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from harness.analysis import frames, turnframe
from harness.analysis import summary as analysis
from harness.record import safejson
from harness.report import build as report


def row(variant: str, session: int, turn: int = 0, label: str = "ok_text", **kw: Any) -> dict:
    r: dict[str, Any] = {
        "run_id": "x", "variant": variant, "factors": {"k": variant[2:]}, "repeat": 0,
        "session": session, "turn": turn, "attempt": 0, "label": label,
        "corrupted": label == "token_salad", "tier": "suspect" if label == "token_salad" else "",
        "content": f"healthy answer {session}.{turn} " * 3, "reasoning": "thinking",
        "tool_calls": [{"name": "read_file", "arguments": {"path": f"f{session}"}}],
        "evidence": {"text_score": 0.01}, "transport_error": None, "finish_reason": "stop",
        "prompt_tokens": 100 + turn, "inflight": 1, "ttft_s": 0.1, "latency_s": 0.2,
    }  # fmt: skip
    r.update(kw)
    return r


def write(path: Path, rows: list[dict[str, Any]], meta: dict[str, Any] | None = None) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    lines = "".join(json.dumps(r) + "\n" for r in rows)
    (path / "turns.jsonl").write_text(lines + '{"variant": "k=a", "ses', "utf-8")  # torn tail
    (path / "run.json").write_text(json.dumps({"run_id": "x", **(meta or {})}), "utf-8")
    return path


def rows_with_salad() -> list[dict[str, Any]]:
    lone = "\ud800"  # json.dumps writes its escape, as the JSONL writer does
    out = [row("k=a", s, t) for s in range(6) for t in range(3)]
    out += [row("k=b", s, t) for s in range(6) for t in range(3)]
    out[20] = row("k=b", 0, 2, "token_salad", content=f"fine so far {lone} then ⟦salad⟧",
                  evidence={"offset": 12, "text_score": 0.9})  # fmt: skip
    out[7]["tool_calls"] = [{"name": "read_file", "arguments": {"path": lone + "src"}}]
    return out


def test_text_is_kept_only_for_flagged_turns_and_the_numbers_are_the_same(
    tmp_path: Path,
) -> None:
    rows = rows_with_salad()
    run = analysis.load_run(write(tmp_path / "r", rows))
    df = run.turns
    assert len(df) == len(rows)  # the torn line skipped
    kept = df[df[turnframe.TEXT_KEPT]]
    assert list(kept["label"]) == ["token_salad"]
    assert kept["content"].iloc[0] == "fine so far \\ud800 then ⟦salad⟧"  # printable
    assert (df.loc[~df[turnframe.TEXT_KEPT], "content"] == "").all()
    assert df.loc[~df[turnframe.TEXT_KEPT], "tool_calls"].isna().all()
    assert (df["tool_call_count"] == 1).all()
    # the statistics are those of the whole records
    whole = analysis.prepare(pd.DataFrame(safejson.printable(rows)))
    assert analysis.summarize(df, "x") == analysis.summarize(whole, "x")


def test_rows_read_in_chunks_make_the_same_frame(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rows = rows_with_salad()
    for r in rows[:7]:  # a first chunk where these are empty, numbers in the next ones
        r["ttft_s"], r["prompt_tokens"] = None, None
    rows[30]["extra"] = 5  # a field only a later chunk has
    run_dir = write(tmp_path / "r", rows)
    once = analysis.load_run(run_dir).turns
    monkeypatch.setattr(turnframe, "CHUNK_ROWS", 7)
    chunked = analysis.load_run(run_dir).turns
    assert len(chunked) == len(once)
    for col in ("ttft_s", "prompt_tokens", "session", "label", "content", "is_corrupted"):
        assert chunked[col].dtype == once[col].dtype, col
        assert chunked[col].fillna(-1).tolist() == once[col].fillna(-1).tolist(), col
    assert chunked["extra"].fillna(-1).tolist() == once["extra"].fillna(-1).tolist()
    assert analysis.summarize(chunked, "x") == analysis.summarize(once, "x")


def test_tidy_export_reads_the_text_back_a_chunk_at_a_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rows = rows_with_salad()
    run_dir = write(tmp_path / "r", rows)
    run = analysis.load_run(run_dir)
    monkeypatch.setattr(frames, "TIDY_CHUNK", 5)  # eight row groups, the last of one row
    path = frames.write_tidy(run.turns, run_dir / "turns", source=run_dir / "turns.jsonl")
    import pyarrow.parquet as pq

    assert pq.ParquetFile(path).num_row_groups == 8
    back = pd.read_parquet(path)
    assert len(back) == len(rows)
    assert back["content"].tolist()[:2] == [r["content"] for r in rows[:2]]
    assert back["content"].iloc[20] == "fine so far \\ud800 then ⟦salad⟧"
    assert json.loads(back["tool_calls"].iloc[7]) == [
        {"name": "read_file", "arguments": {"path": "\\ud800src"}}
    ]
    assert back["evidence_offset"].iloc[20] == 12
    assert back["evidence_offset"].isna().sum() == len(rows) - 1
    assert back["factor_k"].tolist()[:1] == ["a"]
    assert turnframe.TEXT_AT not in back
    # the same file as the whole frame, text and all, written at once
    whole = analysis.prepare(pd.DataFrame(safejson.printable(rows)))
    once = pd.read_parquet(frames.write_tidy(whole, tmp_path / "once"))
    for col in ("content", "reasoning", "tool_calls", "label", "session", "factor_k"):
        assert back[col].tolist() == once[col].tolist(), col


def test_a_greedy_run_compares_answers_without_their_text_and_quotes_the_cut(
    tmp_path: Path,
) -> None:
    long = "a complete and healthy answer that goes on for a while. " * 8
    rows = [row("k=a", 0, content=long), row("k=a", 1, content=long), row("k=a", 2)]
    rows += [row("k=b", 0, content=long), row("k=b", 1, content="Prime."), row("k=b", 2)]
    run_dir = write(tmp_path / "g", rows, {"temperature": 0})
    run = analysis.load_run(run_dir)
    df = run.turns
    cut = df[df["is_corrupted"]]
    assert list(zip(cut["variant"], cut["session"], strict=True)) == [("k=b", 1)]
    assert cut["content"].iloc[0] == "Prime."  # read back: the report quotes it
    assert df.loc[(df["variant"] == "k=a") & (df["session"] == 0), "reference"].item() == "same"
    examples = report.worst_examples(df)
    assert "Prime." in json.dumps(examples["k=b"])
