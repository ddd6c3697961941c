"""Hessians of the data term ``E = sum_t w_t (f_t - y_t)^2 / (2 sigma^2)`` per layer (Eqs. 19-21):
`preactivation_hessians` (the backward recursion of Eq. 21), `layer_hessians` (exact, Gauss-Newton, K-FAC or
diagonal blocks), `autodiff_layer_hessians` (the ``jax.hessian`` reference), and the clamps that make an
indefinite block usable (eigenvalue clipping, the Gershgorin shift).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from finite.ard._network import ACTIVATIONS, ArdMLP, Layer
from finite.ard._prior import HESSIANS

__all__ = ["layer_hessians", "autodiff_layer_hessians", "preactivation_hessians"]


def preactivation_hessians(model: ArdMLP, params, Z, y, w, sigma2, *, gauss_newton: bool = False):
    """Per-sample pre-activation Hessians ``Hpre^l_t = d^2 E_t / dh^l dh^l`` by the backward recursion of Eq. 21,
    ``Hpre^l = B^l W^{l+1} Hpre^{l+1} W^{l+1 T} B^l + D^l`` (``B = diag f'(h)``, ``D = diag(f''(h) dE/da)``; without
    ``D`` with ``gauss_newton``), from ``Hpre^L = w_t / sigma^2`` at the linear output. Exact for one sample of an
    MLP.

    Args:
        model: the :class:`ArdMLP` (its activation gives ``f'`` and ``f''``).
        params: the network parameters, a tuple of :class:`Layer`.
        Z: regressors ``(N, sizes[0])``.
        y: targets ``(N,)``.
        w: sample weights ``(N,)`` of the data term ``E = sum_t w_t (f_t - y_t)^2 / (2 sigma^2)``.
        sigma2: the noise variance ``sigma^2`` of the data term (a positive scalar).
        gauss_newton: drop the ``D^l`` term (the Gauss-Newton approximation); default ``False`` (exact).

    Returns:
        ``(list of (N, n_l, n_l) per layer, list of layer inputs a^{l-1} (N, n_{l-1}))``.
    """
    _, d1, d2 = ACTIVATIONS[model.activation]
    f, hs, ins = model.forward(params, Z)
    L = len(params)
    g_h = (w * (f - y) / sigma2)[:, None]  # dE_t/dh^L
    H = (w / sigma2)[:, None, None] * jnp.ones((1, 1, 1), Z.dtype)
    out = [None] * L
    out[L - 1] = H
    for l in range(L - 2, -1, -1):
        Wn = params[l + 1].W
        g_a = g_h @ Wn.T
        Ha = jnp.einsum("ij,tjk,lk->til", Wn, H, Wn)
        b = d1(hs[l])
        H = b[:, :, None] * Ha * b[:, None, :]
        if not gauss_newton:
            H = H + jax.vmap(jnp.diag)(d2(hs[l]) * g_a)
        g_h = b * g_a
        out[l] = H
    return out, ins


def layer_hessians(model: ArdMLP, params, Z, y, w, sigma2, kind: str = "diagonal") -> tuple:
    """The Hessian of ``E`` with respect to each layer's weights (vectorised row-major: weight ``(i, j)`` is index
    ``i * n_out + j``), holding the other layers fixed (Eq. 19). ``kind`` one of :data:`HESSIANS` (module
    docstring).

    Args:
        model: the :class:`ArdMLP`.
        params: the network parameters, a tuple of :class:`Layer`.
        Z: regressors ``(N, sizes[0])``.
        y: targets ``(N,)``.
        w: sample weights ``(N,)`` of the data term.
        sigma2: the noise variance ``sigma^2`` of the data term (a positive scalar).
        kind: one of :data:`HESSIANS`; default ``"diagonal"``.

    Returns:
        A tuple with, per layer, a dense ``(n, n)`` block (``n = n_in * n_out``), or for ``"diagonal"`` the
        ``(n_in, n_out)`` diagonal.

    Raises:
        ValueError: ``kind`` is not one of :data:`HESSIANS`.
    """
    if kind not in HESSIANS:
        raise ValueError(f"layer_hessians: unknown kind {kind!r}; choose from {HESSIANS}")
    Hpre, ins = preactivation_hessians(model, params, Z, y, w, sigma2, gauss_newton=(kind == "gauss-newton"))
    out = []
    for a, Hp, (n_in, n_out) in zip(ins, Hpre, model.shapes):
        if kind == "diagonal":
            out.append(jnp.einsum("ti,tj->ij", a * a, jnp.diagonal(Hp, axis1=1, axis2=2)))
        elif kind in ("exact", "gauss-newton"):
            out.append(jnp.einsum("ti,tk,tjl->ijkl", a, a, Hp).reshape(n_in * n_out, n_in * n_out))
        else:  # kfac: N E[a a^T] (x) E[Hpre]  (weights w_t are already inside Hpre)
            n = a.shape[0]
            out.append(jnp.kron(a.T @ a / n, jnp.sum(Hp, axis=0)))
    return tuple(out)


def autodiff_layer_hessians(model: ArdMLP, params, Z, y, w, sigma2) -> tuple:
    """The exact layer blocks of :func:`layer_hessians` by ``jax.hessian`` (the independent check of the
    recursion; quadratic memory in the layer size). Algorithm 1 uses the recursion instead: ``jax.hessian``
    inside the repeat-vectorised compiled program stalled the XLA CPU runtime (JAX 0.10.2) in our runs, while the
    recursion gives the same block (``tests/test_ard.py``) at a fraction of the cost.

    Args:
        model: the :class:`ArdMLP`.
        params: the network parameters, a tuple of :class:`Layer`.
        Z: regressors ``(N, sizes[0])``.
        y: targets ``(N,)``.
        w: sample weights ``(N,)`` of the data term ``E = sum_t w_t (f_t - y_t)^2 / (2 sigma^2)``.
        sigma2: the noise variance ``sigma^2`` (a positive scalar).

    Returns:
        A tuple with, per layer, the dense ``(n_in * n_out, n_in * n_out)`` Hessian of ``E`` with respect to the
        row-major vectorised weights of that layer (the other layers and all biases held fixed).
    """
    blocks = []
    for l, (n_in, n_out) in enumerate(model.shapes):
        def E(vecW, l=l, n_in=n_in, n_out=n_out):
            ps = list(params)
            ps[l] = Layer(vecW.reshape(n_in, n_out), params[l].b)
            r = model.apply(tuple(ps), Z) - y
            return 0.5 * jnp.sum(w * r * r) / sigma2
        blocks.append(jax.hessian(E)(params[l].W.ravel()))
    return tuple(blocks)


def _clamp_psd(H):
    """``H`` with its negative eigenvalues set to zero (host-side use: the Laplace posterior)."""
    lam, U = jnp.linalg.eigh(0.5 * (H + H.T))
    return (U * jnp.clip(lam, 0.0, None)[None, :]) @ U.T


def _gershgorin_psd(H):
    """``H + delta I`` with the smallest Gershgorin shift ``delta >= 0`` that makes it PSD. Used inside the
    compiled Algorithm 1 for blocks that can be indefinite (tanh / sigmoid with the ``D^l`` term): a vmapped
    ``eigh`` of a few hundred rows next to the free-run ``lax.scan`` stalled XLA's CPU runtime (JAX 0.10.2)."""
    radius = jnp.sum(jnp.abs(H), axis=1) - jnp.abs(jnp.diag(H))
    delta = jnp.maximum(0.0, -jnp.min(jnp.diag(H) - radius))
    return H + delta * jnp.eye(H.shape[0], dtype=H.dtype)
