"""Sparse Bayesian (ARD) networks for system identification: NARX regressors, group-ARD priors, Algorithm 1
(re-weighted group lasso with Laplace-evidence hyperparameter updates and dynamic pruning), Laplace posteriors,
free-run simulation and the ARD log density for HMC.

Paper: Zhou, Ibrahim & Pan, "A Sparse Bayesian Deep Learning Approach for Identification of Cascaded Tanks
Benchmark" (``../shared/papers/003_5058be57155de644.txt``; notes ``notes/003_sparse_bayes_sysid.md``). Section and
equation numbers below are the paper's.

Model (section 2, Eq. 4). ``z(t) = [u(t-n_a), ..., u(t), y(t-n_b), ..., y(t-1)]`` (oldest first, dimension
``n_a + 1 + n_b``) and ``y(t) = Net(z(t)) + xi``, ``xi ~ N(0, sigma^2)``; ``Net`` an MLP with a linear scalar output.
Weight matrices are stored ``W^l`` of shape ``(n_{l-1}, n_l)`` as in the paper, so a *row* holds the outgoing
weights of one input node (row groups prune inputs / regressors) and a *column* the incoming weights of one node
(column groups prune hidden nodes). Biases carry no prior and are never pruned.

Prior (Eqs. 5-6, Table 1). Every weight ``w`` has ``N(0, upsilon_w)``. A *grouping* of a layer assigns each weight
to one group ``g`` with a shared variance ``Upsilon_g``: ``"element"`` (plain ARD, one per weight), ``"row"``,
``"column"``, ``"shape"`` (rectangular blocks) and ``"row+column"`` (two groupings at once; the weight's prior
precision is the sum ``1/upsilon_w = 1/Upsilon^row_i + 1/Upsilon^col_j``, as the authors' code combines them).

Algorithm 1 (one outer round ``t``; the order read off Eqs. 11-13, notes section 2.4):

1. train ``min_W  MSE(W) + lam * sum_groups omega_g(t) ||W_g||_2`` with optax (Eq. 15; the element grouping gives
   the weighted L1 penalty of Eq. 14, the others the group lasso of Table 1);
2. the Hessian ``H`` of the data term ``E = SSE / (2 sigma^2)`` per layer at the trained weights (Eq. 19/21);
3. ``Upsilon_g(t+1) = ||W_g(t+1)||_2 / omega_g(t)`` (Eq. 13 / Table 1);
4. ``C = diag((Upsilon^{-1} + H)^{-1})`` (Eq. 11) and
   ``alpha_g = sum_{w in g} (upsilon_w - C_ww) / Upsilon_g^2`` -- the gradient of the concave part
   ``log|Upsilon| + log|Upsilon^{-1} + H|`` with respect to ``Upsilon_g`` (Eq. 34). For the element grouping it is
   exactly Eq. 12, ``alpha = 1/upsilon - C/upsilon^2``; for a group it is the paper's sum over the group (Table 1);
   ``omega_g(t+1) = sqrt(|alpha_g|)`` (``omega_reduce="mean"`` averages over the group as the authors' code);
5. prune every weight with ``upsilon_w < kappa_upsilon`` or ``|W_w| < kappa_w`` (masks: a pruned weight stays 0);
   our addition, also the weights of every ReLU node inactive on all training samples (exactly zero data
   curvature, ``ArdConfig.prune_dead``).

``upsilon_w - C_ww`` is evaluated in the scaled form ``upsilon_w [I - (I + S H S)^{-1}]_ww`` with
``S = diag(sqrt(upsilon))``, which stays accurate when the variances span the clamp range ``[1e-10, 1e10]``
(``(I + S H S)`` has eigenvalues >= 1); negative curvature of an indefinite ``H`` (tanh/sigmoid networks) is
clamped (diagonal entries at zero; a dense block that can be indefinite is shifted by its Gershgorin bound), the
|alpha| of Table 1 guards the rest.

Hessian options (``hessian=``): ``"exact"`` -- the layer block ``sum_t a_t a_t^T (x) Hpre_t`` from the per-sample
pre-activation Hessians of the recursion of Eq. 21 (exact for an MLP; checked against ``jax.hessian``,
:func:`autodiff_layer_hessians`); ``"gauss-newton"`` -- the same without the ``D^l`` term; ``"kfac"`` -- its Kronecker
factorisation ``N E[a a^T] (x) E[G_t]`` (Botev et al. 2017, with ``D^l``); ``"diagonal"`` -- the exact diagonal of
the block, ``sum_t a_{t,i}^2 Hpre_t[j, j]`` from the per-sample pre-activation Hessians of Eq. 21. The dense
options are refused for layers with more than ``dense_limit`` weights (the 100 x 100 layer of the one-step network
would need a 10^4 x 10^4 block; use ``"diagonal"`` there).

Everything of one Algorithm 1 run -- all epochs of all rounds, the Hessians, the updates, the pruning and the
per-round evaluation -- is one compiled program (:func:`fit`); :func:`fit_repeats` vectorises repeats (initial
weights, data weights and ``lam``) with ``vmap``.

Layout. The package is split by concept; every public name is re-exported here, so ``finite.ard.X`` stays the
import path: ``_network`` (activations, ``ArdMLP``, ``mlp``, ``narx_regressors``), ``_prior`` (groupings, the
prior state, the group-lasso penalty, ``ArdConfig``), ``_hessians`` (the data term's Hessians and their PSD
clamps), ``_algorithm`` (the hyperparameter update, pruning, Algorithm 1: ``fit``, ``fit_repeats``),
``_laplace`` (Laplace posteriors and predictive sampling), ``_simulation`` (free run, ``finetune_simulation``)
and ``_density`` (the log density for HMC).
Each module lists its public names in ``__all__``; this package exports their union.
"""

from finite.ard import _algorithm, _density, _hessians, _laplace, _network, _prior, _simulation

# isort: off
# source order of the pieces (the API page lists the members in this order)
from finite.ard._network import *  # noqa: F403
from finite.ard._prior import *  # noqa: F403
from finite.ard._hessians import *  # noqa: F403
from finite.ard._algorithm import *  # noqa: F403
from finite.ard._laplace import *  # noqa: F403
from finite.ard._simulation import *  # noqa: F403
from finite.ard._density import *  # noqa: F403
# isort: on
from finite.ard._hessians import _gershgorin_psd as _gershgorin_psd  # tests/test_ard.py checks it

_MODULES = (_network, _prior, _hessians, _algorithm, _laplace, _simulation, _density)
__all__ = [name for module in _MODULES for name in module.__all__]
