from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st
from scipy.stats import binomtest
from scipy.stats import fisher_exact as scipy_fisher

from harness.analysis.stats import (
    diff_ci,
    fisher_exact,
    holm,
    sample_size,
    upper_bound_zero,
    wilson,
)

# Newcombe (1998), "Two-sided confidence intervals for the single proportion", Table I,
# method 3 (Wilson score without continuity correction).
WILSON_PUBLISHED = [
    ((81, 263), (0.2553, 0.3662)),
    ((15, 148), (0.0624, 0.1605)),
    ((0, 20), (0.0, 0.1611)),
    ((1, 29), (0.0061, 0.1718)),
]

# Newcombe (1998), "Interval estimation for the difference between independent proportions",
# Table II, method 10 (hybrid score interval).
NEWCOMBE_PUBLISHED = [
    ((56, 70, 48, 80), (0.0524, 0.3339)),
    ((9, 10, 3, 10), (0.1705, 0.8090)),
    ((6, 7, 2, 7), (0.0582, 0.8062)),
    ((5, 56, 0, 29), (-0.0381, 0.1926)),
    ((0, 10, 0, 20), (-0.1611, 0.2775)),
    ((10, 10, 0, 20), (0.6791, 1.0)),
    ((10, 10, 0, 10), (0.6075, 1.0)),
]


@pytest.mark.parametrize(("kn", "expected"), WILSON_PUBLISHED)
def test_wilson_matches_published_values(
    kn: tuple[int, int], expected: tuple[float, float]
) -> None:
    lo, hi = wilson(*kn)
    assert lo == pytest.approx(expected[0], abs=5e-5)
    assert hi == pytest.approx(expected[1], abs=5e-5)


@given(st.integers(1, 500).flatmap(lambda n: st.tuples(st.integers(0, n), st.just(n))))
def test_wilson_matches_scipy(kn: tuple[int, int]) -> None:
    k, n = kn
    ci = binomtest(k, n).proportion_ci(confidence_level=0.95, method="wilson")
    lo, hi = wilson(k, n)
    assert lo == pytest.approx(ci.low, abs=1e-9)
    assert hi == pytest.approx(ci.high, abs=1e-9)
    assert 0.0 <= lo <= k / n <= hi <= 1.0


def test_wilson_empty_and_bad_counts() -> None:
    assert wilson(0, 0) == (0.0, 1.0)
    with pytest.raises(ValueError, match="k <= n"):
        wilson(3, 2)
    with pytest.raises(ValueError, match="confidence"):
        wilson(1, 2, conf=1.5)


def test_wilson_wider_at_higher_confidence() -> None:
    lo95, hi95 = wilson(7, 40)
    lo99, hi99 = wilson(7, 40, conf=0.99)
    assert lo99 < lo95
    assert hi99 > hi95


@pytest.mark.parametrize(("args", "expected"), NEWCOMBE_PUBLISHED)
def test_diff_ci_matches_newcombe(
    args: tuple[int, int, int, int], expected: tuple[float, float]
) -> None:
    d, lo, hi = diff_ci(*args)
    k1, n1, k2, n2 = args
    assert d == pytest.approx(k1 / n1 - k2 / n2)
    assert lo == pytest.approx(expected[0], abs=5e-5)
    assert hi == pytest.approx(expected[1], abs=5e-5)


def test_diff_ci_is_antisymmetric() -> None:
    d, lo, hi = diff_ci(3, 40, 9, 35)
    d2, lo2, hi2 = diff_ci(9, 35, 3, 40)
    assert d == pytest.approx(-d2)
    assert lo == pytest.approx(-hi2)
    assert hi == pytest.approx(-lo2)


@pytest.mark.parametrize(
    "args", [(0, 40, 7, 40), (7, 40, 0, 40), (3, 10, 3, 10), (1, 100, 20, 60), (0, 5, 0, 5)]
)
def test_fisher_matches_scipy(args: tuple[int, int, int, int]) -> None:
    k1, n1, k2, n2 = args
    table = [[k1, n1 - k1], [k2, n2 - k2]]
    assert fisher_exact(*args) == pytest.approx(scipy_fisher(table).pvalue)
    assert fisher_exact(*args, alternative="greater") == pytest.approx(
        scipy_fisher(table, alternative="greater").pvalue
    )


def test_fisher_known_value_and_direction() -> None:
    # 7/40 against 0/40: only the two extreme tables (7|0 and 0|7), each C(40,7)/C(80,7).
    p = fisher_exact(7, 40, 0, 40)
    assert p == pytest.approx(0.011738, abs=5e-6)
    assert fisher_exact(7, 40, 0, 40, alternative="greater") < 0.01
    assert fisher_exact(0, 40, 7, 40, alternative="greater") == pytest.approx(1.0)
    assert fisher_exact(0, 0, 3, 10) == 1.0


def test_holm_known_values() -> None:
    # Sorted 0.005, 0.01, 0.03, 0.04 times 4, 3, 2, 1 -> 0.02, 0.03, 0.06, 0.04 -> max-acc 0.06.
    assert holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert holm([]) == []
    assert holm([0.2]) == [0.2]
    assert holm([0.6, 0.7]) == [1.0, 1.0]


@given(st.lists(st.floats(0.0, 1.0), min_size=1, max_size=12))
def test_holm_properties(ps: list[float]) -> None:
    adj = holm(ps)
    m = len(ps)
    for raw, a in zip(ps, adj, strict=True):
        assert raw <= a + 1e-12
        assert a <= min(1.0, m * raw) + 1e-12
    order = sorted(range(m), key=lambda i: ps[i])
    assert all(adj[order[i]] <= adj[order[i + 1]] for i in range(m - 1))


def test_sample_size_known_values() -> None:
    # Fleiss without continuity correction: 5% vs 10% needs 435 per arm (alpha .05, power .8).
    assert sample_size(0.05, 0.10) == 435
    assert sample_size(0.10, 0.05) == 435
    assert sample_size(0.65, 0.85) == 73
    # Higher power needs more.
    assert sample_size(0.05, 0.10, power=0.9) > 435
    with pytest.raises(ValueError, match="zero difference"):
        sample_size(0.1, 0.1)
    with pytest.raises(ValueError, match="proportion"):
        sample_size(1.2, 0.1)


def test_sample_size_simulated_power() -> None:
    """The formula's n gives roughly the promised power under an exact test (a rough check)."""
    import numpy as np

    rng = np.random.default_rng(7)
    n = sample_size(0.30, 0.10)
    hits = 0
    reps = 300
    for _ in range(reps):
        k1 = int(rng.binomial(n, 0.30))
        k2 = int(rng.binomial(n, 0.10))
        hits += fisher_exact(k1, n, k2, n) < 0.05
    # Fisher is conservative, so a little below 0.8 is expected; far below means a bad formula.
    assert 0.65 < hits / reps < 0.95


def test_upper_bound_zero_rule_of_three() -> None:
    assert upper_bound_zero(0) == 1.0
    assert upper_bound_zero(100) == pytest.approx(3 / 100, rel=0.02)
    assert upper_bound_zero(20) == pytest.approx(1 - 0.05 ** (1 / 20))
    assert not math.isnan(upper_bound_zero(1))


def test_clopper_pearson_is_exact_and_covers_the_wilson_interval() -> None:
    from harness.analysis.stats import clopper_pearson, wilson

    assert clopper_pearson(0, 10_000)[0] == 0.0
    assert clopper_pearson(0, 10_000)[1] == pytest.approx(3.69e-4, rel=0.01)  # ~ the rule of 3
    lo, hi = clopper_pearson(3, 10_000)
    assert lo == pytest.approx(6.19e-5, rel=0.01)
    assert hi == pytest.approx(8.77e-4, rel=0.01)
    assert lo <= wilson(3, 10_000)[0]  # wider than the score interval where it undercovers
    assert clopper_pearson(5, 5)[1] == 1.0


def test_turns_needed_grows_with_false_alarms_and_clustering() -> None:
    from harness.analysis.stats import design_effect, sample_size, turns_needed

    plain = turns_needed(3e-4, 1e-4)
    assert plain["turns"] == sample_size(3e-4, 1e-4)
    assert plain["sessions"] == plain["turns"]
    assert 70_000 < plain["turns"] < 90_000  # per variant, at 80% power and alpha 0.05
    noisy = turns_needed(3e-4, 1e-4, false_alarm=1e-3)
    assert noisy["turns"] > 5 * plain["turns"]
    clustered = turns_needed(3e-4, 1e-4, turns_per_session=27, icc=0.05)
    assert clustered["design_effect"] == pytest.approx(design_effect(27, 0.05)) == 2.3
    assert clustered["turns"] == pytest.approx(plain["turns"] * 2.3, abs=1)
    assert clustered["sessions"] == -(-clustered["turns"] // 27)


def test_the_design_effect_of_turns_clustered_in_sessions() -> None:
    from harness.analysis.stats import cluster_design_effect

    # ten sessions of ten turns, every corrupted turn in one session: p = 0.1, the ratio
    # estimator's variance 10/9 * 90 / 100^2 = 0.01 against the binomial's 0.0009
    assert cluster_design_effect([10] + [0] * 9, [10] * 10) == pytest.approx(100 / 9)
    # the same ten corrupted turns one a session: no more spread than independent turns
    assert cluster_design_effect([1] * 10, [10] * 10) == 1.0
    assert cluster_design_effect([0] * 10, [10] * 10) == 1.0  # nothing corrupted
    assert cluster_design_effect([3], [10]) == 1.0  # one session: nothing to estimate from
    with pytest.raises(ValueError, match="one count of events"):
        cluster_design_effect([1, 2], [3])


def test_clustered_interval_and_test_reduce_to_the_plain_ones_without_clustering() -> None:
    from harness.analysis.stats import (
        clopper_pearson,
        clustered_fisher,
        clustered_interval,
        effective_counts,
        fisher_exact,
    )

    assert clustered_interval(3, 10_000, 1.0) == pytest.approx(clopper_pearson(3, 10_000))
    lo, hi = clustered_interval(3, 10_000, 4.0)
    plain = clopper_pearson(3, 10_000)
    assert lo < plain[0]  # fewer effective turns, a wider interval
    assert hi > plain[1]
    assert clustered_interval(0, 100, 2.0)[0] == 0.0
    with pytest.raises(ValueError, match="at least 1"):
        clustered_interval(3, 100, 0.5)
    p, counts = clustered_fisher(30, 1000, 1.0, 10, 1000, 1.0)
    assert counts == (30, 1000, 10, 1000)
    assert p == pytest.approx(fisher_exact(30, 1000, 10, 1000))
    p5, counts5 = clustered_fisher(30, 1000, 5.0, 10, 1000, 1.0)
    assert counts5 == (6, 200, 10, 1000)
    assert p5 > p  # the clustered arm weighs as 200 independent turns
    assert effective_counts(1, 3, 10.0) == (0, 1)  # a non-empty arm keeps one turn
