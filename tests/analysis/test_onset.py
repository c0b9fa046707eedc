"""The cumulative test over turns: from which turn a comparison stays significant."""

from __future__ import annotations

import numpy as np
import pandas as pd

from harness.analysis.onset import completion_order, sentence, significant_from
from harness.analysis.stats import clustered_fisher, fisher_exact


def _verdicts(n: int, at: list[int]) -> np.ndarray:
    out = np.zeros(n, dtype=bool)
    out[at] = True
    return out


def test_significant_from_the_turn_after_which_every_look_is() -> None:
    base = _verdicts(10_000, [])
    other = _verdicts(10_000, [500, 1_500, 2_500, 3_500, 4_500, 5_500, 6_500, 7_500])
    onset = significant_from(base, other, 0.05)
    at = onset["significant_from_turn"]
    assert at is not None
    # exactly at an event: the first count whose test is significant (6 against 0 here)
    assert at == 5_501
    assert fisher_exact(6, at, 0, at) < 0.05 <= fisher_exact(5, at - 1, 0, at - 1)
    assert onset["turns_compared"] == 10_000
    assert onset["p_at_end"] == fisher_exact(8, 10_000, 0, 10_000)
    line = sentence({"a": "base", "b": "other", "onset": onset})
    assert line is not None
    assert "from turn 5,501" in line


def test_a_difference_that_fades_has_no_onset() -> None:
    base = _verdicts(4_000, [3_000, 3_100, 3_200, 3_300, 3_400, 3_500])
    other = _verdicts(5_000, [10, 20, 30, 40, 50, 60, 70])  # only the first 4,000 are compared
    onset = significant_from(base, other, 0.05)
    assert onset["turns_compared"] == 4_000
    assert onset["significant_from_turn"] is None
    assert "not significant" in (sentence({"a": "b0", "b": "b1", "onset": onset}) or "")


def test_completion_order_is_sent_plus_latency() -> None:
    turns = pd.DataFrame({
        "sent_at": [0.0, 1.0, 2.0],
        "latency_s": [5.0, 0.5, np.nan],
        "is_corrupted": [True, False, False],
    })  # fmt: skip
    assert completion_order(turns).tolist() == [False, False, True]
    assert significant_from(np.zeros(0, bool), completion_order(turns), 0.05)["looks"] == 0


def test_turns_clustered_in_sessions_take_longer_to_be_significant() -> None:
    """The onset uses the comparison's own test: counts divided by each arm's design effect."""
    base = _verdicts(10_000, [])
    other = _verdicts(10_000, [500, 1_500, 2_500, 3_500, 4_500, 5_500, 6_500, 7_500])
    plain = significant_from(base, other, 0.05)
    clustered = significant_from(base, other, 0.05, deff_base=1.4, deff_other=1.4)
    # 8 events at a design effect of 1.4 count as 6 (8 / 1.4 rounded): still significant at
    # the end, from a later turn
    assert clustered["p_at_end"] == clustered_fisher(8, 10_000, 1.4, 0, 10_000, 1.4)[0]
    assert plain["p_at_end"] < clustered["p_at_end"] < 0.05
    assert clustered["significant_from_turn"] > plain["significant_from_turn"]
    assert significant_from(base, other, 0.05, 2.0, 2.0)["significant_from_turn"] is None
