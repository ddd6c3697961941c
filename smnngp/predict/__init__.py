"""Gradient-descent-trained infinite networks, and their scale mixtures (paper Thms 3.2, 3.3; notes 1.5).

An infinitely wide network trained by gradient flow on the mean squared error
evolves as its linearisation (Lee et al. 2019), so an ensemble over random
initialisations is Gaussian at every training time ``t``.
:func:`gradient_descent_mse_ensemble` returns that Gaussian, with the names and
conventions of neural-tangents' function of the same name.

Convention (neural-tangents'): the loss is ``0.5 * mean((f(X) - Y)**2)``, the
mean taken over all ``n = Y.size`` entries (N training points times C
outputs), and the kernel acts on each output separately (``Theta ⊗ I_C``).
Gradient flow with learning rate ``eta`` then gives, for the training
outputs, ``f_t(X) = f_0(X) + (I - exp(-eta t Theta / n)) (Y - f_0(X))`` and for
any input ``f_t(x) = f_0(x) + Theta(x, X) Theta^{-1} (I - exp(-eta t Theta / n)) (Y - f_0(X))``,
where ``Theta`` is the NTK (``get='ntk'``: all layers trained) or the NNGP
kernel ``K`` (``get='nngp'``: only the readout is trained, whose tangent kernel
is the NNGP kernel). With ``f_0 ~ GP(0, K)``, writing
``A_t(x) = Theta(x, X) Theta^{-1} (I - exp(-eta t Theta / n))``:

* mean ``mu_t(x) = A_t(x) Y``;
* ``get='ntk'``: covariance ``K(x, x') - A_t(x) K(X, x') - K(x, X) A_t(x')^T + A_t(x) K(X, X) A_t(x')^T``;
  at ``t = inf`` this is the ``Theta'`` of Lee et al. (2019) / the paper's Thm 3.3 (notes 1.5):
  ``K** + T*X T^{-1} K T^{-1} TX* - (T*X T^{-1} KX* + K*X T^{-1} TX*)``;
* ``get='nngp'``: covariance ``K(x, x') - K(x, X) K^{-1} (I - exp(-2 eta t K / n)) K(X, x')``,
  which is the expression above with ``Theta = K``; at ``t = inf`` it is the
  NNGP posterior covariance ``K** - K*X K^{-1} KX*`` (Thm 3.2).

``diag_reg`` (as in neural-tangents): the kernel that is inverted or
exponentiated is ``Theta + diag_reg * mean(diag Theta) * I`` (the factor
``mean(diag Theta)`` is dropped with ``diag_reg_absolute_scale=True``); the NNGP
matrices that enter the covariances are used as they are, except in the
``'nngp'`` formula above, whose ``K^{-1}`` and exponential are regularised (at
``t = inf`` this is the GP posterior with noise variance ``diag_reg * mean(diag K)``),
and on the training inputs (``x_test=None``) under ``'nngp'``, whose covariance is
``E K_reg E`` with the regularised ``K_reg`` (neural-tangents' choice: the formula
above with ``K`` regularised throughout).

``trace_axes`` (neural-tangents'): the axes of the targets along which the kernel
is the identity; the kernels carry the other axes, interleaved. The default
``(-1,)`` is the ``Theta ⊗ I_C`` above.

Finite ``t`` uses one eigendecomposition of the (regularised) training kernel
per ``get``; ``t = None`` / ``inf`` uses one Cholesky factorisation
(`smnngp.linalg.cholesky`). Both are computed on first use and cached.

Function-space predictors over given kernel matrices, with neural-tangents' names
and signatures (`smnngp.predict._function_space`): :func:`gradient_descent_mse`
(closed form for the MSE, any times), :func:`gradient_descent` (any loss, with or
without momentum, by an ODE solve; :class:`ODEState`) and :func:`gp_inference`
(NNGP / NTK / NTK-GP posteriors).

Scale mixing (paper Thms 3.2, 3.3): with the readout variance
``sigma_v^2 ~ H`` drawn once per network, ``f | sigma_v^2 ~ N(mu, sigma_v^2 C)``
where ``(mu, C)`` is the Gaussian above for the kernel whose last layer has
``W_std = 1``. The mixing is over the PRIOR ``H``: for ``H = InvGamma(a, b)``
the law is ``MVT(2a, mu, (b/a) C)``, with ``2a`` degrees of freedom, not the
``2a + N`` of a Bayesian posterior. :func:`scale_mixture_predictive` builds that
law; :class:`ScaleMixtureNormal` handles any prior by one-dimensional quadrature
over ``log sigma_v^2``.
"""

from smnngp.predict._ensemble import Gaussian, gradient_descent_mse_ensemble, max_learning_rate
from smnngp.predict._function_space import ODEState, gp_inference, gradient_descent, gradient_descent_mse
from smnngp.predict._mixture import (
    ScaleMixtureNormal,
    ScaleMixtureNormal1D,
    gradient_descent_mse_scale_mixture,
    predictive_marginals,
    scale_mixture_predictive,
)

__all__ = [
    "Gaussian",
    "gradient_descent_mse_ensemble",
    "gradient_descent_mse_scale_mixture",
    "scale_mixture_predictive",
    "predictive_marginals",
    "ScaleMixtureNormal",
    "ScaleMixtureNormal1D",
    "max_learning_rate",
    "gradient_descent_mse",
    "gradient_descent",
    "gp_inference",
    "ODEState",
]
