"""How many turns a comparison took to become significant: the cumulative test over turns.

Each variant's classified turns are put in their completion order (``sent_at`` plus
``latency_s``); after its first ``n`` turns and the baseline's first ``n``, the headline counts
so far are compared with the test the comparison itself uses: Fisher's (two-sided) on each
arm's counts divided by its turn design effect (``stats.clustered_fisher``; the design effect
each variant shows over the whole run, turns being clustered in sessions; 1 gives the plain
test). ``significant_from_turn`` is the smallest ``n`` from
which every later look stays significant up to the last turn both variants have, or None
when the comparison is not significant at the end.

The looks are taken at every turn where either variant's count grows (where the p-value
moves; between them it barely does, the counts fixed and both sides growing alike) and at
``GRID`` evenly spaced turns, so the turn named is exact at the events and within
``n / GRID`` turns elsewhere. This describes a finished run; it is not a stopping rule (so
many looks would inflate a false "significant"): ``--until-significant`` splits alpha over
its looks for that.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from harness.analysis import stats

GRID = 200


def completion_order(turns: pd.DataFrame) -> np.ndarray:
    """The headline verdicts (``is_corrupted``) of ``turns`` in the order they completed."""
    if not len(turns):
        return np.zeros(0, dtype=bool)
    sent = turns["sent_at"].astype(float)
    done = sent + turns["latency_s"].astype(float).fillna(0.0)
    order = np.lexsort((np.arange(len(turns)), sent.fillna(0.0).to_numpy(),
                        done.fillna(0.0).to_numpy()))  # fmt: skip
    verdicts: np.ndarray = turns["is_corrupted"].to_numpy(dtype=bool)[order]
    return verdicts


def significant_from(
    base: np.ndarray,
    other: np.ndarray,
    alpha: float,
    deff_base: float = 1.0,
    deff_other: float = 1.0,
) -> dict[str, Any]:
    """The cumulative test of ``other``'s verdicts against ``base``'s (both in completion
    order, each with its turn design effect): the turns compared, ``significant_from_turn``
    (None: not significant at the end), the p-value after the last turn, and how many looks
    were taken."""
    n = int(min(len(base), len(other)))
    out: dict[str, Any] = {"turns_compared": n, "significant_from_turn": None,
                           "p_at_end": None, "looks": 0, "alpha": alpha}  # fmt: skip
    if n == 0:
        return out
    a, b = base[:n], other[:n]
    ka, kb = np.cumsum(a), np.cumsum(b)
    events = np.flatnonzero(a | b)
    grid = np.linspace(0, n - 1, num=min(GRID, n)).round().astype(int)
    looks = np.unique(np.concatenate([events, grid, [n - 1]]))
    p = np.array(
        [
            stats.clustered_fisher(int(kb[i]), i + 1, deff_other, int(ka[i]), i + 1, deff_base)[0]
            for i in looks
        ]
    )
    out.update(p_at_end=float(p[-1]), looks=int(len(looks)))
    if p[-1] >= alpha:
        return out
    above = np.flatnonzero(p >= alpha)
    first = looks[above[-1] + 1] if len(above) else looks[0]
    out["significant_from_turn"] = int(first) + 1
    return out


def sentence(c: dict[str, Any]) -> str | None:
    """The comparison's onset in words (None when it has none)."""
    onset = c.get("onset")
    if not onset or not onset["turns_compared"]:
        return None
    n, at = onset["turns_compared"], onset["significant_from_turn"]
    level = f"p < {onset['alpha']:.3g}"
    if at is None:
        return (
            f"{c['b']} against {c['a']}: not significant ({level}) after {n:,} turns each "
            f"(p = {onset['p_at_end']:.2g})"
        )
    return (
        f"{c['b']} against {c['a']}: the turn rates are significantly different ({level}) "
        f"from turn {at:,} of each variant on, in completion order, to the last of {n:,} "
        f"compared ({onset['looks']} looks: every corrupted turn and {GRID} evenly spaced)"
    )
