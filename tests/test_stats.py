"""Tests for glm53_flash.core.stats: golden values, brute-force references and input validation."""

from __future__ import annotations

import ast
import itertools
import math
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import glm53_flash.core.stats as stats_module
from glm53_flash.core.stats import (
    _equal_tail_ranks,
    bootstrap_ci,
    holm,
    mcnemar_exact,
    minimum_detectable_effect,
    paired_bootstrap_ci,
    paired_counts,
    pass_at_k,
    sign_flip_p,
    wilson_interval,
)

# --------------------------------------------------------------------------- references


def binomial_two_sided_reference(gains: int, losses: int) -> Fraction:
    """Two-sided exact binomial p by a different route: sum P(X = i) over every i at least as far
    from n/2 as the observed count (for a symmetric binomial this equals min(1, 2 P(X <= min)))."""
    n = gains + losses
    if n == 0:
        return Fraction(1)
    distance = abs(2 * gains - n)
    mass = sum(math.comb(n, i) for i in range(n + 1) if abs(2 * i - n) >= distance)
    return min(Fraction(1), Fraction(mass, 2**n))


def sign_flip_reference(differences) -> float:
    """Enumerate every sign vector with itertools; the plain formulation of sign_flip_p's exact path."""
    values = [float(x) for x in differences]
    if not values:
        return 1.0
    scale = math.fsum(abs(x) for x in values)
    observed = abs(math.fsum(values))
    extreme = 0
    for signs in itertools.product((1.0, -1.0), repeat=len(values)):
        total = abs(math.fsum(s * x for s, x in zip(signs, values)))
        if total >= observed - 1e-10 * scale:
            extreme += 1
    return extreme / 2 ** len(values)


def sign_flip_integer_reference(differences: list[int]) -> Fraction:
    """Exact-arithmetic enumeration for integer data, where ties are exact and no tolerance is needed."""
    observed = abs(sum(differences))
    extreme = sum(
        abs(sum(s * x for s, x in zip(signs, differences))) >= observed
        for signs in itertools.product((1, -1), repeat=len(differences))
    )
    return Fraction(extreme, 2 ** len(differences))


def plus_minus_ones_p(n: int, positives: int) -> float:
    """Exact p for n differences of +/-1: the sum is 2K - n with K ~ Binomial(n, 1/2)."""
    observed = abs(2 * positives - n)
    mass = sum(math.comb(n, k) for k in range(n + 1) if abs(2 * k - n) >= observed)
    return mass / 2**n


def pass_at_k_reference(n: int, c: int, k: int) -> Fraction:
    """Fraction of all k-subsets of n samples (c of them correct) that contain a correct one."""
    outcomes = [True] * c + [False] * (n - c)
    subsets = list(itertools.combinations(range(n), k))
    hits = sum(any(outcomes[i] for i in subset) for subset in subsets)
    return Fraction(hits, len(subsets))


def holm_reference(p_values: list[float]) -> list[float]:
    """Holm by its definition: adj_(i) = max_{j <= i} min(1, (m - j) p_(j)), mapped back to input order."""
    m = len(p_values)
    order = sorted(range(m), key=lambda i: p_values[i])
    adjusted = [0.0] * m
    running = 0.0
    for rank, index in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p_values[index]))
        adjusted[index] = running
    return adjusted


# --------------------------------------------------------------------------- module rules


def test_module_does_not_import_torch():
    tree = ast.parse(Path(stats_module.__file__).read_text())
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            imported.add(node.module.split(".")[0])
    assert "torch" not in imported
    assert imported <= {"__future__", "math", "operator", "collections", "statistics", "numpy", "scipy"}


# --------------------------------------------------------------------------- McNemar


def test_mcnemar_golden_sixteen_gains_no_losses():
    assert mcnemar_exact(16, 0) == 3.0517578125e-05 == 2 / 2**16
    assert mcnemar_exact(0, 16) == 2 / 2**16


def test_mcnemar_no_discordant_pairs_or_balanced_gives_one():
    assert mcnemar_exact(0, 0) == 1.0
    assert mcnemar_exact(7, 7) == 1.0
    assert mcnemar_exact(1, 0) == 1.0


def test_mcnemar_matches_recorded_seed_value():
    # The original's confirmation seed 16180 recorded p = 0.250 for three losses and no gains.
    assert mcnemar_exact(0, 3) == 0.25


def test_mcnemar_matches_exact_binomial_reference():
    for gains in range(13):
        for losses in range(13):
            expected = float(binomial_two_sided_reference(gains, losses))
            assert mcnemar_exact(gains, losses) == expected, (gains, losses)


def test_mcnemar_large_counts_stay_finite_and_exact():
    assert mcnemar_exact(5000, 5000) == 1.0
    p = mcnemar_exact(600, 400)
    assert 0.0 < p < 1e-9
    assert p == float(binomial_two_sided_reference(600, 400))
    assert mcnemar_exact(np.int64(16), np.int64(0)) == 2 / 2**16


@pytest.mark.parametrize(
    "gains, losses, bad",
    [(-1, 0, "gains"), (0, -2, "losses"), (1.5, 0, "gains"), (True, 0, "gains"), ("3", 0, "gains")],
)
def test_mcnemar_rejects_bad_counts(gains, losses, bad):
    with pytest.raises(ValueError, match=bad):
        mcnemar_exact(gains, losses)


def test_paired_counts_tabulates_all_four_cells():
    before = [False, False, True, True, False, True]
    after = [True, False, False, True, True, True]
    assert paired_counts(before, after) == {"gains": 2, "losses": 1, "both": 2, "neither": 1}
    assert paired_counts(np.array(before), np.array(after)) == paired_counts(before, after)
    assert paired_counts([0, 1], [1, 1]) == {"gains": 1, "losses": 0, "both": 1, "neither": 0}
    assert paired_counts([], []) == {"gains": 0, "losses": 0, "both": 0, "neither": 0}


def test_paired_counts_feeds_mcnemar():
    counts = paired_counts([False] * 16 + [True] * 4, [True] * 20)
    assert mcnemar_exact(counts["gains"], counts["losses"]) == 2 / 2**16


@pytest.mark.parametrize(
    "before, after, bad",
    [
        ([True, False], [True], "same length"),
        ([True, 2], [True, False], r"before\[1\]"),
        ([True, False], [True, "yes"], r"after\[1\]"),
        ([True, 0.5], [True, False], r"before\[1\]"),
        ("TF", "FT", "before"),
        (None, [True], "before"),
    ],
)
def test_paired_counts_rejects_bad_input(before, after, bad):
    with pytest.raises(ValueError, match=bad):
        paired_counts(before, after)


# --------------------------------------------------------------------------- sign flip


def test_sign_flip_golden_ten_positive_differences():
    assert sign_flip_p([1.0] * 10) == 2 / 1024
    # The original's interleaved-minus-blocked differences: ten positive values, recorded p 0.00195.
    recorded = [14.9, 3.8, 9.7, 12.1, 10.3, 7.5, 6.0, 9.7, 14.4, 8.2]
    assert sign_flip_p(recorded) == 2 / 1024


def test_sign_flip_all_equal_data_gives_one():
    assert sign_flip_p([0.0] * 10) == 1.0
    assert sign_flip_p(np.array([3.0] * 8) - np.array([3.0] * 8)) == 1.0
    assert sign_flip_p([]) == 1.0
    assert sign_flip_p([1.0, -1.0]) == 1.0  # observed sum is zero: the least extreme outcome


@pytest.mark.parametrize("seed", range(6))
def test_sign_flip_exact_matches_itertools_reference_on_random_data(seed):
    rng = np.random.default_rng(seed)
    for n in range(1, 9):
        differences = rng.normal(loc=0.4, size=n)
        assert sign_flip_p(differences) == sign_flip_reference(differences), (seed, n)


@pytest.mark.parametrize("seed", range(4))
def test_sign_flip_exact_handles_integer_ties(seed):
    rng = np.random.default_rng(100 + seed)
    for n in range(1, 9):
        differences = [int(x) for x in rng.integers(-3, 4, size=n)]
        assert sign_flip_p(differences) == float(sign_flip_integer_reference(differences)), differences


def test_sign_flip_exact_at_twenty_matches_binomial_closed_form():
    differences = [1.0] * 15 + [-1.0] * 5
    assert sign_flip_p(differences) == plus_minus_ones_p(20, 15)


def test_sign_flip_zeros_symmetry_and_scale_do_not_change_p():
    rng = np.random.default_rng(7)
    differences = rng.normal(loc=0.3, size=7)
    p = sign_flip_p(differences)
    assert sign_flip_p(np.concatenate([differences, np.zeros(5)])) == p
    assert sign_flip_p(-differences) == p
    assert sign_flip_p(differences * 1000.0) == p


def test_sign_flip_monte_carlo_close_to_exact_expectation():
    n, positives, samples = 25, 17, 100_000
    differences = [1.0] * positives + [-1.0] * (n - positives)
    expected = plus_minus_ones_p(n, positives)
    standard_error = math.sqrt(expected * (1 - expected) / samples)
    estimate = sign_flip_p(differences, samples=samples, seed=3)
    assert abs(estimate - expected) < 4.5 * standard_error


def test_sign_flip_monte_carlo_agrees_with_exact_enumeration_above_twenty():
    differences = np.random.default_rng(11).normal(loc=0.25, size=25)
    exact = sign_flip_p(differences, max_exact=25)
    estimate = sign_flip_p(differences, samples=50_000, seed=1)
    assert abs(estimate - exact) < 4.5 * math.sqrt(exact * (1 - exact) / 50_000) + 1e-4


def test_sign_flip_monte_carlo_is_reproducible_and_never_zero():
    differences = np.random.default_rng(5).normal(loc=0.3, size=25)
    first = sign_flip_p(differences, samples=20_000, seed=42)
    assert sign_flip_p(differences, samples=20_000, seed=42) == first
    assert sign_flip_p(differences, samples=20_000, seed=43) != first
    # Twenty-five positive differences: the exact p is 2/2^25, but the estimate is floored at 1/(m+1).
    strong = sign_flip_p([1.0] * 25, samples=1_000, seed=0)
    assert strong == 1 / 1_001


def test_sign_flip_path_choice_follows_max_exact():
    differences = [1.0] * 6
    assert sign_flip_p(differences, max_exact=6) == 2 / 64
    assert sign_flip_p(differences, max_exact=5, samples=999, seed=0) == pytest.approx(2 / 64, abs=0.03)


@pytest.mark.parametrize(
    "kwargs, bad",
    [
        ({"differences": [1.0, float("nan")]}, "finite"),
        ({"differences": [1.0, float("inf")]}, "finite"),
        ({"differences": [[1.0, 2.0]]}, "1-D"),
        ({"differences": ["a", "b"]}, "differences"),
        ({"differences": [1.0], "max_exact": 41}, "max_exact"),
        ({"differences": [1.0], "max_exact": -1}, "max_exact"),
        ({"differences": [1.0], "samples": 0}, "samples"),
        ({"differences": [1.0], "seed": -1}, "seed"),
        ({"differences": [1.0], "seed": 1.5}, "seed"),
    ],
)
def test_sign_flip_rejects_bad_input(kwargs, bad):
    differences = kwargs.pop("differences")
    with pytest.raises(ValueError, match=bad):
        sign_flip_p(differences, **kwargs)


# --------------------------------------------------------------------------- bootstrap


def test_equal_tail_ranks_leave_the_same_count_in_each_tail():
    assert _equal_tail_ranks(9999, 0.95) == (249, 9749)
    assert _equal_tail_ranks(50_000, 0.95) == (1249, 48750)
    assert _equal_tail_ranks(9999, 0.90) == (499, 9499)  # no 499.999... rounding slip
    for resamples in (39, 100, 1000, 10_000, 50_000):
        for level in (0.8, 0.9, 0.95, 0.99):
            if (resamples + 1) * (1 - level) / 2 < 1 - 1e-9:
                continue
            low, high = _equal_tail_ranks(resamples, level)
            assert low == resamples - 1 - high
            assert low + 1 == math.floor((resamples + 1) * (1 - level) / 2 + 1e-9)


def test_bootstrap_endpoints_are_the_documented_order_statistics():
    values = np.random.default_rng(0).normal(size=10)
    resamples, seed = 9999, 17
    # One block of resamples covers everything at this size, so the draws can be replayed exactly.
    indices = np.random.default_rng(seed).integers(0, values.size, size=(resamples, values.size))
    draws = np.sort(values[indices].mean(axis=1))
    assert bootstrap_ci(values, resamples=resamples, seed=seed) == (draws[249], draws[9749])


def test_bootstrap_is_reproducible_with_seed():
    values = np.random.default_rng(1).normal(size=30)
    first = bootstrap_ci(values, seed=5)
    assert bootstrap_ci(values, seed=5) == first
    assert bootstrap_ci(values, seed=6) != first


def test_bootstrap_constant_data_gives_a_point():
    assert bootstrap_ci([2.5] * 12) == (2.5, 2.5)
    assert bootstrap_ci([4.0]) == (4.0, 4.0)


def test_bootstrap_ci_contains_the_mean_and_known_two_point_answer():
    values = np.arange(20, dtype=float)
    low, high = bootstrap_ci(values, resamples=2000)
    assert low < values.mean() < high
    # The mean of a resample of [0, 1] is 0, 1/2 or 1 with probabilities 1/4, 1/2, 1/4, so each 2.5%
    # tail lands on an extreme value.
    assert bootstrap_ci([0.0, 1.0], resamples=2000) == (0.0, 1.0)


def test_bootstrap_accepts_other_reductions():
    values = np.random.default_rng(2).normal(size=25)
    low, high = bootstrap_ci(values, statistic=np.median, resamples=999)
    assert low <= np.median(values) <= high
    trimmed = bootstrap_ci(values, statistic=lambda x, axis: np.max(x, axis=axis), resamples=999)
    assert trimmed[1] == values.max()


def test_bootstrap_blocks_large_inputs_without_changing_the_interval_shape():
    values = np.random.default_rng(3).normal(size=50_000)
    low, high = bootstrap_ci(values, resamples=199)  # several blocks of resamples
    assert low < values.mean() < high
    assert high - low < 0.05


def test_paired_bootstrap_is_the_bootstrap_of_differences():
    rng = np.random.default_rng(4)
    before = rng.normal(size=15)
    after = before + rng.normal(loc=0.5, size=15)
    assert paired_bootstrap_ci(before, after, seed=9) == bootstrap_ci(after - before, seed=9)
    low, high = paired_bootstrap_ci([False, False, True, False], [True, True, True, False], resamples=999)
    assert 0.0 <= low <= 0.5 <= high <= 1.0


@pytest.mark.parametrize(
    "call, bad",
    [
        (lambda: bootstrap_ci([]), "empty"),
        (lambda: bootstrap_ci([1.0, float("nan")]), "finite"),
        (lambda: bootstrap_ci([1.0, 2.0], level=1.0), "level"),
        (lambda: bootstrap_ci([1.0, 2.0], level=0), "level"),
        (lambda: bootstrap_ci([1.0, 2.0], resamples=38), "resamples=38"),
        (lambda: bootstrap_ci([1.0, 2.0], resamples=0), "resamples"),
        (lambda: bootstrap_ci([1.0, 2.0], seed=-3), "seed"),
        (lambda: bootstrap_ci([1.0, 2.0], statistic="mean"), "statistic"),
        (lambda: bootstrap_ci([1.0, 2.0], statistic=lambda x, axis: 0.0), "statistic"),
        (lambda: paired_bootstrap_ci([1.0, 2.0], [1.0]), "same length"),
    ],
)
def test_bootstrap_rejects_bad_input(call, bad):
    with pytest.raises(ValueError, match=bad):
        call()


# --------------------------------------------------------------------------- Holm


def test_holm_hand_computed_example():
    # Sorted: 0.005*4 = 0.02, 0.01*3 = 0.03, 0.03*2 = 0.06, 0.04*1 = 0.04 -> raised to 0.06.
    assert holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02], abs=1e-15)


def test_holm_caps_at_one_and_handles_edges():
    assert holm([0.5, 0.6]) == [1.0, 1.0]
    assert holm([0.2]) == [0.2]
    assert holm([]) == []
    assert holm([0.01, 0.01]) == [0.02, 0.02]


@settings(max_examples=150, deadline=None)
@given(st.lists(st.floats(min_value=0.0, max_value=1.0), max_size=12))
def test_holm_properties(p_values):
    adjusted = holm(p_values)
    assert adjusted == pytest.approx(holm_reference(p_values), abs=1e-12)
    for raw, adj in zip(p_values, adjusted):
        assert raw <= adj + 1e-15 and adj <= 1.0
    for i, j in itertools.combinations(range(len(p_values)), 2):
        if p_values[i] <= p_values[j]:
            assert adjusted[i] <= adjusted[j]


@pytest.mark.parametrize("p_values, bad", [([0.1, 1.2], "1.2"), ([-0.1], "-0.1"), ([float("nan")], "finite")])
def test_holm_rejects_bad_input(p_values, bad):
    with pytest.raises(ValueError, match=bad):
        holm(p_values)


# --------------------------------------------------------------------------- pass@k


def test_pass_at_k_matches_brute_force_over_all_subsets():
    for n in range(1, 9):
        for c in range(n + 1):
            for k in range(1, n + 1):
                expected = float(pass_at_k_reference(n, c, k))
                assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12), (n, c, k)


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_pass_at_k_matches_binomial_ratio(data):
    n = data.draw(st.integers(min_value=1, max_value=300))
    c = data.draw(st.integers(min_value=0, max_value=n))
    k = data.draw(st.integers(min_value=1, max_value=n))
    exact = 1 - Fraction(math.comb(n - c, k), math.comb(n, k))
    assert pass_at_k(n, c, k) == pytest.approx(float(exact), abs=1e-12)
    if k < n:
        assert pass_at_k(n, c, k) <= pass_at_k(n, c, k + 1) + 1e-15


def test_pass_at_k_special_cases():
    assert pass_at_k(8, 3, 1) == pytest.approx(3 / 8, abs=1e-15)
    assert pass_at_k(8, 0, 8) == 0.0
    assert pass_at_k(8, 5, 4) == 1.0  # only 3 failures: every 4-subset holds a pass
    assert pass_at_k(8, 1, 8) == 1.0
    # Huge n: the binomial coefficients would overflow a float, the product form does not.
    assert pass_at_k(10**6, 1, 1) == pytest.approx(1e-6, rel=1e-9)
    big = 1 - Fraction(math.comb(1000, 500), math.comb(2000, 500))
    assert pass_at_k(2000, 1000, 500) == pytest.approx(float(big), abs=1e-12)


@pytest.mark.parametrize(
    "n, c, k, bad",
    [
        (0, 0, 1, "n must"),
        (5, 6, 1, "c must .* got 6"),
        (5, -1, 1, "c must"),
        (5, 2, 0, "k must"),
        (5, 2, 6, "k must .* got 6"),
        (5.0, 2, 1, "n must"),
        (5, True, 1, "c must"),
    ],
)
def test_pass_at_k_rejects_bad_input(n, c, k, bad):
    with pytest.raises(ValueError, match=bad):
        pass_at_k(n, c, k)


# --------------------------------------------------------------------------- Wilson and MDE


def test_wilson_known_values():
    assert wilson_interval(5, 10) == pytest.approx((0.2365931, 0.7634069), abs=1e-7)
    assert wilson_interval(0, 10) == pytest.approx((0.0, 0.2775328), abs=1e-7)
    assert wilson_interval(10, 10) == pytest.approx((0.7224672, 1.0), abs=1e-7)
    assert wilson_interval(0, 10)[0] == 0.0 and wilson_interval(10, 10)[1] == 1.0


def test_wilson_is_symmetric_narrows_with_n_and_contains_the_rate():
    for total in (1, 7, 40, 500):
        for successes in range(0, total + 1, max(1, total // 7)):
            low, high = wilson_interval(successes, total)
            mirror = wilson_interval(total - successes, total)
            assert (low, high) == pytest.approx((1 - mirror[1], 1 - mirror[0]), abs=1e-12)
            assert 0.0 <= low <= successes / total <= high <= 1.0
    assert wilson_interval(30, 100, level=0.99)[0] < wilson_interval(30, 100)[0]
    narrow = wilson_interval(300, 1000)
    wide = wilson_interval(30, 100)
    assert narrow[1] - narrow[0] < wide[1] - wide[0]


@pytest.mark.parametrize(
    "args, bad",
    [((1, 0), "total"), ((11, 10), "successes .* got 11"), ((-1, 10), "successes"), ((1, 10, 1.5), "level")],
)
def test_wilson_rejects_bad_input(args, bad):
    with pytest.raises(ValueError, match=bad):
        wilson_interval(*args)


def test_minimum_detectable_effect_normal_approximation():
    # (z_0.975 + z_0.8) / sqrt(100) = (1.959964 + 0.841621) / 10
    assert minimum_detectable_effect(100, 1.0) == pytest.approx(0.2801585, abs=1e-7)
    assert minimum_detectable_effect(400, 1.0) == pytest.approx(minimum_detectable_effect(100, 1.0) / 2)
    assert minimum_detectable_effect(50, 0.0) == 0.0
    assert minimum_detectable_effect(100, 1.0, alpha=0.01) > minimum_detectable_effect(100, 1.0)
    assert minimum_detectable_effect(100, 1.0, power=0.9) > minimum_detectable_effect(100, 1.0)


@pytest.mark.parametrize(
    "args, bad",
    [
        ((0, 1.0), "n_pairs"),
        ((10, -1.0), "sd_difference"),
        ((10, float("nan")), "sd_difference"),
        ((10, "1"), "sd_difference"),
        ((10, 1.0, 0.0), "alpha"),
        ((10, 1.0, 0.05, 1.0), "power"),
    ],
)
def test_minimum_detectable_effect_rejects_bad_input(args, bad):
    with pytest.raises(ValueError, match=bad):
        minimum_detectable_effect(*args)


# --------------------------------------------------------------------------- Student's t, TOST, power, two levels

from hypothesis import given, settings, strategies as st  # noqa: E402

from glm53_flash.core.stats import (  # noqa: E402
    equivalence_test, minimum_detectable_difference, minimum_equivalence_margin, regularized_beta, student_t_cdf,
    student_t_quantile, t_interval, t_test_p, two_level_comparison,
)


@pytest.mark.parametrize("p, df, table", [
    (0.975, 1, 12.7062), (0.975, 2, 4.3027), (0.975, 4, 2.7764), (0.975, 10, 2.2281), (0.95, 4, 2.1318),
    (0.8, 5, 0.9195), (0.995, 30, 2.7500), (0.975, 10**7, 1.9600),
])
def test_t_quantiles_match_the_printed_table(p, df, table):
    assert student_t_quantile(p, df) == pytest.approx(table, abs=1e-4)
    assert student_t_quantile(1 - p, df) == pytest.approx(-table, abs=1e-4)


def test_t_cdf_and_the_incomplete_beta_at_known_points():
    assert student_t_cdf(0.0, 3) == 0.5
    assert student_t_cdf(1.0, 1) == pytest.approx(0.75)  # Cauchy: 1/2 + atan(1)/pi
    assert student_t_cdf(2.0, 2) == pytest.approx(0.5 + 2 / (2 * math.sqrt(6)))  # closed form for df = 2
    assert regularized_beta(1, 1, 0.3) == pytest.approx(0.3)
    assert regularized_beta(2, 3, 0.4) == pytest.approx(0.5248)
    with pytest.raises(ValueError):
        student_t_cdf(1.0, 0)
    with pytest.raises(ValueError):
        regularized_beta(0, 1, 0.5)


@settings(max_examples=80, deadline=None)
@given(st.floats(0.001, 0.999), st.floats(0.5, 200))
def test_t_quantile_inverts_the_cdf(p, df):
    assert student_t_cdf(student_t_quantile(p, df), df) == pytest.approx(p, abs=1e-9)


def test_t_test_and_interval_by_hand():
    values = [1.0, 2.0, 3.0, 4.0]  # mean 2.5, sd 1.29099, se 0.645497, t(3) = 3.873 against 0
    assert t_test_p(values) == pytest.approx(2 * student_t_cdf(-2.5 / 0.6454972, 3))
    low, high = t_interval(values, 0.95)
    assert (low + high) / 2 == pytest.approx(2.5) and high - 2.5 == pytest.approx(3.1824 * 0.6454972, abs=1e-3)
    assert t_test_p([0.2, 0.2, 0.2], reference=0.2) == 1.0 and t_test_p([0.2, 0.2]) == 0.0
    with pytest.raises(ValueError, match="at least 2"):
        t_test_p([1.0])


def test_equivalence_is_shown_only_inside_the_margin():
    tight = [0.66, 0.67, 0.665, 0.668, 0.662]
    shown = equivalence_test(tight, reference=2 / 3, margin=0.05)
    assert shown["equivalent"] and shown["p"] < 0.05 and shown["interval_level"] == pytest.approx(0.9)
    low, high = shown["interval"]
    assert 2 / 3 - 0.05 < low < high < 2 / 3 + 0.05
    # the committed headline's faithful confirm rates, one per pretraining seed: a margin of 15 points is
    # not enough for three seeds that spread this far
    wide = equivalence_test([15.33 / 24, 20 / 24, 20 / 24], reference=16 / 24, margin=0.15)
    assert not wide["equivalent"] and wide["interval"][1] > 16 / 24 + 0.15
    off = equivalence_test([0.9, 0.91, 0.92], reference=0.5, margin=0.1)
    assert not off["equivalent"] and off["p_upper"] > 0.5
    for bad in (0, -0.1, float("nan"), True):
        with pytest.raises(ValueError, match="margin"):
            equivalence_test(tight, margin=bad)


def test_minimum_detectable_difference():
    from scipy.stats import nct, t

    # exact: a paired t-test over 6 values rejects a true mean difference of the returned size with power 0.8
    mdd = minimum_detectable_difference(6, 0.5)
    delta, critical = mdd * math.sqrt(6) / 0.5, t.ppf(0.975, 5)
    assert nct.sf(critical, 5, delta) + nct.cdf(-critical, 5, delta) == pytest.approx(0.8, abs=1e-6)
    # the quantile-sum approximation (t_.975,5 + t_.8,5) sd / sqrt(n) understates it; the normal one more so
    assert (2.5706 + 0.9195) * 0.5 / math.sqrt(6) < mdd
    assert minimum_detectable_difference(6, 0.5, test="z") < (2.5706 + 0.9195) * 0.5 / math.sqrt(6)
    # ten paired values: d = 0.996 (the textbook figure), about 12% above the normal approximation's 0.886
    assert minimum_detectable_difference(10, 1.0) == pytest.approx(0.9960, abs=1e-3)
    assert minimum_detectable_difference(10, 1.0, test="z") == pytest.approx(0.8859, abs=1e-3)
    big = minimum_detectable_difference(600, 0.5)
    assert big == pytest.approx((1.9640 + 0.8417) * 0.5 / math.sqrt(600), abs=1e-3)
    assert minimum_detectable_difference(600, 0.5, test="z") < big
    assert minimum_detectable_difference(5, 0.1, test="sign-flip") is None  # 2/32 > 0.05: nothing can show
    assert minimum_detectable_difference(6, 0.1, test="sign-flip") is not None
    assert minimum_detectable_difference(1, 0.1) is None
    assert minimum_equivalence_margin(3, 0.1) == pytest.approx((2.9200 + 1.8856) * 0.1 / math.sqrt(3), abs=1e-3)
    with pytest.raises(ValueError):
        minimum_detectable_difference(10, -1.0)


def test_a_direction_needs_both_levels():
    units = [f"u{i}" for i in range(12)]
    consistent = {seed: {u: 0.2 + 0.01 * seed for u in units} for seed in range(5)}
    result = two_level_comparison(consistent)
    assert result["verdict"] == "better" and result["units"]["n"] == 12 and result["seeds"]["n"] == 5
    assert result["units"]["sign_flip_p"] == pytest.approx(2 / 2**12)
    # every unit moves the same way, but the seeds disagree: not shown
    noisy = {seed: {u: (0.3 if seed % 2 else -0.25) for u in units} for seed in range(4)}
    assert two_level_comparison(noisy)["verdict"] == "not shown"
    # the seeds agree but one unit carries everything: not shown at the unit level
    one = {seed: {u: (0.9 if u == "u0" else 0.0) for u in units} for seed in range(6)}
    assert two_level_comparison(one)["verdict"] == "not shown"
    worse = {seed: {u: -0.1 - 0.01 * seed for u in units} for seed in range(5)}
    assert two_level_comparison(worse)["verdict"] == "worse"
    with pytest.raises(ValueError, match="other units"):
        two_level_comparison({1: {"a": 0.1}, 2: {"b": 0.1}})


def test_sign_flip_floor_holds_for_any_number_of_units():
    """A sealed split of the compositions suite has 1,030 units: 2.0 ** 1030 overflows a float, so the
    floor and every power statement built on it must not compute it."""
    from glm53_flash.core.stats import minimum_detectable_difference, sign_flip_floor

    assert sign_flip_floor(0) == 1.0 and sign_flip_floor(1) == 1.0 and sign_flip_floor(5) == 2 / 32
    assert sign_flip_floor(1030) == 0.0 or sign_flip_floor(1030) < 1e-300
    assert minimum_detectable_difference(1030, 0.3, test="sign-flip") == pytest.approx(
        minimum_detectable_difference(1030, 0.3, test="z"), rel=2e-3)  # the exact t nears the normal at large n
    assert minimum_detectable_difference(5, 0.3, test="sign-flip") is None  # 2/32 > 0.05


# ------------------------------------------------------------------ Welch's two-sample comparison

from glm53_flash.core.stats import welch_comparison  # noqa: E402


def test_welch_matches_the_textbook_example_and_its_equivalence_is_its_interval():
    # t.test(c(2,4,6,8,10), c(1,2,3,4,5)) (Welch's, the default): t = 1.8974, df = 5.8824, p = 0.1075
    r = welch_comparison([1, 2, 3, 4, 5], [2, 4, 6, 8, 10], margin=1.0)
    assert r["difference"] == 3.0 and r["df"] == pytest.approx(5.8824, abs=1e-4)
    assert r["p"] == pytest.approx(0.1075, abs=1e-4)
    # its 90% interval from the same t quantile: 3 +- t_{0.95, 5.88} * sqrt(2.5/5 + 10/5)
    half = student_t_quantile(0.95, r["df"]) * math.sqrt(2.5)
    assert r["interval"] == pytest.approx([3 - half, 3 + half])
    assert not r["equivalent"] and r["smallest_margin"] == pytest.approx(3 + half)
    # swapping the samples negates the difference and keeps every p
    swapped = welch_comparison([2, 4, 6, 8, 10], [1, 2, 3, 4, 5], margin=1.0)
    assert swapped["difference"] == -3.0 and swapped["p"] == pytest.approx(r["p"])
    assert swapped["tost_p"] == pytest.approx(r["tost_p"])


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(-5, 5), min_size=2, max_size=8), st.lists(st.floats(-5, 5), min_size=2, max_size=8),
       st.floats(0.01, 10))
def test_welch_equivalence_holds_exactly_when_its_interval_lies_inside_the_margin(first, second, margin):
    r = welch_comparison(first, second, margin=margin)
    low, high = r["interval"]
    if abs(abs(low) - margin) > 1e-9 and abs(abs(high) - margin) > 1e-9:  # away from the boundary
        assert r["equivalent"] == (-margin < low and high < margin)
    # the two-sided p is below 2 alpha exactly when the (1 - 2 alpha) interval leaves out 0
    if r["df"] is not None and min(abs(low), abs(high)) > 1e-9:
        assert (r["p"] < 0.1) == (low > 0 or high < 0)
    # a shift of both samples moves nothing
    moved = welch_comparison([x + 3 for x in first], [x + 3 for x in second], margin=margin)
    assert moved["difference"] == pytest.approx(r["difference"], abs=1e-9)


def test_welch_refuses_what_it_cannot_compare():
    with pytest.raises(ValueError, match="first needs at least 2"):
        welch_comparison([1.0], [1.0, 2.0], margin=1.0)
    with pytest.raises(ValueError, match="margin"):
        welch_comparison([1.0, 2.0], [1.0, 2.0], margin=0)
    same = welch_comparison([1.0, 1.0], [1.5, 1.5], margin=1.0)
    assert same["df"] is None and same["p"] == 0.0 and same["equivalent"]


def test_detectable_differences_come_from_the_spread_each_level_measured():
    from glm53_flash.core.stats import detectable_differences, minimum_detectable_difference

    units = [f"u{i}" for i in range(10)]
    data = {seed: {u: 0.1 * ((i + seed) % 3) for i, u in enumerate(units)} for seed in range(4)}
    per_seed = [float(np.mean([data[s][u] for u in units])) for s in range(4)]
    per_unit = [float(np.mean([data[s][u] for s in range(4)])) for u in units]
    found = detectable_differences(data, alpha=0.01)
    assert found["seeds_sd"] == pytest.approx(float(np.std(per_seed, ddof=1)))
    assert found["units_sd"] == pytest.approx(float(np.std(per_unit, ddof=1)))
    assert found["seeds"] == pytest.approx(minimum_detectable_difference(4, found["seeds_sd"], 0.01, 0.8, "t"))
    assert found["units"] == pytest.approx(minimum_detectable_difference(10, found["units_sd"], 0.01, 0.8, "t"))
    # the per-seed values are two_level_comparison's
    assert two_level_comparison(data)["seeds"]["values"] == pytest.approx(per_seed)
    # a stricter alpha needs a larger difference; one seed has no spread to plan with
    assert found["seeds"] > detectable_differences(data)["seeds"]
    assert detectable_differences({1: data[0]})["seeds"] is None


def test_group_means_count_each_group_once():
    from glm53_flash.core.stats import group_means

    differences = {1: {"a": 1.0, "b": 0.0, "c": 0.5}, 2: {"a": 0.0, "b": 0.0, "c": -1.0}}
    assert group_means(differences, {"a": "g", "b": "g", "c": "h"}) == {1: {"g": 0.5, "h": 0.5},
                                                                        2: {"g": 0.0, "h": -1.0}}
    with pytest.raises(ValueError, match="unit 'c' has no group"):
        group_means(differences, {"a": "g", "b": "g"})


def test_the_crossed_comparison_takes_both_seeds_and_units_as_random():
    """A 2 x 3 table worked by hand: mean 3.5; mean squares 13.5 (seeds, 1 df), 6.5 (units, 2 df) and 1.5
    (residual, 2 df); the grand mean's variance (13.5 + 6.5 - 1.5) / 6 on Satterthwaite's 18.5^2 / (13.5^2 + 6.5^2
    / 2 + 1.5^2 / 2) = 1.674 degrees of freedom."""
    from glm53_flash.core.stats import crossed_comparison, student_t_cdf

    table = {"s1": {"u1": 1.0, "u2": 2.0, "u3": 3.0}, "s2": {"u1": 3.0, "u2": 4.0, "u3": 8.0}}
    result = crossed_comparison(table, alpha=0.05)
    assert result["mean"] == pytest.approx(3.5)
    assert result["se"] == pytest.approx(math.sqrt(18.5 / 6))
    assert result["df"] == pytest.approx(18.5 ** 2 / (13.5 ** 2 + 6.5 ** 2 / 2 + 1.5 ** 2 / 2))
    assert result["t_test_p"] == pytest.approx(2 * student_t_cdf(-3.5 / math.sqrt(18.5 / 6), result["df"]))
    assert result["variance_components"] == pytest.approx({"seed": (13.5 - 1.5) / 3, "unit": (6.5 - 1.5) / 2,
                                                           "residual": 1.5})
    # seeds that agree add no variance: the test is the t-test over the units' means
    same = crossed_comparison({"s1": {"u1": 1.0, "u2": 2.0, "u3": 3.0}, "s2": {"u1": 1.0, "u2": 2.0, "u3": 3.0}})
    assert same["df"] == pytest.approx(2) and same["t_test_p"] == pytest.approx(t_test_p([1.0, 2.0, 3.0]))
    # and units that agree add none: the t-test over the seeds' means
    rows = crossed_comparison({"s1": {"u1": 1.0, "u2": 1.0}, "s2": {"u1": 2.0, "u2": 2.0}, "s3": {"u1": 4.0, "u2": 4.0}})
    assert rows["df"] == pytest.approx(2) and rows["t_test_p"] == pytest.approx(t_test_p([1.0, 2.0, 4.0]))
    flat = crossed_comparison({"s1": {"u1": 0.5, "u2": 0.5}, "s2": {"u1": 0.5, "u2": 0.5}})
    assert flat["t_test_p"] == 0.0 and flat["interval"] == [0.5, 0.5] and flat["df"] is None
    with pytest.raises(ValueError, match="at least 2 seeds"):
        crossed_comparison({"s1": {"u1": 1.0, "u2": 2.0}})
    with pytest.raises(ValueError, match="covers other units"):
        crossed_comparison({"s1": {"u1": 1.0, "u2": 2.0}, "s2": {"u1": 1.0}})


def test_holm_verdicts_adjust_each_level_over_the_family():
    from glm53_flash.core.stats import holm, holm_verdicts

    def comparison(mean, unit_p, seed_p):
        return {"units": {"mean": mean, "sign_flip_p": unit_p}, "seeds": {"mean": mean, "t_test_p": seed_p}}

    family = [comparison(0.02, 0.001, 0.004), comparison(0.03, 0.01, 0.03), comparison(-0.01, 0.002, None)]
    verdicts = holm_verdicts(family, alpha=0.05)
    assert [v["units"] for v in verdicts] == holm([0.001, 0.01, 0.002])
    assert [v["seeds"] for v in verdicts] == holm([0.004, 0.03, 1.0])
    # 0.004 x 3 and 0.03 x 2 at the seeds: the first holds, the second (0.06) does not; no seed test, no verdict
    assert [v["verdict"] for v in verdicts] == ["better", "not shown", "not shown"]
    assert holm_verdicts([comparison(-0.02, 0.001, 0.004)])[0]["verdict"] == "worse"
    assert holm_verdicts([]) == []
