"""Every fast path against the exact one at small N (issue 49): ``benchmarks/fastpath_audit.py``'s audit, in
process, at N = 200 with preconditioner rank 50 (so that LOVE's Krylov space is not invariant and SLQ estimates):
matrix-free means, variances (CG solves and LOVE), log ML (within 4 reported standard errors) and its gradient,
the mixed-precision path, importance sampling on the matrix-free path, joint draws with the same key, and the SVGP
at Z = X with its optimal q against the exact GP (mean, variance, ELBO against log ML), each within the audit's
stated tolerance of the dense float64 answer."""

import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def rows():
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    import fastpath_audit

    return fastpath_audit.audit(200, 10, precond_rank=50, love_rank=20, log=lambda s: None)


def test_every_fast_path_output_is_within_its_stated_tolerance(rows):
    audited = {(r["path"], r["output"]) for r in rows}
    assert audited == {("cg-solve", "mean"), ("cg-solve", "log_ml"), ("cg-solve", "variance"),
                       ("cg-love", "variance"), ("cg-grad", "gradient"), ("mixed", "mean"), ("mixed", "variance"),
                       ("mixed", "log_ml"), ("importance", "mean"), ("importance", "variance"),
                       ("importance", "log_ml"), ("cg-samples", "draws"), ("svgp-Z=X", "mean"),
                       ("svgp-Z=X", "variance"), ("svgp-Z=X", "elbo")}
    wrong = [r for r in rows if not r["ok"]]
    assert not wrong, wrong
    # the checks can fail: every error is a measured, nonzero difference from the dense path
    assert all(0 < r["error"] <= r["tol"] for r in rows), rows
