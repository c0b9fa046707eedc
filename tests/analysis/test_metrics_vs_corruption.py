"""Server metrics beside the corruption rate: the bins, the correlation, the plot."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from harness.analysis import metrics_vs_corruption as mvc
from harness.report import plots

START = 1_796_000_000.0


def _frames() -> tuple[pd.DataFrame, pd.DataFrame]:
    """120 s of turns whose corruption climbs after 60 s, while the speculative acceptance
    (scraped every 5 s) collapses; the host tier fills steadily."""
    turns, metrics = [], []
    for i in range(240):
        t = i * 0.5
        bad = t > 60 and i % 3 == 0
        turns.append({"variant": "v", "repeat": 0, "sent_at": START + t,
                      "is_transport": False, "is_corrupted": bad})  # fmt: skip
    for k in range(25):
        t = k * 5.0
        accept = 0.7 if t <= 60 else 0.15
        for name, value in (("spec_accept_rate", accept), ("hicache_host_used_tokens", 1e3 * k)):
            metrics.append({"variant": "v", "repeat": 0, "t": t + 3.0, "wall": START + t,
                            "name": name, "value": value})  # fmt: skip
    metrics.append({"variant": "v", "repeat": 0, "t": 1.0, "wall": START, "name": "other",
                    "value": 1.0})  # fmt: skip
    return pd.DataFrame(turns), pd.DataFrame(metrics)


def test_bins_line_the_two_clocks_up_and_the_correlation_has_the_right_sign() -> None:
    turns, metrics = _frames()
    frame = mvc.binned(turns, metrics)
    assert set(frame["metric"]) == {"spec_accept_rate", "hicache_host_used_tokens"}
    accept = frame[frame["metric"] == "spec_accept_rate"].sort_values("t")
    # the wall clock places the scrapes: the first half of the bins saw the high acceptance
    assert accept["value"].iloc[0] == 0.7
    assert accept["value"].iloc[-1] == 0.15
    assert accept["rate"].iloc[0] == 0.0
    assert accept["rate"].iloc[-1] > 0.2
    corr = mvc.correlations(frame)["v"]
    assert corr["spec_accept_rate"]["spearman"] < -0.8
    assert corr["spec_accept_rate"]["p_value"] < 0.01
    assert corr["spec_accept_rate"]["bins"] == mvc.BINS
    assert corr["hicache_host_used_tokens"]["spearman"] > 0.5


def test_too_little_to_correlate_says_none() -> None:
    turns, metrics = _frames()
    few = mvc.correlations(mvc.binned(turns.iloc[:20], metrics))
    assert few["v"]["spec_accept_rate"]["spearman"] is None  # corruption never moved
    assert mvc.binned(turns, None).empty
    assert mvc.binned(turns, metrics[metrics["name"] == "other"]).empty


def test_the_plot_relates_only_what_moves_beside_corruption(tmp_path: Path) -> None:
    """A variant with no corrupted turn and a metric that never moves are said, not drawn
    (an all-zero rate, a flat line); nothing left to relate: no plot."""
    turns, metrics = _frames()
    clean_turns = turns.assign(variant="clean", is_corrupted=False)
    clean_metrics = metrics.assign(variant="clean")
    flat = metrics[metrics["name"] == "spec_accept_rate"].assign(name="cache_usage", value=0.5)
    frame = mvc.binned(pd.concat([turns, clean_turns]), pd.concat([metrics, clean_metrics, flat]))
    names, variants, left = plots.related(frame)
    assert names == ["spec_accept_rate", "hicache_host_used_tokens"]
    assert variants == ["v"]
    assert left == ["no corrupted turn: clean", "constant: KV cache in use"]
    path = plots.plot_metrics_vs_corruption(frame, tmp_path / "m.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    clean = mvc.binned(clean_turns, clean_metrics)
    assert plots.related(clean)[0] == []
    with pytest.raises(ValueError, match="no watched metric moves"):
        plots.plot_metrics_vs_corruption(clean, tmp_path / "none.png")
