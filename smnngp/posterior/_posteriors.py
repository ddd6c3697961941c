"""The posterior objects: the interface `Posterior` and its three kinds, `GaussianPosterior` (the NNGP),
`StudentTPosterior` (the Student-t process) and `ImportancePosterior` (any other prior, or unscaled noise).

Each is an immutable pytree (arrays as leaves, configuration as static data) holding what a fit computed (the
factorisation or the matrix-free solver's state, the scale posterior); prediction, joint draws and covariances
are methods of `Posterior`, and each kind adds its predictive law and its draws of sigma^2. The fit paths that
build them are in `smnngp.posterior._fit` and `smnngp.posterior._from_kernels`.
"""

from __future__ import annotations

import functools
import math
import weakref

import jax
import jax.numpy as jnp
import numpy as np
import numpyro.distributions as dist

from smnngp import linalg, matfree, priors, shifts
from smnngp._checks import check_finite
from smnngp.posterior._evaluators import _evaluator
from smnngp.posterior._mixture import GaussianMixture, _weighted_indices

__all__ = ["Posterior", "GaussianPosterior", "StudentTPosterior", "ImportancePosterior"]


class _ByIdentity:
    """Static pytree data compared by identity (a kernel callable need not be hashable or comparable)."""

    __slots__ = ("obj",)

    def __init__(self, obj):
        self.obj = obj

    def __hash__(self):
        return id(self.obj)

    def __eq__(self, other):
        return isinstance(other, _ByIdentity) and other.obj is self.obj


def _concrete(*trees) -> bool:
    """No leaf of ``trees`` is traced (values can be read, cached, checked on the host)."""
    return not any(isinstance(leaf, jax.core.Tracer) for leaf in jax.tree_util.tree_leaves(trees))


def _scalar(value):
    """A concrete scalar as a Python float; arrays (batched posteriors) and tracers unchanged."""
    if value is None or isinstance(value, float) or not _concrete(value) or jnp.ndim(value) != 0:
        return value
    return float(value)


# The predictive pieces of each posterior's most recent x_test (see Posterior._marginal_pieces): held beside the
# immutable posteriors, and dropped with them.
_PIECES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


class Posterior:
    """A fitted scale-mixture posterior: an immutable pytree; create it with :func:`fit` or :func:`fit_from_kernels`.

    The interface every posterior of the project shares (exact, importance-sampled, variational):

    * ``predict(x_test, ...)``: the marginal predictive at each test point, a numpyro distribution;
    * ``log_marginal_likelihood``: ``log p(Y)`` (exact, or its importance-sampling estimate);
    * ``sample_f(key, x_test, num_samples)``: joint draws at the test points;

    plus :meth:`log_predictive_density`, :meth:`predict_mean_std` and :meth:`predict_covariance`.
    The concrete classes are :class:`GaussianPosterior` (``Delta`` prior: the NNGP),
    :class:`StudentTPosterior` (inverse-gamma prior, scaled noise: the Student-t process) and
    :class:`ImportancePosterior` (any other prior, or unscaled noise).

    As a pytree its arrays are leaves (the factorisation, the scale posterior, ``x_train``, ``noise``,
    the prior's parameters, ``log_marginal_likelihood``), its configuration is static (``noise_model``,
    sizes, the kernel callable, compared by identity), so a posterior is an argument and a result of
    `jax.jit`, and a batch of posteriors (leaves stacked: same kind, sizes and kernel; importance
    posteriors only when they kept as many samples) is mapped over by `jax.vmap`. Outside
    transformations the scalar attributes (``log_marginal_likelihood``, ``jitter``, ``df``, ``ess``)
    read as Python floats. Attributes cannot be set; :meth:`replace` returns a changed copy.

    Attributes: ``prior``, ``noise``, ``noise_model``, ``kind`` (``'gaussian'``, ``'student_t'`` or
    ``'importance'``, read-only), ``log_marginal_likelihood``, ``jitter`` (absolute jitter the Cholesky
    needed), ``ess`` (importance sampling only), ``scale_posterior`` (``InvGamma`` for the Student-t
    process, the point mass for ``Delta``, else ``None``), ``df``, ``kernel`` and ``x_train`` (``None``
    when fitted from kernel matrices).

    Args:
        prior: the scale prior, a numpyro distribution (keyword-only, like every argument).
        noise: ``eps`` (scaled noise) or ``sigma_n^2`` (unscaled noise).
        noise_model: ``'scaled'`` or ``'unscaled'``.
        n_train: number N of training points.
        n_out: number C of outputs.
        squeeze: whether the targets were given as (N,), so that predictions drop the output axis.
        log_marginal_likelihood: ``log p(Y)``, exact or estimated.
        state: arrays of the factorisation: ``L``, ``alpha``, ``q``, ``logdet`` (scaled noise) or ``lam``, ``U``,
            ``ytilde`` (unscaled noise).
        jitter: absolute jitter added to the training kernel to factorise it.
        kernel: the kernel callable ``k(x1, x2)``, or ``None`` when fitted from kernel matrices.
        x_train: the training inputs, or ``None``.
        solver: ``None`` for the dense path (a Cholesky factor in ``state``), or the `smnngp.matfree.CG`
            settings of a matrix-free fit (``state`` holds ``alpha``, ``q``, ``logdet`` and the preconditioner
            ``U``, ``lam``).
        **fields: the fields of the concrete class (``s``; ``a_post``, ``b_post``, ``_df``; ``beta``, ``log_w``,
            ``_ess``, ``_num_samples``).

    Raises:
        TypeError: when ``Posterior`` itself is instantiated, or a field is missing or unknown.
    """

    kind: str = ""
    # leaves (arrays, the prior's pytree, Python floats) and static fields; subclasses add their own
    _LEAVES: tuple[str, ...] = ("prior", "noise", "x_train", "_lml", "_jitter", "_state")
    _STATIC: tuple[str, ...] = ("noise_model", "n_train", "n_out", "squeeze", "_kernel", "_solver")

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        jax.tree_util.register_pytree_node(cls, cls._tree_flatten, cls._tree_unflatten)

    def __init__(self, *, prior, noise, noise_model: str, n_train: int, n_out: int, squeeze: bool,
                 log_marginal_likelihood, state: dict, jitter=0.0, kernel=None, x_train=None, solver=None,
                 **fields):
        if type(self) is Posterior:
            raise TypeError("Posterior is the interface; build a posterior with posterior.fit or fit_from_kernels")
        values = dict(prior=prior, noise=noise, x_train=x_train, _lml=log_marginal_likelihood, _jitter=jitter,
                      _state=dict(state), noise_model=noise_model, n_train=int(n_train), n_out=int(n_out),
                      squeeze=bool(squeeze), _kernel=kernel, _solver=solver, **fields)
        missing = set(self._LEAVES + self._STATIC) - set(values)
        unknown = set(values) - set(self._LEAVES + self._STATIC)
        if missing or unknown:
            raise TypeError(f"{type(self).__name__}: missing fields {sorted(missing)}, unknown {sorted(unknown)}")
        for name, value in values.items():
            object.__setattr__(self, name, value)

    # -- pytree protocol and immutability --
    def _tree_flatten(self):
        children = tuple(getattr(self, n) for n in self._LEAVES)
        aux = tuple(_ByIdentity(self._kernel) if n == "_kernel" else getattr(self, n) for n in self._STATIC)
        return children, aux

    @classmethod
    def _tree_unflatten(cls, aux, children):
        self = object.__new__(cls)
        for name, value in zip(cls._LEAVES, children, strict=True):
            object.__setattr__(self, name, value)
        for name, value in zip(cls._STATIC, aux, strict=True):
            object.__setattr__(self, name, value.obj if name == "_kernel" else value)
        return self

    def __setattr__(self, name, value):
        raise AttributeError(f"{type(self).__name__} is immutable; use .replace({name}=...)")

    def __delattr__(self, name):
        raise AttributeError(f"{type(self).__name__} is immutable")

    def replace(self, **changes) -> Posterior:
        """A copy with the given fields changed (``kernel``, ``x_train``, ``noise``, ...; no refitting)."""
        renamed = {"kernel": "_kernel", "log_marginal_likelihood": "_lml", "jitter": "_jitter", "solver": "_solver"}
        changes = {renamed.get(k, k): v for k, v in changes.items()}
        unknown = set(changes) - set(self._LEAVES + self._STATIC)
        if unknown:
            raise TypeError(f"{type(self).__name__}.replace: unknown fields {sorted(unknown)}")
        children, aux = self._tree_flatten()
        new = self._tree_unflatten(aux, children)
        for name, value in changes.items():
            object.__setattr__(new, name, value)
        return new

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(noise_model={self.noise_model!r}, n_train={self.n_train}, n_out={self.n_out}, "
                f"log_marginal_likelihood={self._lml!r}, prior={self.prior!r})")

    # -- the scale posterior and its summaries --
    @property
    def kernel(self):
        return self._kernel

    @property
    def log_marginal_likelihood(self):
        return _scalar(self._lml)

    @property
    def jitter(self):
        return _scalar(self._jitter)

    @property
    def method(self) -> str:
        """``'dense'`` (a Cholesky factor or eigendecomposition), ``'mixed'`` (a float32 factor refined by float64
        conjugate gradients) or ``'cg'`` (matrix-free, `smnngp.matfree`)."""
        if self._solver is None:
            return "dense"
        return "mixed" if "L32" in self._state else "cg"

    @property
    def diagnostics(self) -> dict:
        """How the fit went: the method, the jitter (dense), or for ``'cg'`` the CG iterations and relative
        residual of the training solve, the log-determinant's standard error, probes and preconditioner rank."""
        out = {"method": self.method, "jitter": self.jitter}
        if self._solver is not None:
            st = self._state
            out.update(cg_iterations=int(st["cg_iterations"]), cg_residual=float(st["cg_residual"]),
                       tol=float(st["cg_tol"]), logdet_stderr=float(st["logdet_stderr"]),
                       num_probes=self._solver.num_probes)
            if "L32" in st:
                out.update(precond=f"{jnp.dtype(st['L32'].dtype).name} Cholesky",
                           precond_jitter=float(st["precond_jitter"]))
            else:
                out.update(precond="pivoted Cholesky", precond_rank=int(st["U"].shape[1]),
                           precond_trace_error=float(st["precond_trace_error"]))
            if "grid_t" in st:
                out.update(shift_nodes=int(st["grid_nodes"]), interpolation_error=float(st["interpolation_error"]))
        return out

    @property
    def ess(self):
        """Effective sample size of the importance sampler (``None`` for exact posteriors)."""
        return None

    @property
    def num_samples(self):
        """Importance samples drawn (``None`` for exact posteriors)."""
        return None

    @property
    def df(self):
        """Degrees of freedom of the Student-t predictive (``2a + N C``), ``inf`` for the Gaussian, else ``None``."""
        return None

    @property
    def scale_posterior(self):
        """The posterior law of sigma^2 when it has a closed form (``None`` for importance sampling)."""
        return None

    def scale_posterior_samples(self):
        """``(beta, normalised log weights)`` of the importance sampler (after pruning)."""
        raise ValueError(f"scale_posterior_samples is only defined for importance sampling, not {self.kind!r}")

    # What each kind of posterior defines.
    def _predictive(self, mean, var, noisy):
        """The marginal predictive from the noise-free pieces of :meth:`_marginal_pieces`."""
        raise NotImplementedError

    def _draw_scales(self, key, num_samples):
        """``num_samples`` draws of sigma^2 from its posterior."""
        raise NotImplementedError

    def _scale_mean(self):
        """``E[sigma^2 | Y]`` (scaled noise)."""
        raise NotImplementedError

    def _scale_samples(self):
        """``(beta, log w)``: the scale posterior as weighted points (unscaled noise)."""
        raise NotImplementedError(f"{type(self).__name__} has no unscaled-noise form")

    # -- prediction --
    def _test_kernels(self, x_test, k_test_train, k_test_test, full_cov):
        if k_test_train is None:
            if self.kernel is None:
                raise ValueError("this posterior was fitted from kernel matrices: pass k_test_train (and k_test_test)")
            x_test = self._check_x_test(x_test)
            kernel = _evaluator(self.kernel)
            k_test_train = kernel(x_test, self.x_train)
            if full_cov:
                k_test_test = kernel(x_test, None)
            else:
                k_test_test = kernel.diag(x_test)
        else:
            k_test_train = jnp.asarray(k_test_train)
            if k_test_train.ndim != 2 or k_test_train.shape[1] != self.n_train:
                raise ValueError(f"k_test_train must have shape (L, {self.n_train}), got {k_test_train.shape}")
            if k_test_test is None:
                raise ValueError("k_test_test is required with k_test_train (its diagonal, or the full matrix)")
            k_test_test = jnp.asarray(k_test_test)
            L = k_test_train.shape[0]
            if full_cov and k_test_test.shape != (L, L):
                raise ValueError(f"full_cov=True needs k_test_test of shape ({L}, {L}), got {k_test_test.shape}")
            if not full_cov:
                if k_test_test.shape == (L, L):
                    k_test_test = jnp.diag(k_test_test)
                elif k_test_test.shape != (L,):
                    raise ValueError(f"k_test_test must have shape ({L},) or ({L}, {L}), got {k_test_test.shape}")
        check_finite(k_test_train, "k_test_train")
        check_finite(k_test_test, "k_test_test")
        return k_test_train, k_test_test

    def _check_x_test(self, x_test):
        if x_test is None:
            raise ValueError("pass x_test (or k_test_train)")
        x_test = jnp.asarray(x_test)
        if x_test.shape[1:] != jnp.shape(self.x_train)[1:]:
            raise ValueError(
                f"x_test has per-point shape {x_test.shape[1:]} but x_train has {jnp.shape(self.x_train)[1:]}"
            )
        check_finite(x_test, "x_test")
        return x_test

    def _operator(self):
        opts = self._solver
        return matfree.KernelOperator(self.kernel, self.x_train, float(self.noise), tile_size=opts.tile_size,
                                      devices=opts.devices)

    def _preconditioner(self):
        st = self._state
        if "L32" in st:
            return matfree.DenseCholesky(st["L32"], float(st["precond_jitter"]))
        return matfree.PivotedCholesky(None, st["U"], st["lam"], float(self.noise), float(st["precond_trace_error"]),
                                       None)

    def _matfree_marginals(self, x_test):
        """Mean and variance at the test points without the (L, N) cross-kernel where it can be avoided: the
        mean ``k*x alpha`` by column tiles; the variance by CG solves (``variance='solve'``) or LOVE
        (:func:`smnngp.matfree.love_variances`: ``k** - k*x A^{-1} kx*`` within a relative ``love_tol``, certified
        by a Lanczos interval per test point, CG solves where the interval is too wide)."""
        x_test = self._check_x_test(x_test)
        if self._solver.variance == "solve" or "L32" in self._state:  # mixed: CG takes a few iterations
            kxt, kxx = self._test_kernels(x_test, None, None, full_cov=False)
            return self._latent(kxt, kxx, False)
        if not _concrete(x_test, self._state, self.x_train, self.noise):
            raise TypeError("a matrix-free posterior (method='cg') predicts outside jit/vmap: LOVE checks its "
                            "variances' bounds on the host")
        op = self._operator()
        kxx = _evaluator(self.kernel).diag(x_test)
        check_finite(kxx, "k_test_test")
        mean = op.cross_matmul(x_test, self._state["alpha"])
        # each variance within love_tol of exact (certified), or solved by CG with a warning (matfree.love_variances)
        var, _ = matfree.love_variances(op, x_test, kxx, self._solver, self._preconditioner())
        return mean, var

    def _latent(self, kxt, kxx, full_cov):
        """Gaussian conditional pieces for scaled noise: mean (L, C), covariance S* (diag or full)."""
        st = self._state
        if self._solver is not None:
            return self._latent_matfree(kxt, kxx, bool(full_cov))
        return _latent_jit(kxt, kxx, st["alpha"], st["L"], bool(full_cov))

    def _latent_matfree(self, kxt, kxx, full_cov):
        """As :meth:`_latent` without a factor: ``S* = k** - k*x A^{-1} kx*`` by one CG run over the L test
        columns (preconditioned as the fit was), ``A = K + noise I`` applied by tiles."""
        if not _concrete(kxt, self._state, self.x_train, self.noise):
            raise TypeError("a matrix-free posterior (method='cg') predicts outside jit/vmap: its solves run "
                            "conjugate gradients with host-side convergence checks")
        st, opts = self._state, self._solver
        op = self._operator()
        pc = self._preconditioner()
        v, _ = matfree.cg(op, kxt.T, precond=pc, tol=opts.tolerance(op.dtype), max_iter=opts.max_iter)
        mean = kxt @ st["alpha"]
        if full_cov:
            return mean, kxx - kxt @ v
        return mean, jnp.clip(kxx - jnp.sum(kxt.T * v, axis=0), 0.0, None)

    def _grid_nodes(self, kxt, full_cov):
        """At each shift node ``s_g`` of an unscaled matrix-free fit: the conditional mean ``k*x (K + s_g I)^-1 Y``
        (G, L, C) and the variance reduction ``k*x (K + s_g I)^-1 kx*`` (G, L), or (G, L, L) with ``full_cov``, by
        one preconditioned CG run over the test columns per node."""
        if not _concrete(kxt, self._state, self.x_train, self.noise):
            raise TypeError("a matrix-free posterior (method='cg') predicts outside jit/vmap: its solves run "
                            "conjugate gradients with host-side convergence checks")
        st, opts = self._state, self._solver
        op = self._operator()
        pc = matfree.PivotedCholesky(None, st["U"], st["lam"], 1.0, float(st["precond_trace_error"]), None)
        means, reductions = [], []
        for g, t in enumerate(np.asarray(st["grid_t"])):
            shift = math.exp(float(t))
            v, _ = matfree.cg(op.with_shift(shift), kxt.T, precond=pc._replace(shift=shift),
                              tol=opts.tolerance(op.dtype), max_iter=opts.max_iter)
            means.append(kxt @ st["grid_alpha"][g])
            reductions.append(kxt @ v if full_cov else jnp.sum(kxt.T * v, axis=0))
        return jnp.stack(means), jnp.stack(reductions)

    def _grid_basis(self, beta):
        """(S, G) spline weights of each sample's shift ``noise / beta`` on the fit's nodes."""
        t = np.log(float(self.noise) / np.asarray(beta, float))
        return jnp.asarray(shifts.spline_basis(np.asarray(self._state["grid_t"]), t), self._state["grid_alpha"].dtype)

    def _grid_pieces(self, kxt, kxx):
        """Per retained sample: mean (S, L, C) and latent variance (S, L), as the dense unscaled branch gives."""
        beta = self._scale_samples()[0]
        m_g, r_g = self._grid_nodes(kxt, False)
        B = self._grid_basis(beta)
        mean = jnp.einsum("sg,glc->slc", B, m_g)
        var = beta[:, None] * (kxx[None, :] - B @ r_g)
        return mean, jnp.clip(var, 0.0, None)

    def _marginal_pieces(self, x_test, k_test_train, k_test_test):
        """Noise-free predictive pieces at the test points: (mean, variance).

        Scaled noise: the Gaussian conditional's mean (L, C) and variance S*
        (L,).  Unscaled noise: per retained sample, mean (S, L, C) and variance
        (S, L).  The pieces for the most recent ``x_test`` of each posterior are
        kept (in a table beside it, as the posterior itself is immutable), so
        that ``predict(x)`` followed by ``log_predictive_density(y, x)``
        evaluates the test kernels and solves the (L, N) triangular system once.
        """
        cacheable = k_test_train is None and x_test is not None and self.kernel is not None and _concrete(
            x_test, self._state, self.x_train, self.noise)
        if cacheable:
            x = jnp.asarray(x_test)
            hit = _PIECES.get(self)
            if (hit is not None and hit[0].shape == x.shape and hit[0].dtype == x.dtype
                    and np.array_equal(np.asarray(hit[0]), np.asarray(x))):
                return hit[1]
        if "grid_t" in self._state:  # unscaled noise, matrix-free: splines through solves at a few shifts
            kxt, kxx = self._test_kernels(x_test, k_test_train, k_test_test, full_cov=False)
            pieces = self._grid_pieces(kxt, kxx)
        elif self._solver is not None and k_test_train is None:
            pieces = self._matfree_marginals(x_test)
        elif self.noise_model == "scaled":
            chunk = _test_chunk(self.n_train)
            if k_test_train is None and x_test is not None and jnp.shape(x_test)[0] > chunk:
                # many test points: the (L, N) cross-kernel and its solve a chunk of rows at a time
                parts = [self._latent(*self._test_kernels(x_test[i:i + chunk], None, None, False), False)
                         for i in range(0, jnp.shape(x_test)[0], chunk)]
                pieces = tuple(jnp.concatenate(p) for p in zip(*parts))
            else:
                kxt, kxx = self._test_kernels(x_test, k_test_train, k_test_test, full_cov=False)
                pieces = self._latent(kxt, kxx, False)
        else:
            kxt, kxx = self._test_kernels(x_test, k_test_train, k_test_test, full_cov=False)
            st = self._state
            lam, U, yt = st["lam"], st["U"], st["ytilde"]
            beta = self._scale_samples()[0]
            P = kxt @ U  # (L, N), once
            d = beta[:, None] * lam[None, :] + self.noise  # (S, N)
            mean = beta[:, None, None] * jnp.einsum("ln,snc->slc", P, yt[None] / d[:, :, None])  # a matmul, no (S,L,N)
            var = beta[:, None] * kxx[None, :] - beta[:, None] ** 2 * ((P**2) @ (1.0 / d).T).T
            pieces = mean, jnp.clip(var, 0.0, None)
        if cacheable:
            _PIECES[self] = (x, pieces)
        return pieces

    def predict(self, x_test=None, *, k_test_train=None, k_test_test=None, noisy: bool = True):
        """Marginal predictive distribution at each test point (and output).

        ``noisy=True`` gives the distribution of a new observation y* (noise
        included), ``noisy=False`` that of the latent f*.  Returns a numpyro
        distribution with ``batch_shape`` (L,) or (L, C): ``Normal`` (NNGP),
        ``StudentT`` (Student-t process) or :class:`GaussianMixture`
        (importance sampling); all have ``mean``, ``variance`` and
        ``log_prob``; :func:`interval` gives central intervals.
        """
        mean, var = self._marginal_pieces(x_test, k_test_train, k_test_test)
        return self._predictive(mean, var, noisy)

    def _squeeze(self, a):
        return a[..., 0] if self.squeeze else a

    def _unscaled_pieces(self, mean, var, noisy):
        """Per-sample mean and standard deviation (S, L[, C]) of the unscaled-noise predictive."""
        var = var + (self.noise if noisy else 0.0)
        scale = jnp.sqrt(var)[:, :, None] * jnp.ones_like(mean)
        return self._squeeze(mean), self._squeeze(scale)

    def predict_mean_std(self, x_test=None, **kw):
        """``(mean, std)`` of the predictive (``std`` is ``inf`` where the variance does not exist)."""
        p = self.predict(x_test, **kw)
        return p.mean, jnp.sqrt(p.variance)

    def log_predictive_density(self, y_test, x_test=None, *, noisy: bool = True, **kw):
        """Per-point ``log p(y*_i | Y)`` summed over outputs (shape (L,))."""
        p = self.predict(x_test, noisy=noisy, **kw)
        y_test = jnp.asarray(y_test)
        if y_test.shape != p.batch_shape:
            raise ValueError(f"y_test must have shape {p.batch_shape}, got {y_test.shape}")
        check_finite(y_test, "y_test")
        lp = p.log_prob(y_test)
        return lp if lp.ndim == 1 else lp.sum(-1)

    def predict_covariance(self, x_test=None, *, k_test_train=None, k_test_test=None, noisy: bool = True):
        """Joint predictive covariance at the test points, (L, L) or (L, L, C).

        * scaled noise: ``E[sigma^2 | Y] (S* + noise I)``, S* the Gaussian conditional covariance
          (``inf`` everywhere when ``E[sigma^2 | Y]`` is infinite, a Student-t with ``df <= 2``);
        * unscaled noise: the mixture's law of total covariance,
          ``sum_s w_s (beta_s K** - beta_s^2 P D_s^-1 P^T) + sum_s w_s (m_s - m)(m_s - m)^T + noise I``
          with ``K = U diag(lam) U^T``, ``P = K*x U`` and ``D_s = beta_s lam + noise``.

        ``k_test_test`` must be the full (L, L) matrix.
        """
        kxt, kxx = self._test_kernels(x_test, k_test_train, k_test_test, full_cov=True)
        n_test = kxt.shape[0]
        eye = jnp.eye(n_test, dtype=kxx.dtype)
        if self.noise_model == "scaled":
            _, s_star = self._latent(kxt, kxx, True)
            if noisy:
                s_star = s_star + self.noise * eye
            e_beta = self._scale_mean()
            cov = jnp.broadcast_to((e_beta * s_star)[..., None], (n_test, n_test, self.n_out))
            cov = jnp.where(jnp.isinf(e_beta), jnp.inf, cov)
        else:
            beta, log_w = self._scale_samples()
            w = jnp.exp(log_w)
            if "grid_t" in self._state:  # matrix-free: splines through the shift nodes
                m_g, r_g = self._grid_nodes(kxt, True)
                B = self._grid_basis(beta)
                within = jnp.sum(w * beta) * kxx - jnp.einsum("g,gij->ij", (w * beta) @ B, r_g)
                means = jnp.einsum("sg,glc->slc", B, m_g)
            else:
                st = self._state
                lam, U, yt = st["lam"], st["U"], st["ytilde"]
                P = kxt @ U
                dinv = 1.0 / (beta[:, None] * lam[None, :] + self.noise)  # (S, N)
                within = jnp.sum(w * beta) * kxx - (P * jnp.sum((w * beta**2)[:, None] * dinv, axis=0)[None, :]) @ P.T
                means = beta[:, None, None] * jnp.einsum("ln,sn,nc->slc", P, dinv, yt)  # (S, L, C)
            if noisy:
                within = within + self.noise * eye
            dev = jnp.sqrt(w)[:, None, None] * (means - jnp.sum(w[:, None, None] * means, axis=0)[None])
            cov = within[..., None] + jnp.einsum("slc,skc->lkc", dev, dev)
        return self._squeeze(cov)

    def sample_f(self, key, x_test=None, num_samples: int = 1, *, k_test_train=None, k_test_test=None,
                 noisy: bool = False):
        """Joint posterior draws at the test points, shape ``(num_samples, L)`` or ``(num_samples, L, C)``.

        One sigma^2 per draw, shared by all points and outputs.
        """
        kxt, kxx = self._test_kernels(x_test, k_test_train, k_test_test, full_cov=True)
        L = kxt.shape[0]
        k_beta, k_z = jax.random.split(key)
        beta = self._draw_scales(k_beta, num_samples)
        z_shape = (num_samples, L, self.n_out)
        if self.noise_model == "scaled":
            mean, cov = self._latent(kxt, kxx, True)
            if noisy:
                cov = cov + self.noise * jnp.eye(L, dtype=cov.dtype)
            chol = _joint_cholesky(cov)
            z = jax.random.normal(k_z, z_shape, dtype=cov.dtype)
            out = mean[None] + jnp.sqrt(beta)[:, None, None] * jnp.einsum("ij,sjc->sic", chol, z)
        else:
            if "grid_t" in self._state:  # matrix-free: splines through the shift nodes
                m_g, r_g = self._grid_nodes(kxt, True)
                B = self._grid_basis(beta)

                def conditional(i):
                    return (jnp.einsum("g,glc->lc", B[i], m_g),
                            beta[i] * (kxx - jnp.einsum("g,gij->ij", B[i], r_g)))
            else:
                st = self._state
                lam, U, yt = st["lam"], st["U"], st["ytilde"]
                P = kxt @ U

                def conditional(i):
                    b = beta[i]
                    dinv = 1.0 / (b * lam + self.noise)
                    return b * (P * dinv[None, :]) @ yt, b * kxx - b**2 * (P * dinv[None, :]) @ P.T

            keys = jax.random.split(k_z, num_samples)
            draws = []
            for i in range(num_samples):
                m, cov = conditional(i)
                if noisy:
                    cov = cov + self.noise * jnp.eye(L, dtype=cov.dtype)
                chol = _joint_cholesky(cov)
                draws.append(m + chol @ jax.random.normal(keys[i], (L, self.n_out), dtype=cov.dtype))
            out = jnp.stack(draws)
        return self._squeeze(out)


def _joint_cholesky(cov):
    """Cholesky factor of a (symmetrised) posterior covariance: with jitter escalation and an error naming the
    matrix when concrete; with a fixed relative jitter of 1e-10 under a transformation."""
    cov = 0.5 * (cov + cov.T)
    if _concrete(cov):
        return linalg.cholesky(cov, name="posterior covariance S*").L
    return linalg.cholesky_jittered(cov, 1e-10)


class GaussianPosterior(Posterior):
    """The NNGP posterior, ``sigma^2 = s`` (prior ``Delta(s)``): Gaussian predictive, exact marginal likelihood."""

    kind = "gaussian"
    _LEAVES = Posterior._LEAVES + ("s",)

    @property
    def df(self):
        return math.inf

    @property
    def scale_posterior(self):
        return priors.Delta(self.s)

    def _predictive(self, mean, var, noisy):
        if self.noise_model == "scaled":
            loc, _, scale = _scaled_marginals(mean, var, self.noise if noisy else 0.0, 1.0, self.s, 1.0, self.squeeze)
            return dist.Normal(loc, scale)
        loc, scale = self._unscaled_pieces(mean, var, noisy)
        return dist.Normal(loc[0], scale[0])

    def _draw_scales(self, key, num_samples):
        return jnp.full((num_samples,), self.s)

    def _scale_mean(self):
        return self.s

    def _scale_samples(self):
        dtype = self._state["grid_alpha" if "grid_t" in self._state else "lam"].dtype
        return jnp.reshape(self.s, (1,)).astype(dtype), jnp.zeros(1, dtype)


class StudentTPosterior(Posterior):
    """The Student-t process (prior ``InverseGamma(a, b)``, scaled noise): ``sigma^2 | Y ~ InvGamma(a_post, b_post)``,
    Student-t predictive with ``df = 2a + N C``, exact marginal likelihood."""

    kind = "student_t"
    _LEAVES = Posterior._LEAVES + ("a_post", "b_post", "_df")

    @property
    def df(self):
        return _scalar(self._df)

    @property
    def scale_posterior(self):
        return priors.InverseGamma(self.a_post, self.b_post)

    def _predictive(self, mean, var, noisy):
        # scale^2 = (2 b' / df) var
        loc, _, scale = _scaled_marginals(mean, var, self.noise if noisy else 0.0, 2.0, self.b_post, self._df,
                                          self.squeeze)
        return dist.StudentT(self._df, loc, scale)

    def _draw_scales(self, key, num_samples):
        return priors.InverseGamma(self.a_post, self.b_post).sample(key, (num_samples,))

    def _scale_mean(self):
        # E[InvGamma(a', b')] = b' / (a' - 1), infinite for a' <= 1 (df <= 2)
        return jnp.where(self._df > 2, self.b_post / (self.a_post - 1), jnp.inf)


class ImportancePosterior(Posterior):
    """Any other prior, or unscaled noise: the scale posterior as self-normalised importance samples
    ``(beta, log w)`` (pruned of negligible weights); Gaussian-mixture predictive."""

    kind = "importance"
    _LEAVES = Posterior._LEAVES + ("beta", "log_w", "_ess")
    _STATIC = Posterior._STATIC + ("_num_samples",)

    @property
    def ess(self):
        return _scalar(self._ess)

    @property
    def num_samples(self):
        return self._num_samples

    def scale_posterior_samples(self):
        return self.beta, self.log_w

    def _predictive(self, mean, var, noisy):
        if self.noise_model == "scaled":
            # scale = sqrt(beta_s * var): kept factorised, (S, L) arrays are never formed to answer mean,
            # variance or log_prob
            loc, var, _ = _scaled_marginals(mean, var, self.noise if noisy else 0.0, 1.0, 1.0, 1.0, self.squeeze)
            return GaussianMixture._from_scale_factors(self.log_w, loc[None], self.beta, var)
        loc, scale = self._unscaled_pieces(mean, var, noisy)
        return GaussianMixture(self.log_w, loc, scale)

    def _draw_scales(self, key, num_samples):
        return self.beta[_weighted_indices(key, self.log_w, (num_samples,))]

    def _scale_mean(self):
        return jnp.sum(jnp.exp(self.log_w) * self.beta)

    def _scale_samples(self):
        return self.beta, self.log_w


def _test_chunk(n_train: int) -> int:
    """Test points predicted together by the dense path: their (L, N) cross-kernel and its triangular solve stay
    under a sixteenth of the N x N factor (at least 1,024 points)."""
    return max(1024, n_train // 16)


@functools.partial(jax.jit, static_argnums=6)
def _scaled_marginals(mean, var, noise, mult, num, den, squeeze):
    """Per test point (and output): mean, variance ``var + noise`` and ``sqrt(factor (var + noise))`` with
    ``factor = mult num / den``, compiled as one function."""
    var = (var + noise)[:, None] * jnp.ones_like(mean)
    scale = jnp.sqrt(mult * num / den * var)
    if squeeze:
        return mean[..., 0], var[..., 0], scale[..., 0]
    return mean, var, scale


@functools.partial(jax.jit, static_argnums=4)
def _latent_jit(kxt, kxx, alpha, chol_l, full_cov):
    # one compiled function rather than a handful of eager ops, each compiled on first use of a shape
    mean = kxt @ alpha
    v = linalg.solve_triangular(chol_l, kxt.T)
    if full_cov:
        cov = kxx - v.T @ v
    else:
        cov = jnp.clip(kxx - jnp.sum(v * v, axis=0), 0.0, None)
    return mean, cov
