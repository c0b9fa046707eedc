"""The load as asked, sent and seen by the server, per variant."""

from __future__ import annotations

import pandas as pd

from harness.analysis.load import load_lines, load_seen, short_variants


def _turns(variant: str, inflight: int, n: int = 100) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "variant": variant,
            "repeat": 0,
            "session": [i % 40 for i in range(n)],
            "sent_at": [1000.0 + i / 10 for i in range(n)],
            "inflight": inflight,
        }
    )


def _metrics(variant: str, running: float, n: int = 10) -> pd.DataFrame:
    rows = []
    for i in range(n):
        wall = 999.0 + i
        rows.append({"variant": variant, "wall": wall, "name": "running", "value": running})
        rows.append({"variant": variant, "wall": wall, "name": "queued", "value": 0.0})
    rows.append({"variant": variant, "wall": 5000.0, "name": "running", "value": 0.0})  # after
    return pd.DataFrame(rows)


def test_the_shortfall_is_the_server_s_median_against_what_was_asked() -> None:
    turns = pd.concat([_turns("a", 40), _turns("b", 40)])
    metrics = pd.concat([_metrics("a", 38.0), _metrics("b", 20.0)])
    seen = load_seen(turns, metrics, asked=40)
    assert seen["a"]["asked"] == 40
    assert seen["a"]["harness_inflight_p50"] == 40
    assert seen["a"]["server_running_p50"] == 38
    assert seen["a"]["shortfall"] == 0.05
    assert seen["b"]["shortfall"] == 0.5
    assert seen["a"]["server_samples"] == 8  # only the steady state's scrapes
    assert short_variants(seen) == ["b"]
    summary = {"variants": [{"label": k, "load": v} for k, v in seen.items()], "load_short": ["b"]}
    text = "\n".join(load_lines(summary))
    assert "ran fewer requests than asked in b" in text
    assert "| a | 40 | 40.0 | 38.0 | 0.0 | 5% |" in text


def test_without_server_metrics_the_harness_count_is_given_alone() -> None:
    seen = load_seen(_turns("a", 12), None, asked=64)
    assert seen["a"]["asked"] == 40  # no more in flight than there are sessions
    assert seen["a"]["shortfall"] is None
    assert short_variants(seen) == []
