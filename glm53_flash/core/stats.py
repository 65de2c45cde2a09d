"""Statistics for paired comparisons: exact McNemar, exact sign-flip permutation, bootstrap CIs, Holm;
Student's t (CDF, quantile, tests and intervals), equivalence by two one-sided tests, the power of a
plan (its minimum detectable difference) and the two-level comparison over units and seeds.

Replaces the original's ad-hoc analyser helpers (seed-core §7.5, seed-research §4-5) with one tested
module: equal-tailed bootstrap order statistics, seeded RNGs, an unbiased pass@k, and input checks.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Sequence
from statistics import NormalDist

import numpy as np

# Two signed sums that differ by less than this fraction of sum(|d|) count as a tie. Summing the
# same numbers in a different order moves the result by about n * 2.2e-16 of sum(|d|), so 1e-10
# absorbs rounding for any realistic n while staying far below any real difference in the data.
_TIE_TOLERANCE = 1e-10

# Exact enumeration splits the sign vector in two halves of at most 2^20 sums each (8 MiB apiece);
# beyond 40 differences the halves would no longer fit comfortably in memory.
_MAX_EXACT_LIMIT = 40

# Resampling work is done in blocks of about this many array cells so memory stays bounded for
# large inputs. The block size depends only on the input length, so results are reproducible.
_BLOCK_CELLS = 1 << 22


# --------------------------------------------------------------------------- input validation


def _count(name: str, value: object, minimum: int = 0) -> int:
    """An integer >= minimum; bools are rejected because True/False as a count is almost always a bug."""
    if isinstance(value, (bool, np.bool_)):
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    try:
        number = operator.index(value)
    except TypeError:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}") from None
    if number < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {number}")
    return number


def _open_unit(name: str, value: object) -> float:
    """A real number strictly between 0 and 1 (a confidence level, alpha or power)."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.floating, np.integer)):
        raise ValueError(f"{name} must be a number strictly between 0 and 1, got {value!r}")
    number = float(value)
    if not 0.0 < number < 1.0:
        raise ValueError(f"{name} must be a number strictly between 0 and 1, got {value!r}")
    return number


def _finite_vector(name: str, values: object) -> np.ndarray:
    """A 1-D float array of finite numbers (bools become 0/1, which suits pass/fail vectors)."""
    try:
        array = np.asarray(values, dtype=float)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a 1-D sequence of finite numbers, got {values!r}") from None
    if array.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got an array of shape {array.shape}")
    bad = np.flatnonzero(~np.isfinite(array))
    if bad.size:
        raise ValueError(f"{name} must be finite, got {array[bad[0]]!r} at index {int(bad[0])}")
    return array


def _outcome_vector(name: str, values: object) -> list[bool]:
    """Pass/fail outcomes: each entry must be a bool (numpy bools and the integers 0/1 also accepted)."""
    if isinstance(values, (str, bytes)) or not isinstance(values, (Sequence, np.ndarray)):
        raise ValueError(f"{name} must be a sequence of booleans, got {values!r}")
    outcomes = []
    for index, value in enumerate(values):
        if isinstance(value, (bool, np.bool_)) or (isinstance(value, (int, np.integer)) and value in (0, 1)):
            outcomes.append(bool(value))
        else:
            raise ValueError(f"{name}[{index}] must be a boolean, got {value!r}")
    return outcomes


# --------------------------------------------------------------------------- paired binary outcomes


def paired_counts(before: Sequence[bool], after: Sequence[bool]) -> dict[str, int]:
    """Tabulate paired pass/fail outcomes of the same units under two conditions.

    Returns {"gains": fail->pass, "losses": pass->fail, "both": pass->pass, "neither": fail->fail}.
    Only gains and losses (the discordant pairs) carry information for `mcnemar_exact`.
    """
    first = _outcome_vector("before", before)
    second = _outcome_vector("after", after)
    if len(first) != len(second):
        raise ValueError(f"before and after must have the same length, got {len(first)} and {len(second)}")
    counts = {"gains": 0, "losses": 0, "both": 0, "neither": 0}
    for was, now in zip(first, second):
        key = ("neither", "gains", "losses", "both")[2 * was + now]
        counts[key] += 1
    return counts


def mcnemar_exact(gains: int, losses: int) -> float:
    """Exact two-sided McNemar test: p = min(1, 2 * P(X <= min(g, l))) with X ~ Binomial(g + l, 1/2).

    Under the null a discordant pair is equally likely to be a gain or a loss. The tail is summed in
    exact integer arithmetic (Python ints divide with correct rounding), so 16 gains and no losses
    give exactly 2 / 2^16. With no discordant pairs there is no evidence either way: p = 1.
    """
    gains = _count("gains", gains)
    losses = _count("losses", losses)
    discordant = gains + losses
    if discordant == 0:
        return 1.0
    # Sum C(n, i) for i <= min(g, l) with the recurrence C(n, i+1) = C(n, i) * (n - i) / (i + 1),
    # which stays exact in integers and avoids recomputing each binomial coefficient from scratch.
    term, tail = 1, 1
    for i in range(min(gains, losses)):
        term = term * (discordant - i) // (i + 1)
        tail += term
    return min(1.0, 2 * tail / 2**discordant)


# --------------------------------------------------------------------------- paired differences


def _signed_sums(values: np.ndarray) -> np.ndarray:
    """All 2^len(values) sums of +/-values, one per sign vector."""
    sums = np.zeros(1)
    for value in values:
        sums = np.concatenate((sums + value, sums - value))
    return sums


def sign_flip_p(
    differences: Sequence[float],
    *,
    max_exact: int = 20,
    samples: int = 100_000,
    seed: int = 0,
) -> float:
    """Two-sided paired sign-flip permutation test of "mean difference = 0".

    Under the null each paired difference is symmetric about zero, so its sign is a fair coin. The
    statistic is |sum d|; p is the fraction of sign vectors whose |sum| is at least the observed one
    (ties within a relative tolerance of 1e-10 of sum|d| count, and the observed vector is one of
    them, so ten positive differences give exactly 2/1024).

    Zeros are dropped first: they flip to themselves, so they change neither the statistic nor the
    fraction. With n <= max_exact non-zero differences all 2^n sign vectors are enumerated. Above
    that, `samples` random sign vectors from `np.random.default_rng(seed)` estimate p as
    (b + 1) / (samples + 1), where b counts draws at least as extreme: the +1 counts the observed
    vector, which keeps the Monte Carlo p-value valid (never 0). Record `seed` and `samples` with
    any reported p. Empty input or all zeros gives p = 1.
    """
    data = _finite_vector("differences", differences)
    max_exact = _count("max_exact", max_exact)
    if max_exact > _MAX_EXACT_LIMIT:
        raise ValueError(f"max_exact must be an integer between 0 and {_MAX_EXACT_LIMIT}, got {max_exact}")
    samples = _count("samples", samples, minimum=1)
    seed = _count("seed", seed)

    data = data[data != 0.0]
    if data.size == 0:
        return 1.0
    threshold = abs(float(data.sum())) - _TIE_TOLERANCE * float(np.abs(data).sum())
    if threshold <= 0.0:
        # The observed sum is (numerically) zero, the least extreme value possible: every vector ties.
        return 1.0

    n = int(data.size)
    if n <= max_exact:
        # Meet in the middle instead of materialising all 2^n vectors: each full signed sum is
        # a + b with a from the first half's 2^h sums and b from the second half's. Sorting the
        # second half lets binary search count, for every a, the b with a + b >= t or a + b <= -t.
        # The two events are disjoint because t > 0. Cost: O(2^(n/2) log), a few ms at n = 20.
        half = n // 2
        left = _signed_sums(data[:half])
        right = np.sort(_signed_sums(data[half:]))
        upper = right.size - np.searchsorted(right, threshold - left, side="left")
        lower = np.searchsorted(right, -threshold - left, side="right")
        extreme = int(upper.sum() + lower.sum())
        return extreme / 2**n

    rng = np.random.default_rng(seed)
    rows_per_block = max(1, _BLOCK_CELLS // n)
    extreme, done = 0, 0
    while done < samples:
        rows = min(rows_per_block, samples - done)
        signs = np.where(rng.integers(0, 2, size=(rows, n), dtype=np.int8) == 1, 1.0, -1.0)
        extreme += int(np.count_nonzero(np.abs(signs @ data) >= threshold))
        done += rows
    return (extreme + 1) / (samples + 1)


# --------------------------------------------------------------------------- bootstrap


def _equal_tail_ranks(resamples: int, level: float) -> tuple[int, int]:
    """0-based positions in the sorted bootstrap statistics of the (lower, upper) CI endpoints.

    The k-th smallest and the k-th largest with k = floor((N + 1) * (1 - level) / 2), the order
    statistics (N+1)a/2 and (N+1)(1-a/2) of Davison & Hinkley (1997, §5.2.2). Both tails then hold
    the same k - 1 values. The original's floor(0.025N) / floor(0.975N) as 0-based indices left 1250
    values below but 1249 above at N = 50,000, and its sibling scripts each used different indices.
    """
    def tail_count(n: int) -> int:
        # The 1e-9 guard stops binary rounding from turning e.g. 10000 * 0.1 / 2 into 499.99...
        return math.floor((n + 1) * (1.0 - level) / 2.0 + 1e-9)

    k = tail_count(resamples)
    if k < 1:
        needed = max(1, math.ceil(2.0 / (1.0 - level)) - 2)
        while tail_count(needed) < 1:
            needed += 1
        raise ValueError(
            f"resamples={resamples} is too few for level={level}: need at least {needed} so each tail holds a value"
        )
    return k - 1, resamples - k


def bootstrap_ci(
    values: Sequence[float],
    *,
    statistic: Callable[..., np.ndarray] = np.mean,
    level: float = 0.95,
    resamples: int = 10_000,
    seed: int = 0,
) -> tuple[float, float]:
    """Percentile bootstrap confidence interval for `statistic` over independent units.

    Resamples indices with replacement from `np.random.default_rng(seed)` and evaluates
    `statistic(sample_block, axis=1)` on blocks of resamples, so `statistic` must reduce along
    `axis` like the numpy reductions (np.mean, np.median, ...). The endpoints are the equal-tailed
    order statistics described in `_equal_tail_ranks`.

    Caution: the percentile bootstrap under-covers with few units (at n = 10 the original's CI
    excluded 0 while the exact test gave p = 0.21). Use it to describe an effect's size; test with
    `sign_flip_p` or `mcnemar_exact`.
    """
    data = _finite_vector("values", values)
    if data.size == 0:
        raise ValueError("values must hold at least one number, got an empty sequence")
    if not callable(statistic):
        raise ValueError(f"statistic must be callable like np.mean, got {statistic!r}")
    level = _open_unit("level", level)
    resamples = _count("resamples", resamples, minimum=1)
    seed = _count("seed", seed)
    low_rank, high_rank = _equal_tail_ranks(resamples, level)

    n = int(data.size)
    rng = np.random.default_rng(seed)
    rows_per_block = max(1, _BLOCK_CELLS // n)
    draws = np.empty(resamples)
    done = 0
    while done < resamples:
        rows = min(rows_per_block, resamples - done)
        block = data[rng.integers(0, n, size=(rows, n))]  # [rows, n]
        result = np.asarray(statistic(block, axis=1), dtype=float)
        if result.shape != (rows,):
            raise ValueError(f"statistic must reduce [resamples, n] to [resamples] along axis=1, got shape {result.shape}")
        draws[done : done + rows] = result
        done += rows
    if not np.all(np.isfinite(draws)):
        raise ValueError("statistic returned a non-finite value on a bootstrap resample")
    ordered = np.partition(draws, (low_rank, high_rank))
    return float(ordered[low_rank]), float(ordered[high_rank])


def paired_bootstrap_ci(
    before: Sequence[float],
    after: Sequence[float],
    *,
    level: float = 0.95,
    resamples: int = 10_000,
    seed: int = 0,
) -> tuple[float, float]:
    """Percentile bootstrap CI of the mean paired difference (after - before).

    The unit resampled is the pair (a task or a seed), so the correlation between the two
    conditions on the same unit is kept. Booleans count as 0/1, which turns pass/fail vectors into
    a CI for the difference in pass rates.
    """
    first = _finite_vector("before", before)
    second = _finite_vector("after", after)
    if first.size != second.size:
        raise ValueError(f"before and after must have the same length, got {first.size} and {second.size}")
    return bootstrap_ci(second - first, statistic=np.mean, level=level, resamples=resamples, seed=seed)


# --------------------------------------------------------------------------- multiplicity


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm-Bonferroni adjusted p-values, returned in the input order.

    The i-th smallest of m p-values (i from 0) is multiplied by m - i; a running maximum keeps the
    adjusted values monotone in the raw ones, and they are capped at 1. Rejecting every hypothesis
    with adjusted p <= alpha controls the family-wise error rate at alpha.
    """
    raw = _finite_vector("p_values", p_values)
    outside = np.flatnonzero((raw < 0.0) | (raw > 1.0))
    if outside.size:
        raise ValueError(f"p_values must lie in [0, 1], got {raw[outside[0]]!r} at index {int(outside[0])}")
    m = int(raw.size)
    order = np.argsort(raw, kind="stable")
    scaled = raw[order] * (m - np.arange(m))
    adjusted_sorted = np.minimum(1.0, np.maximum.accumulate(scaled))
    adjusted = np.empty(m)
    adjusted[order] = adjusted_sorted
    return [float(p) for p in adjusted]


# --------------------------------------------------------------------------- rates and planning


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples of which c passed: 1 - C(n-c, k) / C(n, k).

    This is the probability that a random k-subset of the n samples holds at least one pass
    (Chen et al. 2021), unlike the original's "any of k" rate. The ratio of binomials is computed
    as prod_{i=n-c+1}^{n} (1 - k/i), which never forms the huge coefficients. When fewer than k
    samples failed, every k-subset contains a pass: 1.0.
    """
    n = _count("n", n, minimum=1)
    c = _count("c", c)
    k = _count("k", k, minimum=1)
    if c > n:
        raise ValueError(f"c must be between 0 and n={n}, got {c}")
    if k > n:
        raise ValueError(f"k must be between 1 and n={n}, got {k}")
    if n - c < k:
        return 1.0
    none_pass = 1.0
    for i in range(n - c + 1, n + 1):
        none_pass *= 1.0 - k / i
    return 1.0 - none_pass


def wilson_interval(successes: int, total: int, level: float = 0.95) -> tuple[float, float]:
    """Wilson score interval for a binomial rate successes / total.

    Unlike the Wald interval it stays inside [0, 1] and keeps sensible coverage near 0 and 1, which
    is where small-model pass rates live. The endpoints are exactly 0 or 1 at the extremes.
    """
    successes = _count("successes", successes)
    total = _count("total", total, minimum=1)
    if successes > total:
        raise ValueError(f"successes must be between 0 and total={total}, got {successes}")
    level = _open_unit("level", level)
    z = NormalDist().inv_cdf(0.5 + level / 2.0)
    rate = successes / total
    z2_n = z * z / total
    centre = (rate + z2_n / 2.0) / (1.0 + z2_n)
    half_width = z / (1.0 + z2_n) * math.sqrt(rate * (1.0 - rate) / total + z2_n / (4.0 * total))
    low = 0.0 if successes == 0 else max(0.0, centre - half_width)
    high = 1.0 if successes == total else min(1.0, centre + half_width)
    return low, high


def minimum_detectable_effect(
    n_pairs: int,
    sd_difference: float,
    alpha: float = 0.05,
    power: float = 0.8,
) -> float:
    """Smallest true mean paired difference a two-sided test at `alpha` detects with `power`.

    Normal approximation: MDE = (z_{1-alpha/2} + z_{power}) * sd_difference / sqrt(n_pairs), where
    sd_difference is the standard deviation of the per-pair differences (from a pilot). With fewer
    than about 30 pairs the t distribution makes the real MDE larger, so treat this as optimistic.
    For paired pass/fail outcomes sd_difference = sqrt(p_discordant - mean_difference^2).
    """
    n_pairs = _count("n_pairs", n_pairs, minimum=1)
    if isinstance(sd_difference, (bool, np.bool_)) or not isinstance(
        sd_difference, (int, float, np.integer, np.floating)
    ):
        raise ValueError(f"sd_difference must be a finite number >= 0, got {sd_difference!r}")
    sd = float(sd_difference)
    if not math.isfinite(sd) or sd < 0.0:
        raise ValueError(f"sd_difference must be a finite number >= 0, got {sd_difference!r}")
    alpha = _open_unit("alpha", alpha)
    power = _open_unit("power", power)
    normal = NormalDist()
    return (normal.inv_cdf(1.0 - alpha / 2.0) + normal.inv_cdf(power)) * sd / math.sqrt(n_pairs)


# --------------------------------------------------------------------------- Student's t, equivalence, power


def _continued_fraction_beta(a: float, b: float, x: float) -> float:
    """The continued fraction of the regularized incomplete beta function, evaluated by the modified
    Lentz method (converges quickly for x < (a + 1) / (a + b + 2))."""
    tiny = 1e-300
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    result = d
    for m in range(1, 400):
        # even step: m (b - m) x / ((a + 2m - 1)(a + 2m))
        numerator = m * (b - m) * x / ((a + 2 * m - 1.0) * (a + 2 * m))
        d = 1.0 + numerator * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + numerator / c
        c = c if abs(c) > tiny else tiny
        result *= d * c
        # odd step: -(a + m)(a + b + m) x / ((a + 2m)(a + 2m + 1))
        numerator = -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1.0))
        d = 1.0 + numerator * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + numerator / c
        c = c if abs(c) > tiny else tiny
        step = d * c
        result *= step
        if abs(step - 1.0) < 1e-15:
            break
    return result


def regularized_beta(a: float, b: float, x: float) -> float:
    """I_x(a, b), the regularized incomplete beta function, for a, b > 0 and 0 <= x <= 1."""
    if not (a > 0 and b > 0) or not 0.0 <= x <= 1.0:
        raise ValueError(f"regularized_beta needs a, b > 0 and 0 <= x <= 1, got a={a}, b={b}, x={x}")
    if x == 0.0 or x == 1.0:
        return x
    log_front = (math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x)
                 + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(log_front) * _continued_fraction_beta(a, b, x) / a
    return 1.0 - math.exp(log_front) * _continued_fraction_beta(b, a, 1.0 - x) / b


def _degrees(df: object) -> float:
    if isinstance(df, (bool, np.bool_)) or not isinstance(df, (int, float, np.integer, np.floating)) \
            or not math.isfinite(float(df)) or float(df) <= 0:
        raise ValueError(f"degrees of freedom must be a finite number > 0, got {df!r}")
    return float(df)


def student_t_cdf(t: float, df: float) -> float:
    """P(T <= t) for Student's t with `df` degrees of freedom."""
    df = _degrees(df)
    if math.isinf(t):
        return 1.0 if t > 0 else 0.0
    tail = 0.5 * regularized_beta(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t > 0 else tail


def student_t_quantile(p: float, df: float) -> float:
    """The t with P(T <= t) = p (bisection on the CDF, to about 1e-12)."""
    p = _open_unit("p", p)
    df = _degrees(df)
    if p == 0.5:
        return 0.0
    if p < 0.5:
        return -student_t_quantile(1.0 - p, df)
    low, high = 0.0, 1.0
    while student_t_cdf(high, df) < p:
        low, high = high, high * 2.0
    for _ in range(200):
        middle = 0.5 * (low + high)
        if student_t_cdf(middle, df) < p:
            low = middle
        else:
            high = middle
        if high - low <= 1e-12 * max(1.0, high):
            break
    return 0.5 * (low + high)


def _mean_and_error(values: Sequence[float], name: str = "values") -> tuple[float, float, int]:
    data = _finite_vector(name, values)
    n = int(data.size)
    if n < 2:
        raise ValueError(f"{name} needs at least 2 independent values, got {n}")
    mean = float(data.mean())
    error = float(data.std(ddof=1)) / math.sqrt(n)
    # equal values give an error of a few ulps, not 0: count it as none
    if error <= 1e-12 * max(1.0, float(np.abs(data).max())):
        error = 0.0
        mean = float(data[0]) if np.all(data == data[0]) else mean
    return mean, error, n


def t_test_p(values: Sequence[float], reference: float = 0.0) -> float:
    """Two-sided one-sample t-test of "mean = reference" (over seeds, or units). Equal values give
    p = 1 when they equal the reference and 0 otherwise."""
    mean, error, n = _mean_and_error(values)
    if error == 0.0:
        return 1.0 if mean == reference else 0.0
    t = (mean - reference) / error
    return min(1.0, 2.0 * student_t_cdf(-abs(t), n - 1))


def t_interval(values: Sequence[float], level: float = 0.95) -> tuple[float, float]:
    """The t confidence interval of the mean of independent values."""
    level = _open_unit("level", level)
    mean, error, n = _mean_and_error(values)
    half = student_t_quantile(0.5 + level / 2.0, n - 1) * error
    return mean - half, mean + half


def equivalence_test(values: Sequence[float], *, reference: float = 0.0, margin: float,
                     alpha: float = 0.05) -> dict:
    """Two one-sided t-tests (TOST) of "the mean lies within reference +- margin", over independent
    values (seeds or units). Equivalence is shown when both one-sided nulls (mean <= reference - margin,
    mean >= reference + margin) are rejected at `alpha`: p = the larger one-sided p, and the
    (1 - 2 alpha) interval lies inside the margin. The margin must be stated before the data are seen."""
    if isinstance(margin, bool) or not isinstance(margin, (int, float)) or not margin > 0 or not math.isfinite(margin):
        raise ValueError(f"margin must be a finite number > 0, got {margin!r}")
    alpha = _open_unit("alpha", alpha)
    mean, error, n = _mean_and_error(values)
    low_bound, high_bound = reference - margin, reference + margin
    if error == 0.0:
        p_lower = 0.0 if mean > low_bound else 1.0
        p_upper = 0.0 if mean < high_bound else 1.0
        interval = (mean, mean)
    else:
        p_lower = 1.0 - student_t_cdf((mean - low_bound) / error, n - 1)
        p_upper = student_t_cdf((mean - high_bound) / error, n - 1)
        half = student_t_quantile(1.0 - alpha, n - 1) * error
        interval = (mean - half, mean + half)
    p = max(p_lower, p_upper)
    return {"n": n, "mean": mean, "reference": reference, "margin": margin, "alpha": alpha,
            "p_lower": p_lower, "p_upper": p_upper, "p": p, "equivalent": p < alpha,
            "interval": list(interval), "interval_level": 1.0 - 2.0 * alpha,
            "method": "two one-sided t-tests (TOST) over independent values"}


def welch_comparison(first: Sequence[float], second: Sequence[float], *, margin: float,
                     alpha: float = 0.05) -> dict:
    """How far the mean of `second` lies from the mean of `first`, two independent samples (the seeds
    of a study and of its rerun): Welch's t with Welch-Satterthwaite degrees of freedom. Gives the
    difference (second - first), the two-sided p of "no difference", its (1 - 2 alpha) interval, and
    equivalence within +- margin by two one-sided tests (shown when the interval lies inside the
    margin); `smallest_margin` is the largest |bound| of that interval, the tightest margin these data
    could show. The margin must be stated before the data are seen."""
    if isinstance(margin, bool) or not isinstance(margin, (int, float)) or not margin > 0 or not math.isfinite(margin):
        raise ValueError(f"margin must be a finite number > 0, got {margin!r}")
    alpha = _open_unit("alpha", alpha)
    mean_a, error_a, n_a = _mean_and_error(first, "first")
    mean_b, error_b, n_b = _mean_and_error(second, "second")
    difference = mean_b - mean_a
    variance = error_a ** 2 + error_b ** 2
    if variance == 0.0:
        p = 1.0 if difference == 0.0 else 0.0
        p_lower = 0.0 if difference > -margin else 1.0
        p_upper = 0.0 if difference < margin else 1.0
        df, interval = None, (difference, difference)
    else:
        error = math.sqrt(variance)
        # Welch-Satterthwaite: the error terms weighted by their own degrees of freedom
        df = variance ** 2 / (error_a ** 4 / (n_a - 1) + error_b ** 4 / (n_b - 1))
        p = min(1.0, 2.0 * student_t_cdf(-abs(difference) / error, df))
        p_lower = 1.0 - student_t_cdf((difference + margin) / error, df)
        p_upper = student_t_cdf((difference - margin) / error, df)
        half = student_t_quantile(1.0 - alpha, df) * error
        interval = (difference - half, difference + half)
    tost = max(p_lower, p_upper)
    return {"n": [n_a, n_b], "means": [mean_a, mean_b], "difference": difference, "df": df, "p": p,
            "interval": list(interval), "interval_level": 1.0 - 2.0 * alpha, "margin": margin, "alpha": alpha,
            "tost_p": tost, "equivalent": tost < alpha, "smallest_margin": max(abs(interval[0]), abs(interval[1])),
            "method": "Welch's t over two independent samples; equivalence by two one-sided tests"}


def sign_flip_floor(n: int) -> float:
    """The smallest p the exact two-sided sign-flip test over `n` non-zero values can give: 2/2^n (1 for
    no values), computed without overflow for any n (2.0 ** 1030 is out of a float's range)."""
    return min(1.0, math.ldexp(1.0, 1 - _count("n", n)))


def minimum_detectable_difference(n: int, sd: float, alpha: float = 0.05, power: float = 0.8,
                                  test: str = "t") -> float | None:
    """The smallest true mean difference a two-sided paired test over `n` independent values (units
    or seeds) detects with `power` at `alpha`, for differences of standard deviation `sd`.

    test="t" (and "sign-flip", whose power the t-test's stands for) solves the exact noncentral t: the
    noncentrality delta with P(|T'(n-1, delta)| > t_{1-alpha/2, n-1}) = power, returned as delta sd / sqrt(n).
    test="z" is the normal approximation (z_{1-alpha/2} + z_power) sd / sqrt(n), which understates small n.
    None when no effect can be detected: fewer than 2 values, or test="sign-flip" with 2/2^n > alpha (the
    exact sign-flip test's smallest p), in which case even differences all of one sign are not significant."""
    n = _count("n", n)
    alpha = _open_unit("alpha", alpha)
    power = _open_unit("power", power)
    if isinstance(sd, bool) or not isinstance(sd, (int, float)) or not sd >= 0 or not math.isfinite(sd):
        raise ValueError(f"sd must be a finite number >= 0, got {sd!r}")
    if test not in ("t", "z", "sign-flip"):
        raise ValueError(f"test must be 't', 'z' or 'sign-flip', got {test!r}")
    if n < 2 or (test == "sign-flip" and sign_flip_floor(n) > alpha):
        return None
    if test == "z":
        normal = NormalDist()
        return (normal.inv_cdf(1.0 - alpha / 2.0) + normal.inv_cdf(power)) * float(sd) / math.sqrt(n)
    return noncentral_t_delta(n - 1, alpha, power) * float(sd) / math.sqrt(n)


def noncentral_t_delta(df: int, alpha: float, power: float) -> float:
    """The noncentrality at which a two-sided t-test with `df` degrees of freedom rejects at `alpha` with
    probability `power` (scipy's noncentral t; both tails counted)."""
    from scipy.optimize import brentq
    from scipy.stats import nct, t

    critical = t.ppf(1.0 - alpha / 2.0, df)

    def shortfall(delta: float) -> float:
        lower = nct.cdf(-critical, df, delta)  # the far tail: nan where it underflows
        return nct.sf(critical, df, delta) + (0.0 if math.isnan(lower) else lower) - power

    high = 2.0 * critical
    while shortfall(high) < 0:
        high *= 1.5
    return brentq(shortfall, 0.0, high, xtol=1e-12)


def minimum_equivalence_margin(n: int, sd: float, alpha: float = 0.05, power: float = 0.8) -> float | None:
    """The smallest margin TOST over `n` values shows equivalence for with `power` when the true
    difference is 0: (t_{1-alpha, n-1} + t_{1-(1-power)/2, n-1}) sd / sqrt(n); None below 2 values."""
    n = _count("n", n)
    alpha = _open_unit("alpha", alpha)
    power = _open_unit("power", power)
    if n < 2:
        return None
    quantiles = student_t_quantile(1.0 - alpha, n - 1) + student_t_quantile(1.0 - (1.0 - power) / 2.0, n - 1)
    return quantiles * float(sd) / math.sqrt(n)


def _seeds_and_units(differences: dict, minimum: int = 1) -> tuple[list, list]:
    """The seeds of `differences[seed][unit]` (at least `minimum`) and its units, sorted; every seed must
    cover the same units."""
    if not isinstance(differences, dict) or len(differences) < minimum or not differences:
        raise ValueError("differences must map each seed to {unit: difference}"
                         + (f", at least {minimum} seeds" if minimum > 1 else ""))
    seeds = list(differences)
    units = sorted(differences[seeds[0]])
    for key in seeds:
        if sorted(differences[key]) != units:
            raise ValueError(f"seed {key!r} covers other units than seed {seeds[0]!r}")
    return seeds, units


def two_level_comparison(differences: dict, *, alpha: float = 0.05, resamples: int = 10_000,
                         seed: int = 0) -> dict:
    """A paired comparison at both levels that vary: `differences[seed][unit]` is the difference of one
    unit (a behaviour) under one seed (a pretraining or RL seed). Units: each unit's difference averaged
    over seeds, the exact sign-flip test over units and a bootstrap CI over units. Seeds: each seed's
    difference averaged over units, a t-test over seeds (the exact sign-flip p beside it; its floor is
    2/2^n). "better"/"worse" needs both levels significant at `alpha` with the same sign; otherwise
    "not shown". Every seed must cover the same units."""
    seeds, units = _seeds_and_units(differences)
    if not units:
        raise ValueError("no units to compare")
    per_unit = [float(np.mean([differences[k][u] for k in seeds])) for u in units]
    per_seed = [float(np.mean([differences[k][u] for u in units])) for k in seeds]
    unit_p = sign_flip_p(per_unit, seed=seed)
    unit_ci = bootstrap_ci(per_unit, level=1.0 - alpha, resamples=resamples, seed=seed)
    seed_level = {"n": len(seeds), "values": per_seed, "mean": float(np.mean(per_seed)),
                  "sign_flip_p": sign_flip_p(per_seed, seed=seed), "sign_flip_floor": sign_flip_floor(len(seeds))}
    if len(seeds) >= 2:
        seed_level["t_test_p"] = t_test_p(per_seed)
        seed_level["interval"] = list(t_interval(per_seed, 1.0 - alpha)) if np.std(per_seed) > 0 else \
            [seed_level["mean"], seed_level["mean"]]
    else:
        seed_level["t_test_p"] = None
        seed_level["interval"] = None
    mean = float(np.mean(per_unit))
    unit_significant = unit_p < alpha
    seed_significant = seed_level["t_test_p"] is not None and seed_level["t_test_p"] < alpha
    same_sign = np.sign(mean) == np.sign(seed_level["mean"]) != 0
    verdict = ("better" if mean > 0 else "worse") if unit_significant and seed_significant and same_sign \
        else "not shown"
    return {"mean_difference": mean, "verdict": verdict, "alpha": alpha,
            "units": {"n": len(units), "mean": mean, "sign_flip_p": unit_p, "interval": list(unit_ci),
                      "positive": sum(d > 0 for d in per_unit), "negative": sum(d < 0 for d in per_unit)},
            "seeds": seed_level,
            "method": "units: each unit's difference averaged over seeds, exact sign-flip over units, "
                      "bootstrap CI; seeds: each seed's difference averaged over units, t-test over seeds; "
                      "a direction needs both levels"}


def group_means(differences: dict, group: dict) -> dict:
    """`differences[seed][unit]` -> `{seed: {group: the mean of its units' differences}}`, each unit's group
    read from `group` (unit -> group): the table a comparison over groups takes, units that are not
    independent (the behaviours of one structure group) counted once, as their group."""
    out = {}
    for seed, values in differences.items():
        sums: dict = {}
        for unit, value in values.items():
            if unit not in group:
                raise ValueError(f"unit {unit!r} has no group")
            entry = sums.setdefault(group[unit], [0.0, 0])
            entry[0] += value
            entry[1] += 1
        out[seed] = {key: total / count for key, (total, count) in sums.items()}
    return out


def crossed_comparison(differences: dict, alpha: float = 0.05) -> dict:
    """The grand mean of `differences[seed][unit]` (every seed covering the same units) tested with seeds and
    units both random at once, as draws from their populations: the two-way random-effects model without
    replication, d = mean + seed + unit + residual. The variance of the grand mean, var_seed / S + var_unit / U
    + var_residual / (S U), is estimated from the mean squares, a negative component counting as zero:
    (max(MS_seed, MS_res) + max(MS_unit, MS_res) - MS_res) / (S U); the t-test and its (1 - alpha) interval
    take Satterthwaite's degrees of freedom for that sum. Needs two seeds and two units."""
    alpha = _open_unit("alpha", alpha)
    seeds, units = _seeds_and_units(differences, minimum=2)
    if len(units) < 2:
        raise ValueError("need at least two units")
    table = np.array([[float(differences[key][u]) for u in units] for key in seeds])  # [S, U]
    n_seeds, n_units = table.shape
    mean = float(table.mean())
    seed_means, unit_means = table.mean(axis=1), table.mean(axis=0)
    df_seed, df_unit, df_residual = n_seeds - 1, n_units - 1, (n_seeds - 1) * (n_units - 1)
    ms_seed = float(n_units * ((seed_means - mean) ** 2).sum() / df_seed)
    ms_unit = float(n_seeds * ((unit_means - mean) ** 2).sum() / df_unit)
    residual = table - seed_means[:, None] - unit_means[None, :] + mean
    ms_residual = float((residual ** 2).sum() / df_residual)
    # the mean squares in the estimate, with their signs and degrees of freedom (a component below zero is
    # dropped with the residual's share that it would have cancelled)
    terms = [(1.0, ms, df) for ms, df in ((ms_seed, df_seed), (ms_unit, df_unit)) if ms > ms_residual]
    terms.append((1.0 - len(terms), ms_residual, df_residual))
    combined = sum(sign * ms for sign, ms, _ in terms)
    error = math.sqrt(combined / (n_seeds * n_units)) if combined > 0 else 0.0
    if error == 0.0:
        df, p, interval = None, (1.0 if mean == 0.0 else 0.0), [mean, mean]
    else:
        df = combined ** 2 / sum((sign * ms) ** 2 / d for sign, ms, d in terms if sign)
        p = min(1.0, 2.0 * student_t_cdf(-abs(mean) / error, df))
        half = student_t_quantile(1.0 - alpha / 2.0, df) * error
        interval = [mean - half, mean + half]
    return {"mean": mean, "se": error, "df": df, "t_test_p": p, "interval": interval, "alpha": alpha,
            "seeds": n_seeds, "units": n_units,
            "variance_components": {"seed": max(ms_seed - ms_residual, 0.0) / n_units,
                                    "unit": max(ms_unit - ms_residual, 0.0) / n_seeds, "residual": ms_residual},
            "method": "seeds and units both random (two-way random-effects ANOVA without replication): the grand "
                      "mean's variance from the mean squares, negative components at zero; t-test on "
                      "Satterthwaite's degrees of freedom"}


def holm_verdicts(comparisons: Sequence[dict], alpha: float = 0.05) -> list[dict]:
    """Holm over a family of two_level_comparison results, at each level separately: per comparison its
    adjusted p over units (the sign-flip test's) and over seeds (the t-test's; none counts as 1), and its
    verdict after the correction: "better" or "worse" when both adjusted p are below alpha and both levels'
    means have that sign, else "not shown"."""
    comparisons = list(comparisons)
    if not comparisons:
        return []
    units = holm([c["units"]["sign_flip_p"] for c in comparisons])
    seeds = holm([1.0 if c["seeds"]["t_test_p"] is None else c["seeds"]["t_test_p"] for c in comparisons])
    out = []
    for c, unit_p, seed_p in zip(comparisons, units, seeds):
        same = np.sign(c["units"]["mean"]) == np.sign(c["seeds"]["mean"]) != 0
        verdict = ("better" if c["units"]["mean"] > 0 else "worse") if unit_p < alpha and seed_p < alpha and same \
            else "not shown"
        out.append({"units": unit_p, "seeds": seed_p, "verdict": verdict, "comparisons": len(comparisons)})
    return out


def detectable_differences(differences: dict, alpha: float = 0.05, power: float = 0.8) -> dict:
    """What the data of a two_level_comparison (the same `differences[seed][unit]`) could have shown: at
    each level, the smallest true difference its test detects with `power` at `alpha` given the spread
    it measured (the t approximation, also for the sign-flip test over units); None where a level has
    fewer than two values."""
    seeds = list(differences)
    units = sorted(differences[seeds[0]]) if seeds else []
    per_unit = [float(np.mean([differences[k][u] for k in seeds])) for u in units]
    per_seed = [float(np.mean([differences[k][u] for u in units])) for k in seeds] if units else []
    out = {}
    for level, values in (("units", per_unit), ("seeds", per_seed)):
        sd = float(np.std(values, ddof=1)) if len(values) >= 2 else None
        out[level] = None if sd is None else minimum_detectable_difference(len(values), sd, alpha, power, "t")
        out[f"{level}_sd"] = sd
    return {**out, "alpha": alpha, "power": power, "method": "minimum_detectable_difference from the measured sd"}


def factorial_effects(runs: Sequence[dict], factors: Sequence[str], alpha: float = 0.05) -> dict:
    """Main effects of a two-level factorial design by ordinary least squares. Each run is
    {"block": key, "levels": {factor: 0 or 1}, "value": y}; the model is a mean per block plus one
    coefficient per factor on the level coded -1/2 and +1/2, so a coefficient is the difference "level 1
    minus level 0" (in a balanced design, the difference of the two groups' means). Everything the model
    leaves out (interactions, noise) is the residual: its variance over N - rank degrees of freedom gives
    each coefficient's standard error, a two-sided t-test and a (1 - alpha) interval."""
    factors = list(factors)
    if not runs or not factors:
        raise ValueError("need runs and factors")
    blocks = sorted({str(run["block"]) for run in runs})
    rows, values = [], []
    for run in runs:
        levels = run["levels"]
        if sorted(levels) != sorted(factors) or any(levels[f] not in (0, 1) for f in factors):
            raise ValueError(f"each run needs a level of 0 or 1 for every factor ({', '.join(factors)}), got {levels}")
        rows.append([1.0 if str(run["block"]) == b else 0.0 for b in blocks] + [levels[f] - 0.5 for f in factors])
        values.append(float(run["value"]))
    x, y = np.array(rows), _finite_vector("values", values)
    coefficients, _, rank, _ = np.linalg.lstsq(x, y, rcond=None)
    residual = y - x @ coefficients
    df = len(y) - int(rank)
    sd = float(math.sqrt(float(residual @ residual) / df)) if df > 0 else None
    covariance = np.linalg.pinv(x.T @ x) * (sd ** 2 if sd is not None else float("nan"))
    effects = {}
    for index, factor in enumerate(factors):
        column = len(blocks) + index
        estimate = float(coefficients[column])
        se = float(math.sqrt(max(covariance[column, column], 0.0))) if sd is not None else None
        if se is None:
            p, interval, t = None, None, None
        elif se == 0.0:
            p, interval, t = (1.0 if estimate == 0.0 else 0.0), [estimate, estimate], None
        else:
            t = estimate / se
            p = min(1.0, 2.0 * (1.0 - student_t_cdf(abs(t), df)))
            half = student_t_quantile(1.0 - alpha / 2.0, df) * se
            interval = [estimate - half, estimate + half]
        effects[factor] = {"estimate": estimate, "se": se, "t": t, "df": df, "p": 1.0 if p is None else p,
                           "interval": interval if interval is not None else [float("nan"), float("nan")]}
    return {"effects": effects, "residual_sd": sd, "df": df, "runs": len(y), "blocks": len(blocks),
            "method": "least squares: a mean per block and one coefficient per factor (levels coded -1/2, +1/2); "
                      "t-tests on the residual's degrees of freedom"}


def format_p(value: float) -> str:
    """A p-value for reports: three significant digits, scientific notation below 0.001."""
    return f"{value:.3g}" if value >= 1e-3 else f"{value:.2e}"


__all__ = [
    "bootstrap_ci",
    "crossed_comparison",
    "detectable_differences",
    "equivalence_test",
    "factorial_effects",
    "format_p",
    "group_means",
    "holm",
    "holm_verdicts",
    "mcnemar_exact",
    "minimum_detectable_difference",
    "minimum_detectable_effect",
    "minimum_equivalence_margin",
    "noncentral_t_delta",
    "paired_bootstrap_ci",
    "paired_counts",
    "pass_at_k",
    "regularized_beta",
    "sign_flip_floor",
    "sign_flip_p",
    "student_t_cdf",
    "student_t_quantile",
    "t_interval",
    "t_test_p",
    "two_level_comparison",
    "welch_comparison",
    "wilson_interval",
]
