"""The plots answer their questions: intervals only where a bucket has turns enough, counts
on the bars, corrupted labels on their own scale, server metrics without duplicates."""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd
import pytest

from harness.analysis import frames
from harness.analysis import summary as analysis
from harness.report import plots


def _turns(rows: list[tuple[str, int, int, bool]]) -> pd.DataFrame:
    """(variant, prompt tokens, in flight, corrupted) -> the analysis frame."""
    recs = [
        {"variant": v, "session": i, "turn": 0, "label": "token_salad" if bad else "ok_tool_call",
         "corrupted": bad, "prompt_tokens": tokens, "inflight": inflight, "sent_at": 100.0 + i,
         "content": "x"}
        for i, (v, tokens, inflight, bad) in enumerate(rows)
    ]  # fmt: skip
    return analysis.prepare(pd.DataFrame.from_records(recs))


def test_buckets_with_few_turns_get_no_interval_and_do_not_set_the_scale() -> None:
    rows = [("bf16", 1000, 40, False)] * 3  # 3 turns in the first bucket: no interval
    rows += [("bf16", 70_000, 40, i < 20) for i in range(1000)]  # 2% of 1,000 turns
    frame = frames.context_frame(_turns(rows))
    fig = plots.bucket_figure(frame, "t", "x")
    ax, counts = fig.axes[0], fig.axes[1]
    texts = [t.get_text().strip() for t in ax.texts]
    assert "0/3" in texts
    assert "20/1000" in texts
    # whiskers: one interval (the big bucket); the 3-turn bucket would reach 56%
    assert len(ax.containers) >= 1
    assert ax.get_ylim()[1] < 0.1
    assert [round(p.get_height()) for p in counts.patches] == [3, 1000]
    plt.close(fig)


def test_corrupted_labels_get_their_own_scale() -> None:
    counts = pd.DataFrame(
        {"ok_tool_call": [990, 1000], "token_salad": [10, 0]}, index=["bf16", "fp8"]
    )
    fig = plots.label_mix_figure(counts)
    _, right = fig.axes[:2]
    assert right.get_xlim()[1] < 0.05  # 1% is drawn wide, not as a sliver of 100%
    assert any("10 of 1,000 turns (1.0%)" in t.get_text() for t in right.texts)
    plt.close(fig)


def test_server_metrics_drop_duplicates_and_all_zero_series() -> None:
    rows = []
    for t in range(5):
        rows += [
            {"variant": "a", "t": t, "name": "running", "value": 40 + t},
            {"variant": "a", "t": t, "name": "sglang:num_running_reqs", "value": 40 + t},
            {"variant": "a", "t": t, "name": "queued", "value": 0},
            {"variant": "a", "t": t, "name": "sglang:num_queue_reqs", "value": 0},
            {"variant": "a", "t": t, "name": "cache_usage", "value": 0.1 * t},
        ]
    keep, zero = plots.metric_panels(pd.DataFrame(rows))
    assert keep == ["running", "cache_usage"]
    assert zero == ["queued"]


def test_a_constant_series_is_said_not_drawn_and_a_rate_far_from_zero_keeps_its_dip() -> None:
    rows = []
    for t in range(5):
        rows += [
            {"variant": "a", "t": t, "name": "sglang:hicache_host_total_tokens", "value": 1e8},
            {"variant": "a", "t": t, "name": "spec_accept_rate", "value": 0.7 - 0.011 * (t == 2)},
        ]
    frame = pd.DataFrame(rows)
    keep, left_out = plots.metric_panels(frame)
    assert keep == ["spec_accept_rate"]
    assert left_out == ["sglang:hicache_host_total_tokens = 1e+08"]
    accept = frame[frame["name"] == "spec_accept_rate"]["value"]
    assert plots.far_from_zero(accept)  # its axis does not start at 0: the dip shows
    assert not plots.far_from_zero(pd.Series([0.0, 0.2, 0.9]))
    title, unit, percent = plots.metric_title("spec_accept_rate")
    assert (title, percent) == ("Speculative acceptance rate", True)
    assert plots.metric_title("some:metric")[1] == ""  # never "value"


def test_the_rate_axis_follows_the_rates() -> None:
    assert plots.rate_axis_top([(0.0, 0.003), (0.002, 0.011)]) == pytest.approx(0.0143)
    assert plots.rate_axis_top([(0.5, 0.9)]) == 1.0


def test_corruption_events_on_the_variants_time_axis(tmp_path: Path) -> None:
    df = _turns([("a", 1000, 1, False), ("a", 1000, 1, True), ("b", 1000, 1, True)])
    ev = frames.corruption_events(df)
    assert list(ev["variant"]) == ["a", "b"]
    assert list(ev["t"]) == [pytest.approx(1.0), pytest.approx(0.0)]
    metrics = pd.DataFrame(
        [{"variant": v, "t": t, "name": "running", "value": 3 + t} for v in "ab" for t in range(4)]
    )
    path = plots.plot_metrics(metrics, tmp_path / "m.png", ev)
    assert path.read_bytes()[:4] == b"\x89PNG"
    with pytest.raises(ValueError, match="constant"):
        plots.plot_metrics(metrics.assign(value=0), tmp_path / "z.png", ev)
