"""Sparse variational Gaussian and Student-t processes: SVGP and SVTP (paper App. C, D; notes 2.3).

Model, for C latent functions sharing one kernel ``k`` and M inducing inputs Z::

    SVGP:  f_c ~ GP(0, k)                          u_c = f_c(Z) = L v_c,   L = chol(K_ZZ + jitter I)
    SVTP:  sigma^2 ~ InvGamma(alpha, beta),  f_c | sigma^2 ~ GP(0, sigma^2 k)   (one sigma^2 for all classes)

Variational family (whitened: q is placed on v = L^{-1} u, whose prior is N(0, I) or N(0, sigma^2 I)):

    SVGP:  q(v_c) = N(m_c, S_c S_c^T)
    SVTP:  q(v_c | sigma^2) = N(m_c, sigma^2 S_c S_c^T),   q(sigma^2) = InvGamma(a, b)

with ``S_c`` lower triangular (``q_diag=True``: diagonal), and f | v the prior conditional.  With
``A = L^{-1} K_ZX`` the marginal of f_c(x_i) given sigma^2 (SVGP: sigma^2 = 1) is Gaussian with::

    mean_ic = A_i^T m_c,    var_ic = sigma^2 v_ic,    v_ic = k(x_i, x_i) - |A_i|^2 + |S_c^T A_i|^2

(the mean is not scaled by sigma^2, as in App. D), so that for the SVTP
``q(f_c(x)) = MVT(2a, A^T m_c, (b/a)(K_XX - A^T A + A^T S_c S_c^T A))``.

ELBO (App. C, D), for a minibatch B of a data set of size N::

    ELBO = (N / |B|) sum_{i in B} E_q[log p(y_i | f_i)] - KL

* SVGP:  ``KL = sum_c 1/2 [tr(S_c S_c^T) + m_c^T m_c - M - log|S_c S_c^T|]``.
* SVTP:  ``KL(q(v, sigma^2) || p(v, sigma^2)) = KL(q(sigma^2) || p(sigma^2)) + E_q(sigma^2)[sum_c KL(q(v_c|sigma^2) ||
  p(v_c|sigma^2))]``.  Given sigma^2, both Gaussians have covariance proportional to sigma^2, which cancels
  in the trace and the log-determinant, leaving ``1/2 [tr(S_c S_c^T) + m_c^T m_c / sigma^2 - M -
  log|S_c S_c^T|]``; its only sigma^2-dependence is through ``E[1/sigma^2] = a / b``.  The inverse-gamma KL equals
  the KL of the gamma laws of the precision 1/sigma^2 (KL is invariant under the bijection):
  ``(a - alpha) psi(a) - lnG(a) + lnG(alpha) + alpha (ln b - ln beta) + a (beta - b) / b``.  Together::

      KL = sum_c 1/2 [tr(S_c S_c^T) + (a/b) m_c^T m_c - M - log|S_c S_c^T|] + KL_IG(a, b; alpha, beta)

  (the notes' formula after whitening, K_ZZ -> I).

Expected log-likelihoods: ``Gaussian`` in closed form, ``E[log N(y | f, s2)] = -1/2 log(2 pi s2) - ((y - mean)^2 +
var) / (2 s2)``; for the SVTP this is linear in sigma^2, so it is exact with ``E[sigma^2] = b / (a - 1)``, which
needs a > 1: with a Gaussian likelihood the SVTP keeps ``a = 1 + softplus(raw)``.  ``Bernoulli`` (probit link,
``p(y=1|f) = Phi(f)``) by Gauss-Hermite quadrature in f (deterministic for the SVGP).  ``Softmax`` by Monte Carlo
with reparameterised draws ``f = mean + sqrt(sigma^2 var) eps``.  For the SVTP (non-Gaussian likelihood) each of
``num_mc`` draws takes one ``sigma^2 = b / g``, ``g ~ Gamma(a, 1)``, shared by the whole minibatch and every class;
``jax.random.gamma`` is differentiable in its shape by implicit reparameterisation, so the gradients in (a, b) are
pathwise.

Predictions draw sigma^2 once per joint sample (a true multivariate t: all test points and classes share it).

API (``model`` is a static, hashable description; ``params`` a pytree of arrays)::

    svgp(kernel, likelihood, inducing_inputs, *, num_latent=None, q_diag=False, ...) -> Model
    svtp(kernel, likelihood, inducing_inputs, *, prior=(alpha, beta)=(2, 2), ...)     -> Model
    init(model, key=None) -> Params
    elbo(model, params, batch, key=None, num_data=None) -> scalar;  kl_divergence(model, params)
    expected_log_likelihood(model, params, x, y, key=None) -> (B,)
    predict_f(model, params, x) -> Normal / StudentT of f(x), batch shape (N, C)
    predict(model, params, x, key=None, num_samples=1000, *, noisy=True) -> numpyro distribution of y
    sample_f(model, params, key, x, num_samples=1) -> (num_samples, N, C) joint latent draws
    scale_posterior(model, params) -> q(sigma^2) (InverseGamma; Delta(1) for the SVGP)
    stratified_inducing(x, y, num_inducing, key) -> (M, ...) training points, classes in proportion
    fit(model, params, x, y, *, key, ...) -> FitResult(params, posterior, history, best_step, best_val_nll)
    as_posterior(model, params, x=None, y=None, *, key=None) -> VariationalPosterior
    VariationalPosterior(model, params, log_marginal_likelihood): predict / predict_f / sample_f

Kernels: a `smnngp.kernels.ParametricKernel` (anything with ``.apply(theta, x1, x2)`` and ``.theta``), whose
unconstrained ``theta`` is trained with the variational parameters; or a fixed kernel accepted by
`smnngp.posterior.as_kernel_callable` (a stax ``kernel_fn``, a stax triple, a plain ``k(x1, x2)``).  For the SVTP
an amplitude in the kernel is redundant with sigma^2 (only their product is identified); fix it
(``train_kernel=False`` or a kernel without one) if that matters.

``Params`` fields: ``inducing`` (Z, (M, ...)), ``q_mean`` (C, M), ``q_scale`` (C, M, M) lower triangular (the
strict upper part is ignored) or (C, M) with ``q_diag``, ``kernel`` (theta, ``None`` for a fixed kernel),
``likelihood`` (``{'noise': raw}`` for the Gaussian, else ``None``), ``scale`` (SVTP: ``{'a': raw, 'b': raw}``, with
``a = a_min + softplus(raw_a)``, ``b = softplus(raw_b)``; SVGP: ``None``).  Gaussian noise is ``softplus(raw)``.

Training (:func:`fit`): Adam (or any optax transformation) on ``-ELBO / N``, one jitted ``lax.scan`` over the steps
between two evaluations, minibatches drawn without replacement per epoch; every ``eval_every`` steps (default one
epoch) the validation NLL (``-mean log p(y | x)`` under :func:`predict` with fixed random numbers) feeds
`optax.contrib.reduce_on_plateau`, whose scale multiplies the updates; training stops after ``num_steps``, when
the scale falls below ``min_lr_scale``, or ``stop_patience`` evaluations after the best one, and the parameters with
the best validation NLL are returned (without validation data: the plateau watches the training loss and the last
parameters are returned).  ``devices`` (default: every local device, when there is more than one) splits each
minibatch over a 1-D mesh with `jax.sharding`, parameters replicated.

Layout of the package (split by concern; every public name is re-exported here, so ``smnngp.variational.fit`` and
``from smnngp.variational import svgp`` are the import paths to use): ``_likelihoods`` (`Softmax`, `Bernoulli`,
`Gaussian`), ``_model`` (`Model`, `Params`, `svgp`, `svtp`, `init`), ``_elbo`` (the pure, traceable pieces:
marginals by whitening, `kl_divergence`, `expected_log_likelihood`, `elbo`, `scale_posterior`), ``_predict``
(`predict_f`, `predict`, `sample_f`), ``_inducing`` (`stratified_inducing`), ``_posterior``
(`VariationalPosterior`, `as_posterior`) and ``_training`` (`fit`, `FitResult`). Each imports only the ones
before it in this list.
"""

# isort: off
# in the source order of the module before the split (the API page lists the members in this order)
from smnngp.variational._likelihoods import Softmax, Bernoulli, Gaussian
from smnngp.variational._model import Model, Params, svgp, svtp, init
from smnngp.variational._elbo import scale_posterior, kl_divergence, expected_log_likelihood, elbo
from smnngp.variational._elbo import optimal_gaussian_q
from smnngp.variational._predict import predict_f, predict, sample_f
from smnngp.variational._inducing import stratified_inducing
from smnngp.variational._posterior import VariationalPosterior, as_posterior
from smnngp.variational._training import FitResult, fit
# isort: on
# a private name of the module before the split that the tests call (not in __all__)
from smnngp.variational._elbo import _draw_scale as _draw_scale

__all__ = [
    "Softmax",
    "Bernoulli",
    "Gaussian",
    "Model",
    "Params",
    "svgp",
    "svtp",
    "init",
    "elbo",
    "kl_divergence",
    "expected_log_likelihood",
    "optimal_gaussian_q",
    "predict_f",
    "predict",
    "sample_f",
    "scale_posterior",
    "stratified_inducing",
    "fit",
    "FitResult",
    "as_posterior",
    "VariationalPosterior",
]
