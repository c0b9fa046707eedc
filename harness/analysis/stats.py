"""Small-sample statistics for corruption rates.

Corruption counts are small (often 0 to a few dozen events), so every interval here is a score
interval (Wilson, Newcombe) or an exact one (Clopper-Pearson) rather than the normal
approximation, and every test is exact.

Turns are clustered in sessions (a session's turns share its context, its server state, its
history), so a rate over turns varies more than a binomial's of as many independent turns. The
ratio of the two variances, the design effect, is estimated from the sessions' counts
(``cluster_design_effect``); an interval of a turn rate uses the effective sample size
(``clustered_interval``), a comparison of two divides each arm's counts by its design effect
(``clustered_fisher``, Rao and Scott's correction), and the planner inflates the turns a
variant needs by it (``turns_needed``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import cache
from types import ModuleType
from typing import Literal

Alternative = Literal["two-sided", "greater", "less"]


@cache
def _scipy() -> ModuleType:
    """scipy.stats, imported at the first statistic (0.6 s of imports): a run's first
    request does not wait for it, nor ``harness --help``."""
    from scipy import stats

    return stats  # type: ignore[no-any-return]


def _z(conf: float) -> float:
    if not 0.0 < conf < 1.0:
        raise ValueError(f"confidence level must be between 0 and 1, got {conf}")
    return float(_scipy().norm.ppf(1.0 - (1.0 - conf) / 2.0))


def _check_counts(k: float, n: float) -> None:
    if n < 0 or k < 0 or k > n:
        raise ValueError(f"need 0 <= k <= n, got k={k}, n={n}")


def wilson(k: float, n: float, conf: float = 0.95) -> tuple[float, float]:
    """Wilson score interval for the proportion k/n (no continuity correction).

    With n == 0 nothing is known and the interval is the whole range (0.0, 1.0).
    """
    _check_counts(k, n)
    if n == 0:
        return (0.0, 1.0)
    z = _z(conf)
    p = k / n
    z2 = z * z
    denom = 1.0 + z2 / n
    centre = (p + z2 / (2 * n)) / denom
    half = z * math.sqrt(p * (1.0 - p) / n + z2 / (4 * n * n)) / denom
    # Clamp away floating-point dust at the edges (k == 0 gives lo == 0 exactly in theory).
    lo = 0.0 if k == 0 else max(0.0, centre - half)
    hi = 1.0 if k == n else min(1.0, centre + half)
    return (lo, hi)


def fisher_exact(
    k1: int, n1: int, k2: int, n2: int, alternative: Alternative = "two-sided"
) -> float:
    """Fisher's exact test p-value for k1/n1 against k2/n2.

    ``alternative="greater"`` tests whether the first proportion is larger than the second.
    """
    _check_counts(k1, n1)
    _check_counts(k2, n2)
    if n1 == 0 or n2 == 0:
        return 1.0
    table = [[k1, n1 - k1], [k2, n2 - k2]]
    res = _scipy().fisher_exact(table, alternative=alternative)
    return float(min(1.0, res.pvalue))


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm-Bonferroni adjusted p-values, in the input order.

    Step-down: the i-th smallest of m p-values is multiplied by (m - i), running maximum taken
    so the adjusted values keep the order of the raw ones, capped at 1.
    """
    m = len(pvalues)
    order = sorted(range(m), key=lambda i: pvalues[i])
    adjusted = [0.0] * m
    running = 0.0
    for rank, idx in enumerate(order):
        value = min(1.0, (m - rank) * pvalues[idx])
        running = max(running, value)
        adjusted[idx] = running
    return adjusted


def diff_ci(
    k1: float, n1: float, k2: float, n2: float, conf: float = 0.95
) -> tuple[float, float, float]:
    """Difference p1 - p2 with Newcombe's hybrid score interval (his method 10, 1998).

    Built from the two Wilson intervals (l1, u1) and (l2, u2):
        lo = d - sqrt((p1 - l1)^2 + (u2 - p2)^2)
        hi = d + sqrt((u1 - p1)^2 + (p2 - l2)^2)
    An empty arm contributes p = 0 with the interval (0, 1).
    """
    p1 = k1 / n1 if n1 else 0.0
    p2 = k2 / n2 if n2 else 0.0
    l1, u1 = wilson(k1, n1, conf)
    l2, u2 = wilson(k2, n2, conf)
    d = p1 - p2
    lo = d - math.sqrt((p1 - l1) ** 2 + (u2 - p2) ** 2)
    hi = d + math.sqrt((u1 - p1) ** 2 + (p2 - l2) ** 2)
    return (d, max(-1.0, lo), min(1.0, hi))


def sample_size(p1: float, p2: float, alpha: float = 0.05, power: float = 0.8) -> int:
    """Sessions per arm for a two-sided two-proportion test to detect p1 against p2.

    The usual normal-approximation formula (Fleiss, without continuity correction):

        n = (z_{1-alpha/2} * sqrt(2 * pbar * (1 - pbar))
             + z_{power} * sqrt(p1 * (1 - p1) + p2 * (1 - p2)))^2 / (p1 - p2)^2

    with pbar = (p1 + p2) / 2, rounded up. Raises ValueError when p1 == p2 (no finite n).
    """
    for name, p in (("p1", p1), ("p2", p2)):
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"{name} must be a proportion in [0, 1], got {p}")
    if p1 == p2:
        raise ValueError("p1 == p2: no sample size detects a zero difference")
    za = float(_scipy().norm.ppf(1.0 - alpha / 2.0))
    zb = float(_scipy().norm.ppf(power))
    pbar = (p1 + p2) / 2.0
    num = za * math.sqrt(2.0 * pbar * (1.0 - pbar)) + zb * math.sqrt(
        p1 * (1.0 - p1) + p2 * (1.0 - p2)
    )
    return max(1, math.ceil(num * num / ((p1 - p2) ** 2)))


def upper_bound_zero(n: int, conf: float = 0.95) -> float:
    """Exact upper bound on a rate when 0 of n trials showed it: 1 - (1 - conf)^(1/n).

    About 3/n at 95% (the "rule of three"). n == 0 gives 1.0.
    """
    if n <= 0:
        return 1.0
    return float(1.0 - (1.0 - conf) ** (1.0 / n))


def clopper_pearson(k: int, n: int, conf: float = 0.95) -> tuple[float, float]:
    """The exact (Clopper-Pearson) interval for k events in n trials: never narrower than the
    truth, at the rates of a few in 10,000 where a score interval's coverage dips."""
    _check_counts(k, n)
    return clopper_pearson_real(k, n, conf)


def design_effect(turns_per_session: float, icc: float) -> float:
    """How much turns clustered in sessions inflate a rate's variance (Kish):
    ``1 + (m - 1) * icc`` for ``m`` turns a session and intra-session correlation ``icc``."""
    if not 0.0 <= icc <= 1.0:
        raise ValueError(f"icc must be in [0, 1], got {icc}")
    return 1.0 + max(0.0, turns_per_session - 1.0) * icc


def turns_needed(
    rate: float,
    baseline: float,
    *,
    alpha: float = 0.05,
    power: float = 0.8,
    turns_per_session: float = 1.0,
    icc: float = 0.0,
    false_alarm: float = 0.0,
) -> dict[str, float | int]:
    """Turns and sessions each variant needs for a two-sided test to tell a corruption rate of
    ``rate`` from ``baseline`` with ``power``.

    What a run observes is the true rate plus the verdict's false alarms on the clean turns
    (``false_alarm``, the share of clean turns it flags): both rates are shifted by it, which
    shrinks their relative difference. The turns an independent-turn test needs
    (``sample_size``) are inflated by the design effect of ``turns_per_session`` turns
    correlated within a session (``icc``: 0 for independent turns, 1 for a session whose
    turns are all alike), and the sessions are those turns over the turns a session makes.
    """
    observed = [p + false_alarm * (1.0 - p) for p in (baseline, rate)]
    independent = sample_size(observed[1], observed[0], alpha=alpha, power=power)
    deff = design_effect(turns_per_session, icc)
    turns = math.ceil(independent * deff)
    return {
        "turns": turns,
        "sessions": math.ceil(turns / max(1.0, turns_per_session)),
        "independent_turns": independent,
        "design_effect": round(deff, 4),
        "observed_baseline": observed[0],
        "observed_rate": observed[1],
    }


def cluster_design_effect(events: Sequence[float], turns: Sequence[float]) -> float:
    """The design effect of a rate of events over turns clustered in sessions, estimated from
    each session's events and turns: the variance of the ratio estimator (sessions as the
    sampled units) over the binomial variance of as many independent turns; at least 1 (a
    rate from fewer than two sessions, or of 0 or 1, gets 1)."""
    if len(events) != len(turns):
        raise ValueError("one count of events and one of turns per session")
    total = float(sum(turns))
    if len(turns) < 2 or total <= 0:
        return 1.0
    p = float(sum(events)) / total
    if p <= 0.0 or p >= 1.0:
        return 1.0
    s = len(turns)
    spread = sum((k - p * m) ** 2 for k, m in zip(events, turns, strict=True))
    clustered = s / (s - 1) * spread / (total * total)
    return max(1.0, clustered / (p * (1.0 - p) / total))


def clustered_interval(k: int, n: int, deff: float, conf: float = 0.95) -> tuple[float, float]:
    """The exact (Clopper-Pearson) interval of k events in n clustered turns, at the effective
    sample size n / deff (Korn and Graubard, 1998): the plain exact interval when deff is 1."""
    _check_counts(k, n)
    if deff < 1.0:
        raise ValueError(f"a design effect is at least 1, got {deff}")
    return clopper_pearson_real(k / deff, n / deff, conf)


def clopper_pearson_real(k: float, n: float, conf: float = 0.95) -> tuple[float, float]:
    """``clopper_pearson`` for effective (non-integer) counts, 0 <= k <= n."""
    if n <= 0:
        return (0.0, 1.0)
    if not 0.0 <= k <= n:
        raise ValueError(f"need 0 <= k <= n, got k={k}, n={n}")
    a = (1.0 - conf) / 2.0
    beta = _scipy().beta
    lo = 0.0 if k == 0 else float(beta.ppf(a, k, n - k + 1))
    hi = 1.0 if k == n else float(beta.ppf(1.0 - a, k + 1, n - k))
    return (lo, hi)


def effective_counts(k: int, n: int, deff: float) -> tuple[int, int]:
    """k and n divided by the design effect (Rao and Scott, 1992), rounded; a non-empty arm
    keeps at least one turn."""
    if n <= 0:
        return 0, 0
    ne = max(1, round(n / deff))
    return min(ne, round(k / deff)), ne


def clustered_fisher(
    k1: int, n1: int, deff1: float, k2: int, n2: int, deff2: float
) -> tuple[float, tuple[int, int, int, int]]:
    """Two rates of events over turns clustered in sessions compared: Fisher's exact test on
    each arm's counts divided by its design effect (Rao and Scott's first-order correction:
    a test on independent turns at the effective sample sizes). The p-value, and the
    effective counts (k1, n1, k2, n2)."""
    ke1, ne1 = effective_counts(k1, n1, deff1)
    ke2, ne2 = effective_counts(k2, n2, deff2)
    return fisher_exact(ke1, ne1, ke2, ne2), (ke1, ne1, ke2, ne2)
