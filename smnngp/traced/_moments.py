"""Second moments (NNGP) and NTKs between the infinite-width variables of a traced program.

`Moments.field(F, G)` is the `smnngp.kernels.Kernel` of two fields: ``nngp`` = E[F(x1) G(x2)] averaged over the
width, ``ntk`` the tangent kernel, ``cov1`` / ``cov2`` = E[F(x) G(x)] at the points of x1 / x2. It is the sum,
over pairs of terms, of their coefficients times the terms' moments, each computed once (memoised):

* ``W a`` with ``W' b``: zero for different weights; for the same weight, the weight's affine map (a stax
  ``Dense`` with the leaf's variance) applied to the moments of ``a`` and ``b`` — the Tensor Programs rule, which
  holds for a weight used once or several times;
* a bias with itself: its variance (the NTK: its variance under ``'ntk'``, 1 under ``'standard'``);
* ``phi(g)`` with ``psi(h)``: the bivariate Gaussian expectation over (g(x1), h(x2)) — the activation's closed
  form (for ``phi(g)`` with itself, the stax layer's own map, the same program as a stax network), the two
  functions' polar quadrature otherwise (`gauss_polar_2d`, split where either is 0); NTK
  ``E[phi'(g) psi'(h)] Theta(g, h)``;
* ``phi(g)`` with a Gaussian ``a``: Stein's lemma, ``E[phi'(g)] Cov(g, a)``;
* the all-ones vector with ``phi(g)``: ``E[phi(g)]``; with a Gaussian: zero;
* a linear spatial map (pooling, flattening) of ``a`` with the same map of ``b``: the stax layer's kernel map of
  the moments of ``a`` and ``b``; with a weight or bias term that ``a`` does not hold: zero;
* part of a weight's (a bias's) units with another part of them (slices of a fused projection): the share of
  aligned coordinates that hold the same unit times the whole weight's moments (1 for the same slice, 0 for
  disjoint ones: different columns of a weight are independent);
* two concatenations along the width split alike: the width-weighted average of their parts' moments.

Fields with spatial axes carry kernels with spatial axes (all position pairs, or their diagonal when the network
allows it: ``Kernel.full``).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from smnngp.kernels import Kernel
from smnngp.stax.attention import _sandwich as sandwich
from smnngp.stax.attention import _sandwich_diag as sandwich_diag
from smnngp.stax.elementwise import gauss_polar_2d, gauss_split_1d
from smnngp.traced._activations import quadrature_nodes, recognise
from smnngp.traced._errors import TracedError
from smnngp.traced._values import Affine, BiasTerm, Concat, DataIn, Field, Mapped, Mixed, Nonlin, Ones, PerEx


def side_values(coef, x2_is_x1: bool):
    """A coefficient's values over the points of x1 and of x2 (floats stay floats)."""
    if isinstance(coef, PerEx):
        return coef.v1, (coef.v1 if x2_is_x1 or coef.v2 is None else coef.v2)
    return coef, coef


class Moments:
    """The moments of one evaluation (one pair of inputs, or one tile of them), from the input kernel ``k0``."""

    def __init__(self, k0: Kernel, deg: int, recognised: dict, report: dict, stacked: Kernel | None = None):
        self.stacked = stacked  # the kernel of several input values at every pair of positions (or None)
        self.recognised = recognised
        self.report = report
        self.k0 = k0
        self.deg = deg
        self.nodes = quadrature_nodes(deg)  # (n_theta, n_r, n_1d): the polar and 1-d rules' nodes (no closed form)
        self.memo: dict = {}
        self.keep: list = []  # memo keys are ids: keep their objects alive
        self.want_ntk = k0.ntk is not None
        self.x2_is_x1 = k0.cov2 is None
        self.n1, self.n2 = k0.nngp.shape[0], k0.nngp.shape[1]
        self.dtype = k0.nngp.dtype
        self.symmetric = True

    # -- kernels of constants and combinations ------------------------------------------------------------
    def _positions(self, spatial: tuple) -> tuple:
        """The spatial axes of a kernel of activations with these spatial sizes (pairs when ``full``)."""
        if self.k0.full:
            return tuple(n for size in spatial for n in (size, size))
        return tuple(spatial)

    def constant(self, nngp_value, ntk_value, width: int, gaussian: bool, spatial: tuple = ()) -> Kernel:
        pos = self._positions(spatial)
        full = jnp.full((self.n1, self.n2) + pos, nngp_value, self.dtype)
        return self._kernel(
            full,
            None if not self.want_ntk else jnp.full((self.n1, self.n2) + pos, ntk_value, self.dtype),
            jnp.full((self.n1,) + pos, nngp_value, self.dtype),
            None if self.x2_is_x1 else jnp.full((self.n2,) + pos, nngp_value, self.dtype),
            width, gaussian, spatial)

    def _per_position(self, k: Kernel, axes: tuple, spatial: tuple) -> Kernel:
        """``k`` with the covariance between two different positions along ``axes`` set to zero (independent
        draws per position: a positional embedding). A kernel of same-position covariances is unchanged."""
        if not self.k0.full:
            return k
        mask = jnp.ones((), self.dtype)
        for a, size in enumerate(spatial):
            eye = jnp.eye(size, dtype=self.dtype) if a in axes else jnp.ones((size, size), self.dtype)
            mask = jnp.multiply.outer(mask, eye)
        return k.replace(nngp=k.nngp * mask[None, None], ntk=None if k.ntk is None else k.ntk * mask[None, None],
                         cov1=k.cov1 * mask[None], cov2=None if k.cov2 is None else k.cov2 * mask[None])

    def _kernel(self, nngp, ntk, cov1, cov2, width, gaussian, spatial: tuple = ()) -> Kernel:
        return self.k0.replace(nngp=nngp, ntk=ntk, cov1=cov1, cov2=cov2,
                               shape1=(self.k0.shape1[0],) + tuple(spatial) + (width,),
                               shape2=(self.k0.shape2[0],) + tuple(spatial) + (width,), is_gaussian=gaussian)

    def _scaled(self, k: Kernel, c, d) -> Kernel:
        if not isinstance(c, PerEx) and not isinstance(d, PerEx):
            s = c * d
            if s == 1.0:
                return k
            return k.replace(nngp=k.nngp * s, ntk=None if k.ntk is None else k.ntk * s, cov1=k.cov1 * s,
                             cov2=None if k.cov2 is None else k.cov2 * s)
        c1, c2 = side_values(c, self.x2_is_x1)
        d1, d2 = side_values(d, self.x2_is_x1)
        rows = c1[:, None] if jnp.ndim(c1) else c1
        cols = d2[None, :] if jnp.ndim(d2) else d2
        pair = rows * cols
        return k.replace(nngp=k.nngp * pair, ntk=None if k.ntk is None else k.ntk * pair, cov1=k.cov1 * (c1 * d1),
                         cov2=None if k.cov2 is None else k.cov2 * (c2 * d2))

    @staticmethod
    def _add(a: Kernel | None, b: Kernel | None) -> Kernel | None:
        if a is None:
            return b
        if b is None:
            return a
        return a.replace(nngp=a.nngp + b.nngp, ntk=None if a.ntk is None else a.ntk + b.ntk,
                         cov1=a.cov1 + b.cov1, cov2=None if a.cov2 is None else a.cov2 + b.cov2,
                         is_gaussian=a.is_gaussian and b.is_gaussian)

    def field(self, F, G) -> Kernel | None:
        """Moments of two fields (or of the input with itself); ``None`` when they are exactly zero."""
        if isinstance(F, Concat) or isinstance(G, Concat):
            return self._concat(F, G)
        if isinstance(F, DataIn) or isinstance(G, DataIn):
            if isinstance(F, DataIn) and isinstance(G, DataIn):
                if F.index is None:
                    return self.k0
                i, j, k = F.index, G.index, self.stacked
                return self.k0.replace(nngp=k.nngp[:, :, i, j], cov1=k.cov1[:, i, j],
                                       cov2=None if k.cov2 is None else k.cov2[:, i, j])
            raise ValueError("smnngp.traced: one weight multiplies both the input and an activation; the input's "
                             "moments with an infinite-width activation are not defined")
        total = None
        for t, c in F.terms:
            for u, d in G.terms:
                k = self.term(t, u, F.spatial)
                if k is not None:
                    total = self._add(total, self._scaled(k, c, d))
        if total is not None:
            total = total.replace(shape1=(self.k0.shape1[0],) + F.spatial + (F.width,),
                                  shape2=(self.k0.shape2[0],) + G.spatial + (G.width,),
                                  is_gaussian=F.gaussian and G.gaussian and F is G)
        return total

    def _concat(self, F, G) -> Kernel | None:
        """Two concatenations along the width split alike: ``sum_i n_i / n * E[F_i G_i]`` (stax's `FanInConcat`)."""
        if not (isinstance(F, Concat) and isinstance(G, Concat)) or F.units != G.units:
            raise TracedError("smnngp.traced: one weight multiplies a concatenation along the width and a value "
                              "that is not split into the same parts (a weight reused on differently concatenated "
                              "activations); this pairing is not supported")
        total = None
        for f, g, units in zip(F.parts, G.parts, F.units):
            k = self.field(f, g)
            if k is not None:
                total = self._add(total, self._scaled(k, len(units) / F.width, 1.0))
        if total is not None:
            total = total.replace(shape1=(self.k0.shape1[0],) + F.spatial + (F.width,),
                                  shape2=(self.k0.shape2[0],) + G.spatial + (G.width,),
                                  is_gaussian=F.gaussian and G.gaussian and F is G)
        return total

    def field_or_zero(self, F, G) -> Kernel:
        k = self.field(F, G)
        return self.constant(0.0, 0.0, F.width, False, F.spatial) if k is None else k

    # -- pairs of terms -----------------------------------------------------------------------------------
    def term(self, t, u, spatial: tuple = ()) -> Kernel | None:
        """Moments of two terms of fields with spatial sizes ``spatial`` (memoised)."""
        key = (id(t), id(u))
        if key not in self.memo:
            self.keep.append((t, u))
            self.memo[key] = self._term(t, u, spatial)
        return self.memo[key]

    def _term(self, t, u, spatial: tuple) -> Kernel | None:
        if isinstance(t, Affine) and isinstance(u, Affine):
            share = 0.0 if t.weight != u.weight else coincidence(t.units, u.units)
            if not share:
                return None
            inner = self.field(t.inp, u.inp)
            if inner is None:
                return None
            k = t.layer.kernel_map(inner.replace(is_gaussian=True))
            return k if share == 1.0 else self._scaled(k, share, 1.0)
        if isinstance(t, Mixed) or isinstance(u, Mixed):
            return self._mixed(t, u)
        if isinstance(t, Mapped) or isinstance(u, Mapped):
            return self._mapped(t, u)
        if isinstance(t, BiasTerm) and isinstance(u, BiasTerm):
            share = 0.0 if t.leaf != u.leaf else coincidence(t.units, u.units)
            if not share:
                return None
            k = self.constant(t.variance * share, t.ntk * share, 1, True, spatial)
            return self._per_position(k, t.positional, spatial) if t.positional else k
        if isinstance(t, Ones) and isinstance(u, Ones):
            return self.constant(1.0, 0.0, 1, False, spatial)
        if isinstance(t, Nonlin) and isinstance(u, Nonlin):
            return self._nonlin_pair(t, u)
        if isinstance(t, Nonlin) or isinstance(u, Nonlin):
            nl, other, first = (t, u, True) if isinstance(t, Nonlin) else (u, t, False)
            if spatial:
                if isinstance(other, Ones):
                    what = "a constant (a shift of the activation)"
                elif any(other is a for a, _ in nl.base.terms):
                    what = "its own pre-activation (a skip connection around the nonlinearity)"
                else:
                    what = ("a Gaussian field it is correlated with (a skip connection: the block's input, or an "
                            "affine map of what the activation reads)")
                raise TracedError(f"smnngp.traced: an activation of a spatial (convolutional or sequence) layer "
                                  f"({nl.where}) summed with {what}; the cross term of an activation and a "
                                  f"Gaussian is supported for activations without spatial axes, not yet for "
                                  f"spatial ones")
            if isinstance(other, Ones):
                m1, m2 = self.mean(nl)
                return self._outer(m1, m2, first)
            return self._stein(nl, other, first)
        return None  # a Gaussian with the all-ones vector, or two different Gaussian atoms

    def _mapped(self, t, u) -> Kernel | None:
        """Pairs with a linear spatial map: the same map of two fields, or a provably independent pair."""
        if isinstance(t, Mapped) and isinstance(u, Mapped) and t.key == u.key:
            inner = self.field(t.inp, u.inp)
            return None if inner is None else t.layer.kernel_map(inner)
        if _independent(t, u):
            return None
        raise TracedError("smnngp.traced: a pooled or flattened activation meets another activation that it is "
                          "correlated with (a sum or product across a pooling or a flattening, or two different "
                          "poolings of one activation); this pairing is not supported yet")

    def _mixed(self, t, u) -> Kernel | None:
        """Attention's weighted sums of one operation: ``A1 K A2^T`` over the positions (NNGP, NTK, covariances;
        the weights are deterministic, so the NTK is mixed the same way)."""
        if isinstance(t, Mixed) and isinstance(u, Mixed) and t.key == u.key:
            inner = self.field(t.inp, u.inp)
            if inner is None:
                return None
            a1 = t.weights.v1
            a2 = a1 if self.x2_is_x1 or t.weights.v2 is None else t.weights.v2
            ntk = inner.ntk
            if ntk is not None and jnp.ndim(ntk):
                ntk = sandwich(a1, jnp.broadcast_to(ntk, inner.nngp.shape), a2)
            return inner.replace(nngp=sandwich(a1, inner.nngp, a2), ntk=ntk, cov1=sandwich_diag(a1, inner.cov1),
                                 cov2=None if inner.cov2 is None else sandwich_diag(a2, inner.cov2))
        if _independent(t, u):
            return None
        raise TracedError("smnngp.traced: an attention output meets another activation that it is correlated with "
                          "(a residual connection around attention); this pairing is not supported yet")

    def _outer(self, m1, m2, first: bool) -> Kernel:
        """E[phi(g(x1)) * 1] = m(x1) (``first``), or E[1 * phi(g(x2))] = m(x2)."""
        ones1 = jnp.ones((self.n1,), self.dtype)
        ones2 = jnp.ones((self.n2,), self.dtype)
        nngp = (m1[:, None] * ones2[None, :]) if first else (ones1[:, None] * m2[None, :])
        return self._kernel(nngp, None if not self.want_ntk else jnp.zeros_like(nngp), m1,
                            None if self.x2_is_x1 else m2, 1, False)

    # -- activations --------------------------------------------------------------------------------------
    def recognition(self, nl: Nonlin):
        """How the chain of ``nl`` is read (`recognise`, memoised), without reporting it as an activation."""
        key = (nl.origin, jnp.dtype(self.dtype).name)
        if key not in self.recognised:
            self.recognised[key] = recognise(nl.fn, self.dtype, self.deg)
        return self.recognised[key]

    def activation(self, nl: Nonlin):
        """`recognition`, reported in ``kernel_fn.activations``: the chain's kernel or moments are used."""
        found = self.recognition(nl)
        self.report.setdefault(nl.origin, (nl.where, found[0].name))
        return found

    def variances(self, g: Field):
        k = self.field_or_zero(g, g)
        return k.cov1, (k.cov1 if self.x2_is_x1 else k.cov2), k

    def mean(self, nl: Nonlin):
        """E[phi(g)] over the points of x1 and of x2."""
        _, mean, _, _ = self.recognition(nl)
        if mean is None and nl.prod is not None:  # the mean of a product of fields is their second moment (exact:
            k = self.field_or_zero(*nl.prod)     # no activation read, ``mean(h ** 2)`` in a layer norm)
            return k.cov1, (k.cov1 if self.x2_is_x1 else k.cov2)
        self.activation(nl)
        v1, v2, _ = self.variances(nl.base)
        if mean is not None:
            return mean(v1), mean(v2)
        n = self.nodes[2]
        return gauss_split_1d(nl.fn, v1, n), gauss_split_1d(nl.fn, v2, n)

    def mean_dot(self, nl: Nonlin):
        """E[phi'(g)] over the points of x1 and of x2."""
        _, _, mean_dot, _ = self.activation(nl)
        v1, v2, _ = self.variances(nl.base)
        if mean_dot is not None:
            return mean_dot(v1), mean_dot(v2)
        dfn = jnp.vectorize(jax.grad(nl.fn))
        n = self.nodes[2]
        return gauss_split_1d(dfn, v1, n), gauss_split_1d(dfn, v2, n)

    def _stein(self, nl: Nonlin, atom, first: bool) -> Kernel | None:
        atom_field = nl.base.like(((atom, 1.0),))
        cross = self.field(nl.base, atom_field) if first else self.field(atom_field, nl.base)
        if cross is None:
            return None
        d1, d2 = self.mean_dot(nl)
        coef = PerEx(d1, None if self.x2_is_x1 else d2, ("b",))
        k = self._scaled(cross, coef, 1.0) if first else self._scaled(cross, 1.0, coef)
        return k.replace(is_gaussian=False)

    def _nonlin_pair(self, t: Nonlin, u: Nonlin) -> Kernel:
        layer_t, _, _, closed_t = self.activation(t)
        layer_u, _, _, closed_u = self.activation(u)
        if not (closed_t and closed_u):
            self.symmetric = False  # quadrature rules are not symmetric in (x1, x2)
        if t is u:
            return layer_t.kernel_map(self.field_or_zero(t.base, t.base).replace(is_gaussian=True))
        if t.base.spatial:
            raise TracedError(f"smnngp.traced: two different activations of spatial (convolutional) layers meet in "
                              f"one sum or product ({t.where} and {u.where}); their cross-moments are not "
                              f"supported yet for spatial activations")
        g1, _, kg = self.variances(t.base)
        _, h2, kh = self.variances(u.base)
        h1 = kh.cov1
        g2 = kg.cov1 if self.x2_is_x1 else kg.cov2
        cross = self.field_or_zero(t.base, u.base)
        c1 = cross.cov1
        c2 = cross.cov1 if self.x2_is_x1 else cross.cov2
        same = layer_t.name == layer_u.name and layer_t.name.startswith(("ABRelu", "Relu", "LeakyRelu", "Abs",
                                                                         "Erf", "Gelu", "Sin", "Exp", "Sign"))
        if same:
            moments = layer_t.moments
            nngp, dot = moments(cross.nngp, g1[:, None], h2[None, :], self.want_ntk)
            cov1, _ = moments(c1, g1, h1, False)
            cov2 = None if self.x2_is_x1 else moments(c2, g2, h2, False)[0]
        else:
            self.symmetric = False
            fa, fb = t.fn, u.fn
            n_theta, n_r, _ = self.nodes

            def quad(f1, f2, c, v1, v2):
                return gauss_polar_2d(f1, f2, c, v1, v2, n_theta, n_r)

            nngp = quad(fa, fb, cross.nngp, g1[:, None], h2[None, :])
            dot = None
            if self.want_ntk:
                da, db = jnp.vectorize(jax.grad(fa)), jnp.vectorize(jax.grad(fb))
                dot = quad(da, db, cross.nngp, g1[:, None], h2[None, :])
            cov1 = quad(fa, fb, c1, g1, h1)
            cov2 = None if self.x2_is_x1 else quad(fa, fb, c2, g2, h2)
        ntk = None if not self.want_ntk else dot * cross.ntk
        return self._kernel(nngp, ntk, cov1, cov2, t.base.width, False)


def coincidence(a, b) -> float:
    """The share of aligned coordinates at which two parts of one weight's (bias's) units, ``a`` and ``b`` (index
    tuples; None: every unit in order), hold the same unit: their moments are that share of the whole's."""
    if a == b:
        return 1.0
    ia = None if a is None else np.asarray(a)
    ib = None if b is None else np.asarray(b)
    n = len(ia) if ia is not None else len(ib)
    ia = np.arange(n) if ia is None else ia
    ib = np.arange(n) if ib is None else ib
    if ia.shape != ib.shape:
        raise TracedError(f"smnngp.traced: two parts of one weight's units of different widths ({len(ia)} and "
                          f"{len(ib)}) meet in one moment")
    return float(np.count_nonzero(ia == ib)) / n


def sources(x) -> frozenset:
    """The random leaves (weights and biases) a term or field depends on."""
    if isinstance(x, Field):
        return frozenset().union(*(sources(t) for t, _ in x.terms))
    if isinstance(x, Concat):
        return frozenset().union(*(sources(p) for p in x.parts))
    found = x.__dict__.get("_sources") if hasattr(x, "__dict__") else None
    if found is not None:
        return found
    if isinstance(x, Affine):
        found = frozenset({("w", x.weight[0])}) | sources(x.inp)
    elif isinstance(x, BiasTerm):
        found = frozenset({("b", x.leaf[0])})
    elif isinstance(x, Nonlin):
        found = sources(x.base)
    elif isinstance(x, (Mapped, Mixed)):
        found = sources(x.inp)
    else:  # the input, the ones vector
        found = frozenset()
    x.__dict__["_sources"] = found
    return found


def _own(t):
    """The leaf a Gaussian atom draws fresh (a weight used once, a bias), or None."""
    if isinstance(t, Affine):
        return ("w", t.weight[0])
    if isinstance(t, BiasTerm):
        return ("b", t.leaf[0])
    return None


def _independent(t, u) -> bool:
    """Whether E[t u] = 0 because one side is a zero-mean Gaussian draw of a leaf the other side does not hold."""
    for a, b in ((t, u), (u, t)):
        parts = [a] if not isinstance(a, (Mapped, Mixed)) else [s for s, _ in a.inp.terms]
        if parts and all(_own(p) is not None and _own(p) not in sources(b) for p in parts):
            return True
    return False
