"""Exact regression posteriors of scale mixtures of NNGPs (paper section 3.1, notes 2.1-2.2).

Model, for training inputs X (N points), targets Y (N x C, C outputs sharing
one scale) and a kernel Kbar computed with last-layer variance 1::

    sigma^2 ~ H
    Y | sigma^2 ~ N(0, sigma^2 (Kbar + eps I))          noise_model="scaled"   (default, conjugate)
    Y | sigma^2 ~ N(0, sigma^2 Kbar + sigma_n^2 I)       noise_model="unscaled"

with H one of `smnngp.priors`. :func:`fit` factorises once and answers:

* ``H = Delta(s)`` (NNGP): Gaussian predictive, exact marginal likelihood;
* ``H = InverseGamma(a, b)`` with scaled noise (Student-t process):
  ``sigma^2 | Y ~ InvGamma(a + NC/2, b + q/2)``, ``q = tr(Y^T C^{-1} Y)``,
  ``f* | Y ~ MVT(2a + NC, m*, ((2b + q)/(2a + NC)) S*)`` and
  ``log p(Y) = lnG(a + NC/2) - lnG(a) - (NC/2) ln(2 pi b) - (C/2) ln|C| - (a + NC/2) ln(1 + q/(2b))``;
* any other prior, or unscaled noise: self-normalised importance sampling with
  the prior as proposal (notes 2.2).  Samples ``beta_s ~ H`` get weights
  ``p(Y | beta_s)``; one Cholesky (scaled noise) or one eigendecomposition of
  Kbar (unscaled noise) is shared by all samples, so S samples cost
  ``O(N^3 + S N)`` instead of ``O(S N^3)``.  The predictive density is the
  weighted Gaussian mixture, evaluated in log space.  Samples whose normalised
  weight is below ``exp(-60)`` are dropped before prediction (their total
  contribution is below ``S e^{-60}``, far under float64 resolution), which is
  what keeps 10^5 samples cheap.  The effective sample size is reported and a
  warning is raised when it is small.

Joint draws (:meth:`Posterior.sample_f`) share one sigma^2 over all test points
and outputs, as a multivariate t must (drawing each coordinate's t variate
independently, as the paper's code did, is a different distribution).

The three cases are three classes behind one interface, :class:`Posterior`
(``predict(x) ->`` a numpyro distribution, ``log_marginal_likelihood``,
``sample_f(key, x, num_samples)``), which `smnngp.variational`'s posteriors
share: :class:`GaussianPosterior`, :class:`StudentTPosterior` and
:class:`ImportancePosterior`.  Each is an immutable pytree (arrays as leaves,
configuration as static data), so a posterior is an argument and a result of
`jax.jit` and batches of posteriors are mapped over by `jax.vmap`.  Fitting
itself (:func:`fit`, :func:`fit_from_kernels`) runs on the host: it chooses the
jitter of a Cholesky, drops samples and warns about the effective sample size.

Layout of the package (split by concern; every public name is re-exported here, so ``smnngp.posterior.fit`` and
``from smnngp.posterior import Posterior`` are the import paths to use): ``_evaluators`` (`as_kernel_callable`,
the cached jitted kernel evaluators, checks of targets and noise), ``_marginal`` (the pure, traceable marginal
likelihoods and importance weights, `student_t_log_ml`, `gaussian_log_ml`, `scaled_log_weights`,
`unscaled_log_weights`), ``_mixture`` (`GaussianMixture`, `interval`), ``_posteriors`` (`Posterior` and its three
kinds), ``_from_kernels`` (`fit_from_kernels`, `log_marginal_likelihood`, `SmallESSWarning` and the steps from a
factorisation to a posterior that every path shares) and ``_fit`` (`fit`: the choice of method, the dense,
mixed-precision and matrix-free paths, `dense_copies`, `MIXED_CG`).
"""

# isort: off
# in the source order of the module before the split (the API page lists the members in this order)
from smnngp.posterior._from_kernels import SmallESSWarning
from smnngp.posterior._evaluators import as_kernel_callable
from smnngp.posterior._marginal import (
    student_t_log_ml as student_t_log_ml,
    gaussian_log_ml as gaussian_log_ml,
    scaled_log_weights as scaled_log_weights,
    unscaled_log_weights as unscaled_log_weights,
)
from smnngp.posterior._from_kernels import log_marginal_likelihood
from smnngp.posterior._mixture import GaussianMixture, interval
from smnngp.posterior._posteriors import Posterior, GaussianPosterior, StudentTPosterior, ImportancePosterior
from smnngp.posterior._fit import (
    fit,
    DENSE_COPIES as DENSE_COPIES,
    DENSE_COPIES_UNSCALED as DENSE_COPIES_UNSCALED,
    dense_copies as dense_copies,
    MIXED_CG as MIXED_CG,
)
from smnngp.posterior._from_kernels import fit_from_kernels
# isort: on
# names of the module before the split that tests and benchmarks reach for (not in __all__)
import numpyro.distributions as dist  # noqa: F401

from smnngp.posterior._evaluators import _evaluator as _evaluator
from smnngp.posterior._fit import _dense_factor as _dense_factor
from smnngp.posterior._posteriors import _PIECES as _PIECES

__all__ = [
    "fit",
    "fit_from_kernels",
    "Posterior",
    "GaussianPosterior",
    "StudentTPosterior",
    "ImportancePosterior",
    "GaussianMixture",
    "interval",
    "log_marginal_likelihood",
    "as_kernel_callable",
    "SmallESSWarning",
]
