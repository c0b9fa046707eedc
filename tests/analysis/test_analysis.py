from __future__ import annotations

import json
import shutil
from collections import defaultdict
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from harness.analysis import frames, stats
from harness.analysis import summary as analysis
from harness.errors import UsageError
from harness.labels import CORRUPTED_LABELS

SAMPLE = Path(__file__).parent.parent / "data" / "turns_sample.jsonl"


def rec(variant: str, repeat: int, session: int, turn: int, label: str = "ok_tool_call",
        **kw: Any) -> dict[str, Any]:  # fmt: skip
    r: dict[str, Any] = {
        "run_id": "r1", "variant": variant, "factors": analysis.parse_variant_label(variant),
        "repeat": repeat, "session": session, "turn": turn, "attempt": 0, "inflight": 1,
        "prompt_tokens": 1000 * (turn + 1), "label": label, "corrupted": label in CORRUPTED_LABELS,
        "transport_error": None, "content": "text", "ttft_s": 0.1, "itl_s": 0.01, "evidence": {},
    }  # fmt: skip
    r.update(kw)
    return r


A, B, C = "k=a", "k=b", "k=c"


def small_frame() -> pd.DataFrame:
    rows = [
        rec(A, 0, 0, 0), rec(A, 0, 0, 1), rec(A, 0, 1, 0), rec(A, 0, 1, 1), rec(A, 1, 0, 0),
        rec(A, 1, 0, 1, "transport_error", transport_error="connect: refused", corrupted=False),
        # B: session id 0 in both repeats: two different sessions.
        rec(B, 0, 0, 0, "token_salad"), rec(B, 0, 0, 1, "repetition"),
        rec(B, 0, 1, 0), rec(B, 0, 1, 1),
        rec(B, 1, 0, 0), rec(B, 1, 0, 1, "malformed_tool_call"),
        rec(B, 1, 0, 1, attempt=1),  # the re-send came back clean
        # a session that only ever failed in transport; flagged corrupted by mistake: ignored
        rec(B, 1, 1, 0, "transport_error", transport_error="read_timeout: x", corrupted=True),
    ]  # fmt: skip
    return pd.DataFrame(rows)


def test_small_frame_counts() -> None:
    s = analysis.summarize(small_frame(), "r1")
    a, b = s["variants"]
    assert (a["label"], b["label"]) == (A, B)
    assert a["factors"] == {"k": "a"}
    assert (a["sessions"], a["corrupted_sessions"], a["turns"], a["classified_turns"]) == (
        3,
        0,
        6,
        5,
    )
    assert a["transport_errors"] == 1
    assert a["transport_error_rate"] == pytest.approx(1 / 6)
    assert (b["sessions"], b["sessions_seen"], b["corrupted_sessions"]) == (3, 4, 2)
    assert (b["turns"], b["classified_turns"], b["corrupted_turns"]) == (8, 7, 3)
    assert b["retries"] == 1
    assert b["session_corruption_rate"] == pytest.approx(2 / 3)
    assert b["session_corruption_ci"] == pytest.approx(list(stats.wilson(2, 3)))
    assert b["turn_corruption_rate"] == pytest.approx(3 / 7)
    # turns clustered in sessions: the exact interval at the effective sample size
    deff = stats.cluster_design_effect([2, 0, 1], [2, 2, 3])
    assert deff > 1
    assert b["turn_design_effect"] == pytest.approx(deff, abs=1e-4)
    assert b["turn_corruption_ci"] == pytest.approx(list(stats.clustered_interval(3, 7, deff)))
    assert b["labels"] == {"ok_tool_call": 4, "malformed_tool_call": 1, "token_salad": 1,
                           "repetition": 1, "transport_error": 1}  # fmt: skip
    assert b["first_corrupted_turn_median"] == pytest.approx(0.5)  # first bad turns 0 and 1


def test_comparisons_shape_and_values() -> None:
    s = analysis.summarize(small_frame(), "r1")
    assert s["run_id"] == "r1"
    assert s["baseline"] == A
    units = [c["unit"] for c in s["comparisons"]]
    assert units == ["session", "turn"]
    sc, tc = s["comparisons"]
    assert (sc["a"], sc["b"], sc["test"]) == (A, B, "fisher_exact")
    assert sc["p_value"] == pytest.approx(stats.fisher_exact(2, 3, 0, 3))
    assert sc["p_holm"] == pytest.approx(sc["p_value"])  # one comparison: nothing to adjust
    d, lo, hi = stats.diff_ci(2, 3, 0, 3)
    assert sc["diff"] == pytest.approx(d)
    assert sc["diff_ci"] == pytest.approx([lo, hi])
    # turns: Fisher's test on the counts over each arm's design effect
    assert tc["test"] == "fisher_exact_design_effect"
    deff = stats.cluster_design_effect([2, 0, 1], [2, 2, 3])
    assert tc["design_effect_a"] == 1.0
    effective = stats.fisher_exact(round(3 / deff), round(7 / deff), 0, 5)
    assert tc["p_value"] == pytest.approx(effective)
    assert tc["effective_n_b"] == round(7 / deff) < 7
    assert not sc["significant"]
    assert sc["verdict"].startswith("no significant difference between k=b and k=a")
    assert "sessions per variant" in sc["hint"]
    json.dumps(s, allow_nan=False)  # summary.json must be strict JSON


def many(variant: str, sessions: int, bad: int) -> list[dict[str, Any]]:
    return [rec(variant, 0, i, 0, "token_salad" if i < bad else "ok_text") for i in range(sessions)]


def test_verdict_names_the_corrupting_variant_and_holm_adjusts() -> None:
    df = pd.DataFrame(many(A, 40, 0) + many(B, 40, 7) + many(C, 40, 1))
    s = analysis.summarize(df, "r2")
    sess = [c for c in s["comparisons"] if c["unit"] == "session"]
    raw = [c["p_value"] for c in sess]
    assert [c["p_holm"] for c in sess] == pytest.approx(stats.holm(raw))
    b = next(c for c in sess if c["b"] == B)
    assert b["significant"]
    assert b["verdict"].startswith("k=b corrupts more than k=a: 17.5% vs 0.0% of sessions")
    assert "p=" in b["verdict"]
    assert s["verdict"] == b["verdict"]
    c = next(c for c in sess if c["b"] == C)
    assert not c["significant"]
    assert c["sample_size"] == stats.sample_size(1 / 40, 0.0)


def test_verdict_when_baseline_is_worse_and_when_all_clean() -> None:
    s = analysis.summarize(pd.DataFrame(many(A, 40, 9) + many(B, 40, 0)), "r")
    assert s["verdict"].startswith("k=a corrupts more than k=b: 22.5% vs 0.0%")
    clean = analysis.summarize(pd.DataFrame(many(A, 30, 0) + many(B, 30, 0)), "r")
    assert clean["verdict"] == "no corrupted sessions in any variant (60 sessions)"
    assert "upper bound" in clean["comparisons"][0]["hint"]
    single = analysis.summarize(pd.DataFrame(many(A, 10, 1)), "r")
    assert single["comparisons"] == []
    assert single["verdict"].startswith("k=a: 1 of 10 sessions corrupted (10.0%, 95% CI")


def test_variant_order_from_run_json_and_missing_variant() -> None:
    df = pd.DataFrame(many(A, 5, 1) + many(B, 5, 0))
    order = [{"label": B, "factors": {"k": "b"}}, {"label": C, "factors": {"k": "c"}}, A]
    s = analysis.summarize(df, "r", order)
    assert [v["label"] for v in s["variants"]] == [B, C, A]
    assert s["baseline"] == B
    missing = s["variants"][1]
    assert missing["sessions"] == 0
    assert missing["session_corruption_rate"] is None
    assert missing["session_corruption_ci"] == [0.0, 1.0]
    cmp_c = next(c for c in s["comparisons"] if c["b"] == C)
    assert cmp_c["verdict"].startswith("cannot compare")
    assert not cmp_c["significant"]


def test_corrupted_derived_from_label_when_column_missing() -> None:
    df = pd.DataFrame(many(A, 4, 2)).drop(columns=["corrupted"])
    s = analysis.summarize(df, "r")
    assert s["variants"][0]["corrupted_sessions"] == 2


def oracle(lines: list[dict[str, Any]]) -> dict[str, dict[str, int]]:
    """Counts by plain loops, independent of the pandas code."""
    out: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    sessions: dict[str, dict[tuple[int, int], bool]] = defaultdict(dict)
    for r in lines:
        v = out[r["variant"]]
        v["turns"] += 1
        if r["transport_error"]:
            v["transport_errors"] += 1
            continue
        v["classified_turns"] += 1
        v["corrupted_turns"] += bool(r["corrupted"])
        key = (r["repeat"], r["session"])
        sessions[r["variant"]][key] = sessions[r["variant"]].get(key, False) or r["corrupted"]
    for name, ss in sessions.items():
        out[name]["sessions"] = len(ss)
        out[name]["corrupted_sessions"] = sum(ss.values())
    return out


def test_sample_fixture_matches_plain_loops(tmp_path: Path) -> None:
    lines = [json.loads(x) for x in SAMPLE.read_text(encoding="utf-8").splitlines()]
    shutil.copy(SAMPLE, tmp_path / "turns.jsonl")
    run = analysis.load_run(tmp_path)
    s = analysis.summarize(run.turns, run.run_id, run.variants)
    expected = oracle(lines)
    assert [v["label"] for v in s["variants"]] == list(expected)
    for v in s["variants"]:
        for key, value in expected[v["label"]].items():
            assert v[key] == value, (v["label"], key)
    # designed into the fixture: the baseline is clean and bf16 with hicache is worst
    assert s["variants"][0]["corrupted_sessions"] == 0
    assert s["variants"][3]["corrupted_sessions"] == 9
    assert s["variants"][3]["sim_recall"] == 1.0


def test_load_run_reads_meta_metrics_and_skips_torn_line(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="turns.jsonl"):
        analysis.load_run(tmp_path)
    lines = [json.dumps(r) for r in many(A, 3, 1) + many(B, 3, 0)]
    (tmp_path / "turns.jsonl").write_text("\n".join(lines) + '\n{"variant": "k=a", "ses', "utf-8")
    (tmp_path / "run.json").write_text(json.dumps({"run_id": "meta-id", "variants": [B, A]}))
    (tmp_path / "metrics.jsonl").write_text('{"variant": "k=a", "t": 0, "name": "m", "value": 1}\n')
    run = analysis.load_run(tmp_path)
    assert len(run.turns) == 6
    assert run.run_id == "meta-id"
    assert run.variants == [B, A]
    assert run.metrics is not None
    assert list(run.metrics["name"]) == ["m"]


def test_context_and_inflight_buckets() -> None:
    points = [(0, 1), (7999, 2), (8000, 3), (79999, 4), (80000, 7), (250000, 8)]
    rows = [rec(A, 0, i, 0, prompt_tokens=p, inflight=f) for i, (p, f) in enumerate(points)]
    rows[2]["label"], rows[2]["corrupted"] = "repetition", True
    df = analysis.prepare(pd.DataFrame(rows))
    ctx = frames.context_frame(df)
    got = dict(zip(ctx["bucket"].astype(str), ctx["turns"], strict=True))
    assert got == {"0-8k": 2, "8-16k": 1, "72-80k": 1, "80k+": 2}
    assert ctx.loc[ctx["bucket"] == "8-16k", "rate"].item() == 1.0
    inf = frames.inflight_frame(df)
    got = dict(zip(inf["bucket"].astype(str), inf["turns"], strict=True))
    assert got == {"0-1": 1, "2-3": 2, "4-7": 2, "8-15": 1}


def test_label_mix_and_latency_frames() -> None:
    df = analysis.prepare(small_frame())
    mix = frames.label_mix_frame(df, [B, A])
    assert list(mix.index) == [B, A]
    assert mix.sum(axis=1).tolist() == pytest.approx([1.0, 1.0])
    assert mix.loc[A, "transport_error"] == pytest.approx(1 / 6)
    lat = frames.latency_frame(df)
    assert len(lat) == len(df) - 2  # transport errors have no timings worth plotting


def test_write_tidy_parquet_and_csv_fallback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    df = analysis.prepare(small_frame())
    df.at[6, "evidence"] = {"offset": 3, "score": 0.5}
    df["tool_calls"] = [[{"name": "f", "arguments": "{bad"}]] * len(df)
    path = frames.write_tidy(df, tmp_path / "turns")
    assert path.name == "turns.parquet"
    back = pd.read_parquet(path)
    assert len(back) == len(df)
    assert {"factor_k", "content", "evidence_offset", "tool_calls"} <= set(back.columns)
    assert "factors" not in back.columns
    assert back["evidence_offset"].iloc[6] == 3
    assert json.loads(back["tool_calls"].iloc[0]) == [{"name": "f", "arguments": "{bad"}]

    monkeypatch.setattr(frames, "_arrow", lambda: None)
    csv = frames.write_tidy(df, tmp_path / "t2")
    assert csv.name == "t2.csv"
    assert len(pd.read_csv(csv)) == len(df)


def test_verdict_without_any_classified_session() -> None:
    rows = [rec(A, 0, 0, 0, "transport_error", transport_error="connect: refused", corrupted=False)]
    s = analysis.summarize(pd.DataFrame(rows), "r", [A, B])
    assert s["verdict"].startswith("no classified sessions")
    assert s["variants"][0]["transport_errors"] == 1
