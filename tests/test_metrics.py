"""experiments.metrics (classification, intervals, samples, selective prediction): each metric against a case
computed by hand or against scikit-learn / scipy, and its input checks."""

from __future__ import annotations

import math

import numpy as np
import pytest

from experiments import metrics

P = np.array([[0.7, 0.2, 0.1], [0.1, 0.1, 0.8], [0.5, 0.5, 0.0], [0.2, 0.6, 0.2]])
Y = np.array([0, 2, 2, 0])


def test_accuracy_by_hand():
    assert metrics.accuracy(P, Y) == 0.5  # right on rows 0 and 1
    assert metrics.accuracy(P, [0, 2, 0, 1]) == 1.0  # row 2's tie goes to the first class


def test_categorical_nll_by_hand_and_against_sklearn():
    from sklearn.metrics import log_loss

    expected = -(math.log(0.7) + math.log(0.8) + math.log(1e-12) + math.log(0.2)) / 4  # row 2: p[y] = 0, clipped
    assert metrics.categorical_nll(P, Y) == pytest.approx(expected, rel=1e-12)
    assert metrics.categorical_nll(P, Y, eps=1e-6) == pytest.approx(expected - (math.log(1e-6) - math.log(1e-12)) / 4)
    rng = np.random.default_rng(0)
    q = rng.dirichlet(np.ones(5), size=200)
    y = rng.integers(0, 5, 200)
    assert metrics.categorical_nll(q, y) == pytest.approx(log_loss(y, q, labels=range(5)), rel=1e-10)
    assert metrics.categorical_nll(np.eye(3), [0, 1, 2]) == 0.0


def test_brier_by_hand_and_against_sklearn():
    from sklearn.metrics import brier_score_loss

    rows = [0.3**2 + 0.2**2 + 0.1**2, 0.1**2 + 0.1**2 + 0.2**2, 0.5**2 + 0.5**2 + 1.0, 0.8**2 + 0.6**2 + 0.2**2]
    by_hand = sum(rows) / 4
    assert metrics.brier_score(P, Y) == pytest.approx(by_hand, rel=1e-12)
    assert metrics.brier_score(np.eye(4), np.arange(4)) == 0.0
    assert metrics.brier_score(np.eye(2)[[1, 0]], [0, 1]) == 2.0  # confidently wrong: the maximum
    rng = np.random.default_rng(1)
    p1 = rng.uniform(size=300)
    y = (rng.uniform(size=300) < p1).astype(int)
    two = np.stack([1 - p1, p1], 1)
    assert metrics.brier_score(two, y) == pytest.approx(2 * brier_score_loss(y, p1), rel=1e-12)


def _with_confidence(conf, correct, classes=4):
    """Rows whose top probability is ``conf`` (on class 0) and whose label is 0 when ``correct``."""
    conf = np.asarray(conf, float)
    p = np.column_stack([conf] + [(1 - conf) / (classes - 1)] * (classes - 1))
    return p, np.where(correct, 0, 1)


def test_ece_equal_width_and_equal_mass_by_hand():
    p, y = _with_confidence([0.3, 0.6, 0.7, 0.9], [False, True, False, True])
    # equal width, 2 bins: (0, .5] = {.3} -> |0 - .3| * 1/4; (.5, 1] = {.6, .7, .9} -> |2/3 - 11/15| * 3/4
    assert metrics.expected_calibration_error(p, y, bins=2) == pytest.approx(0.075 + 0.05, rel=1e-12)
    # equal mass, 2 bins: {.3, .6} -> |.5 - .45| * 1/2; {.7, .9} -> |.5 - .8| * 1/2
    assert metrics.expected_calibration_error(p, y, bins=2, binning="equal-mass") == pytest.approx(0.175, rel=1e-12)
    conf, acc, count = metrics.calibration_bins(p, y, bins=2, binning="equal-mass")
    np.testing.assert_allclose(conf, [0.45, 0.8])
    np.testing.assert_allclose(acc, [0.5, 0.5])
    np.testing.assert_array_equal(count, [2, 2])
    # a confidence on an edge belongs to the bin it closes: 0.5 is in (0, .5], not (.5, 1]
    p, y = _with_confidence([0.5, 0.5, 0.9], [True, True, False])
    conf, acc, count = metrics.calibration_bins(p, y, bins=2)
    np.testing.assert_allclose(conf, [0.5, 0.9])
    np.testing.assert_array_equal(count, [2, 1])
    assert metrics.expected_calibration_error(p, y, bins=2) == pytest.approx((2 * 0.5 + 0.9) / 3)
    # empty bins are skipped; equal mass with 5 points in 2 bins: sizes 3 and 2
    p, y = _with_confidence([0.15, 0.3, 0.4, 0.8, 0.95], [True] * 5, classes=10)
    assert list(metrics.calibration_bins(p, y, bins=10)[2]) == [1, 1, 1, 1, 1]
    assert list(metrics.calibration_bins(p, y, bins=2, binning="equal-mass")[2]) == [3, 2]
    # the default stays the equal-width, 15-bin ECE that existing callers use
    assert metrics.expected_calibration_error(p, y) == metrics.expected_calibration_error(p, y, 15, "equal-width")


def test_ece_of_calibrated_and_overconfident_predictions():
    rng = np.random.default_rng(2)
    n = 20000
    conf = rng.uniform(0.3, 1.0, n)
    correct = rng.uniform(size=n) < conf
    p, y = _with_confidence(conf, correct)
    for binning in metrics.BINNINGS:
        assert metrics.expected_calibration_error(p, y, binning=binning) < 0.02  # ~sqrt(bins / n) noise
        # overconfident by min(0.2, 0.999 - conf): the gap has one sign, so ECE is its mean (0.171) up to noise
        boosted = np.minimum(conf + 0.2, 0.999)
        over, _ = _with_confidence(boosted, correct)
        gap = float(np.mean(boosted - conf))
        assert metrics.expected_calibration_error(over, y, binning=binning) == pytest.approx(gap, abs=0.01)


def test_predictive_entropy_and_max_probability():
    from scipy.stats import entropy

    h = metrics.predictive_entropy([[0.5, 0.25, 0.25], [1.0, 0.0, 0.0], [1 / 3, 1 / 3, 1 / 3]])
    np.testing.assert_allclose(h, [1.5 * math.log(2), 0.0, math.log(3)], rtol=1e-12)
    q = np.random.default_rng(3).dirichlet(np.ones(7), size=50)
    np.testing.assert_allclose(metrics.predictive_entropy(q), entropy(q, axis=1), rtol=1e-12)
    np.testing.assert_array_equal(metrics.max_probability(P), [0.7, 0.8, 0.5, 0.6])


def test_ood_auroc_by_hand_and_against_sklearn():
    from sklearn.metrics import roc_auc_score

    score = np.array([0.1, 0.4, 0.35, 0.8, 0.4])
    is_ood = np.array([False, False, False, True, True])
    # pairs (ood, in): 0.8 beats all three; 0.4 beats 0.1 and 0.35 and ties 0.4 -> (3 + 2.5) / 6
    assert metrics.ood_auroc(score, is_ood) == pytest.approx(5.5 / 6)
    assert metrics.ood_auroc(score, is_ood.astype(int), higher_is_ood=False) == pytest.approx(0.5 / 6)
    # entropy separates confident in-distribution predictions from diffuse OOD ones
    rng = np.random.default_rng(4)
    p_in = rng.dirichlet(np.full(10, 0.1), size=300)
    p_out = rng.dirichlet(np.full(10, 1.0), size=100)
    p = np.concatenate([p_in, p_out])
    flags = np.r_[np.zeros(300, bool), np.ones(100, bool)]
    h = metrics.predictive_entropy(p)
    assert metrics.ood_auroc(h, flags) == pytest.approx(roc_auc_score(flags, h), rel=1e-12)
    assert metrics.ood_auroc(h, flags) > 0.9
    assert metrics.ood_auroc(metrics.max_probability(p), flags, higher_is_ood=False) > 0.9


def test_classification_input_errors():
    with pytest.raises(ValueError, match=r"probs must be \(n, classes\).*\(3,\)"):
        metrics.accuracy([0.2, 0.3, 0.5], [0])
    with pytest.raises(ValueError, match="3 labels for probs of shape"):
        metrics.categorical_nll(P[:2], [0, 1, 2])
    with pytest.raises(ValueError, match=r"labels must be in 0..2, got 0..3"):
        metrics.brier_score(P, [0, 1, 2, 3])
    with pytest.raises(ValueError, match="labels must be integers"):
        metrics.accuracy(P, [0, 1, 2, 0.5])
    with pytest.raises(ValueError, match="sum to 1"):
        metrics.expected_calibration_error(3 * P, Y)  # unnormalised scores, say
    with pytest.raises(ValueError, match="non-negative"):
        metrics.predictive_entropy([[1.5, -0.5]])
    with pytest.raises(ValueError, match="unknown binning 'quantile'.*equal-width, equal-mass"):
        metrics.expected_calibration_error(P, Y, binning="quantile")
    with pytest.raises(ValueError, match="bins must be a positive integer"):
        metrics.calibration_bins(P, Y, bins=0)
    with pytest.raises(ValueError, match="eps"):
        metrics.categorical_nll(P, Y, eps=0.0)
    with pytest.raises(ValueError, match="both in-distribution and OOD"):
        metrics.ood_auroc([0.1, 0.2], [False, False])
    with pytest.raises(ValueError, match="2 is_ood flags for 3 scores"):
        metrics.ood_auroc([0.1, 0.2, 0.3], [True, False])


# ---------------------------------------------------------------------------------------------------------------
# intervals, samples, epistemic uncertainty, selective prediction (issue 15)


def test_interval_metrics_hand_computed():
    y = np.array([0.0, 1.0, 5.0, -3.0])
    lo = np.array([-1.0, 0.0, 0.0, -2.0])
    hi = np.array([1.0, 2.0, 4.0, 2.0])
    assert metrics.picp(y, lo, hi) == metrics.coverage(y, lo, hi) == 0.5
    assert metrics.mpiw(lo, hi) == pytest.approx((2 + 2 + 4 + 4) / 4)
    # widths 2, 2, 4, 4; misses: y=5 above 4 by 1, y=-3 below -2 by 1; penalty 2/alpha = 40 each
    assert metrics.interval_score(y, lo, hi, alpha=0.05) == pytest.approx((12 + 40 + 40) / 4)
    with pytest.raises(ValueError, match="lo > hi"):
        metrics.interval_score(y, hi, lo)
    with pytest.raises(ValueError, match="alpha"):
        metrics.interval_score(y, lo, hi, alpha=1.5)
    with pytest.raises(ValueError, match="same number"):
        metrics.coverage(y[:3], lo, hi)
    with pytest.raises(ValueError, match="finite"):
        metrics.coverage(np.array([np.nan, 1, 2, 3]), lo, hi)


def test_interval_score_is_minimised_by_the_true_quantiles():
    from scipy.stats import norm

    y = np.random.default_rng(0).standard_normal(200_000)
    z = norm.ppf(0.975)
    scores = {w: metrics.interval_score(y, -w * z * np.ones_like(y), w * z * np.ones_like(y)) for w in (0.8, 1.0, 1.25)}
    assert scores[1.0] < scores[0.8] and scores[1.0] < scores[1.25]


def test_sample_crps_matches_pairwise_formula_and_gaussian_closed_form():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((40, 6))
    y = rng.standard_normal(6)
    brute = np.mean(np.abs(x - y).mean(0) - 0.5 * np.abs(x[:, None] - x[None]).mean((0, 1)))
    assert metrics.sample_crps(y, x) == pytest.approx(brute, rel=1e-12)
    # many samples of N(0, 1) at y = 0: CRPS = sigma (sqrt(2) phi(0) * 2 - 1/sqrt(pi)) = 2 phi(0) - 1/sqrt(pi)
    big = rng.standard_normal((40_000, 1))
    exact = 2 / np.sqrt(2 * np.pi) - 1 / np.sqrt(np.pi)
    assert metrics.sample_crps(np.zeros(1), big) == pytest.approx(exact, abs=0.01)
    # a point mass at the target scores 0
    assert metrics.sample_crps(np.array([2.0]), np.full((5, 1), 2.0)) == 0.0
    with pytest.raises(ValueError, match="targets"):
        metrics.sample_crps(y[:3], x)


def test_coverage_calibration_separates_calibrated_from_overconfident():
    rng = np.random.default_rng(2)
    y = rng.standard_normal(4000)
    samples = rng.standard_normal((400, 4000))
    good = metrics.coverage_calibration(y, samples)
    bad = metrics.coverage_calibration(y, 0.3 * samples)
    assert good["ece"] < 0.03
    assert bad["ece"] > 0.25
    assert len(good["observed"]) == len(good["levels"]) == 11
    with pytest.raises(ValueError, match="levels"):
        metrics.coverage_calibration(y, samples, levels=[0.5, 1.0])


def test_mutual_information_and_aupr():
    agree = np.tile(np.array([[0.7, 0.3]]), (5, 4, 1))
    np.testing.assert_allclose(metrics.mutual_information(agree), 0.0, atol=1e-12)
    disagree = np.array([[[1.0, 0.0]], [[0.0, 1.0]]])  # two confident members that disagree
    np.testing.assert_allclose(metrics.mutual_information(disagree), [np.log(2)], rtol=1e-12)
    with pytest.raises(ValueError, match="samples, n, classes"):
        metrics.mutual_information(agree[0])
    score = np.array([0.1, 0.2, 0.9, 0.8, 0.3])
    ood = np.array([0, 0, 1, 1, 0], bool)
    assert metrics.ood_aupr(score, ood) == 1.0
    from sklearn.metrics import average_precision_score

    noisy = np.array([0.1, 0.85, 0.9, 0.3, 0.2])
    assert metrics.ood_aupr(noisy, ood) == pytest.approx(average_precision_score(ood, noisy))
    assert metrics.ood_aupr(-noisy, ood, higher_is_ood=False) == pytest.approx(average_precision_score(ood, noisy))


def test_selective_risk_hand_computed():
    loss = np.array([1.0, 0.0, 0.0, 1.0])
    unc = np.array([0.9, 0.1, 0.2, 0.5])
    out = metrics.selective_risk(loss, unc, coverages=[0.25, 0.5, 0.75, 1.0])
    # sorted by uncertainty: losses 0, 0, 1, 1 -> running means 0, 0, 1/3, 1/2
    np.testing.assert_allclose(out["risk"], [0, 0, 1 / 3, 1 / 2])
    assert out["aurc"] == pytest.approx((0 + 0 + 1 / 3 + 1 / 2) / 4)
    with pytest.raises(ValueError, match="one length"):
        metrics.selective_risk(loss, unc[:3])
