"""Low-rank ("singular") Bayesian neural networks: W = A B^T with mean-field factors (Toure & Stephens,
*Singular Bayesian Neural Networks*; notes ``001_singular_bnn.md``; issue 15, section 1).

**Layers.** A dense layer maps ``x`` of shape ``(..., n_in)`` to ``x @ W + b`` of shape ``(..., n_out)``
(Keras orientation, paper Sec. 2.4; the ``smnngp.stax.Dense`` layout). Four kinds share one interface:

* ``"deterministic"`` (:class:`DeterministicDense`): a point estimate ``W`` (Glorot / He / orthogonal init);
* ``"bbb"`` (:class:`BBBDense`): full-rank mean-field Bayes-by-Backprop (Blundell et al. 2015), ``W_ij ~
  q(mu_ij, softplus(rho_ij))`` independently;
* ``"lowrank"`` (:class:`LowRankDense`): ``W = A B^T`` with ``A`` of shape ``(n_in, r)`` and ``B`` of shape
  ``(n_out, r)``, every entry of ``A`` and ``B`` independent Gaussian or Laplace with scale
  ``softplus(rho)`` (paper Sec. 2.1, App. F.1; the Laplace variant of App. I.1). ``x @ A @ B^T`` is computed as
  ``(x @ A) @ B^T`` and ``W`` is never materialised unless that is cheaper (``path``);
* ``"rank1"`` (:class:`Rank1Dense`): the rank-1 multiplicative baseline of Dusenberry et al. (2020) in the form
  of the paper's App. I.1, ``W = W_bar o (s r^T)`` with deterministic ``W_bar`` and mean-field ``s`` (``n_in``),
  ``r`` (``n_out``); ``x @ W = ((x o s) @ W_bar) o r``.

Every layer spec is a frozen (hashable) dataclass with

* ``init(key, dtype=float32) -> params`` (a NamedTuple pytree);
* ``sample(params, key) -> weights`` (one reparameterised draw, a pytree of concrete arrays) and
  ``forward(weights, x)``; ``apply(params, x, key) = forward(sample(params, key), x)``: **one** weight sample per
  forward pass, shared by every row of the batch (paper Sec. 2.2; no local reparameterisation);
* ``kl(params, prior, key, method="auto") -> scalar``: ``KL(q || p)`` of the layer's stochastic parameters,
  by Monte Carlo ``log q(w) - log p(w)`` at the draw ``sample(params, key)`` (the *same* draw ``apply`` uses with
  that key; paper Eq. 1, "all three terms ... estimated via Monte Carlo"), or in closed form when the prior is a
  :class:`GaussianPrior` and the factors Gaussian (``method="exact"``; ``"auto"`` picks it then);
* ``num_params()`` (closed form, equal to the number of scalars in ``init``'s pytree) and
  ``from_deterministic(det_params, key)`` (warm start from a trained deterministic layer: the SVD initialisation
  of App. F.9 for the low-rank kind).

Embeddings (:class:`DeterministicEmbedding`, :class:`BBBEmbedding`, :class:`LowRankEmbedding`,
:class:`Rank1Embedding`) sample **only the rows of the tokens looked up**: the noise of row ``v`` is drawn from
``fold_in(key, v)``, so a lookup equals sampling the whole table with the same key and gathering (a tested
identity), repeated tokens get the same row, and a lookup costs ``O(tokens * r)`` instead of ``O(V r)``
(paper Sec. 2.4). Their ``kl`` covers the whole table (the paper leaves this open; a batch-only KL would be a
biased estimate of the ELBO's KL).

**Priors.** :class:`ScaleMixturePrior` ``pi N(0, s1^2) + (1 - pi) N(0, s2^2)`` on every stochastic scalar
(Blundell et al.; defaults ``pi = 0.5, s1 = 1, s2 = e^-6`` as standard deviations, paper App. I.1, G.3.2, G.4.2;
:func:`toy_prior` is the toy regression's ``s1 = 2``), log density by ``logsumexp``; :class:`GaussianPrior`.

**Networks.** :func:`mlp` (any activation), :func:`lstm` (low-rank input-to-gates and hidden-to-gates matrices,
weights sampled once per sequence and reused across time in a ``lax.scan``, or resampled at every step for the
benchmark), :func:`transformer` (pre-norm encoder, multi-head attention, FFN, CLS pooling; Q, K, V, O, FFN,
embedding and head of the chosen kind). Each accepts the four kinds. Networks have the layer interface plus
``apply_and_kl`` (one draw for both) and ``predict``.

**Training.** :func:`fit` minimises the per-datum negative ELBO ``mean_batch NLL + beta_e KL / N`` with optax
(paper Eq. 1, App. I.1), ``beta_e = kl_weight * schedule(epoch)`` (linear warm-up with an optional delay, or any
callable); Gaussian (fixed or learned noise) and softmax likelihoods. :func:`fit_ensemble` trains ``K`` members
of a (deterministic) network in parallel with ``vmap``. :func:`predict` returns ``S`` stacked Monte-Carlo
outputs.

**Parameter counts** (paper Tables 1, 8, 14, 20; notes section 4.7): ``num_params`` of the builders reproduce
20,802 / 7,202 (toy), 4,788,010 / 245,810 / 2,406,398 (MNIST), 22.4k / 112k / 44.8k / 13.6k / 23.3k (MIMIC) and
9.92M / 49.61M / 19.84M / 1.47M / 10.01M (SST-2); see :func:`paper_model` for the configurations.

Randomness is explicit. One weight sample of a network is **one** ``uniform`` draw with its key, split over
the layers' factors in order and turned into Gaussian (``sqrt(2) erfinv(u)``) or Laplace noise by the inverse
CDF; the Monte-Carlo KL of the network is then one vectorised ``log q - log p`` over that flat draw. (XLA:CPU
spends ~0.3 s compiling each random-bits call and each separate elementwise chain; one draw per network halves
the compile time of a training step.) Embedding rows use ``fold_in(key, row)`` as above; LSTM per-step
resampling ``fold_in(fold_in(key, l + 1), t)``; initialisation ``fold_in(key, i)`` for component ``i``. The
public ``init``/``apply``/``kl``/``apply_and_kl`` run as one cached ``jit`` per spec. Nothing flips
``jax_enable_x64``; arrays take their dtype from the parameters.

**Layout.** The package is split by concept; every public name is re-exported here, so ``finite.lowrank.X``
stays the import path: ``_validation`` (argument checks, ``KINDS``, ``FAMILIES``), ``_meanfield`` (mean-field
factors, the one-draw noise, priors, initial scales), ``_pytrees`` (parameter and weight pytrees,
``materialize``), ``_stochastic`` (the cached ``jit`` entry points and the base shared by layers and embeddings),
``_dense``, ``_embedding``, ``_networks`` (the network base, ``MLP``, ``predict``), ``_lstm``, ``_transformer``,
``_paper`` (``paper_model``) and ``_training`` (``fit``, ensembles). Each module lists its public names in
``__all__``; this package exports their union.
"""

from finite.lowrank import (
    _dense,
    _embedding,
    _lstm,
    _meanfield,
    _networks,
    _paper,
    _pytrees,
    _training,
    _transformer,
    _validation,
)

# isort: off
# source order of the pieces (the API page lists the members in this order)
from finite.lowrank._validation import *  # noqa: F403
from finite.lowrank._meanfield import *  # noqa: F403
from finite.lowrank._pytrees import *  # noqa: F403
from finite.lowrank._dense import *  # noqa: F403
from finite.lowrank._embedding import *  # noqa: F403
from finite.lowrank._networks import *  # noqa: F403
from finite.lowrank._lstm import *  # noqa: F403
from finite.lowrank._transformer import *  # noqa: F403
from finite.lowrank._paper import *  # noqa: F403
from finite.lowrank._training import *  # noqa: F403
# isort: on
# a public name of the module before the split (not in __all__)
from finite.lowrank._transformer import sinusoidal_positions as sinusoidal_positions

_MODULES = (_validation, _meanfield, _pytrees, _dense, _embedding, _networks, _lstm, _transformer, _paper, _training)
__all__ = [name for module in _MODULES for name in module.__all__]
