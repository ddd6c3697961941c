"""The plumbing every exact empirical-NTK algorithm shares: `_Setup`, the shapes, split keyword arguments and
vmap axes of one NTK call, and the output leaves with their batch axes.

Its own module so that the Jacobian-contraction and NTK-vector-product algorithms (`smnngp.empirical._kernels`)
and the structured-derivatives one (`smnngp.empirical._structured`) import it from below, and neither imports
the other's module back.
"""

from __future__ import annotations

import jax

from smnngp.empirical import _axes


class _Setup:
    """Shapes, split keyword arguments and vmap axes of one NTK call.

    ``side(x, kw)`` returns the parameter function ``p -> f(p, x, **kw)`` (for one example when ``vmap_axes``
    is given: the size-1 example axis is inserted into ``x`` and the keyword arrays, and removed from the
    outputs).
    """

    def __init__(self, f, params, vmap_axes, x1, x2, apply_fn_kwargs):
        self.f = f
        self.kw1, self.kw2 = _axes.split_kwargs(apply_fn_kwargs, x1, x2)
        self.fx1 = jax.eval_shape(lambda p: f(p, x1, **self.kw1), params)
        self.fx2 = self.fx1 if x2 is None else jax.eval_shape(lambda p: f(p, x2, **self.kw2), params)
        self.x_axis, self.fx_axis, self.kw_axes = _axes.canonical_vmap_axes(vmap_axes, x1, self.fx1, self.kw1)
        self.vmapped = self.x_axis is not None or bool(self.kw_axes)
        if self.vmapped and self.fx_axis is None:
            raise ValueError("empirical_ntk_fn: vmap_axes needs an output axis (out_axes) when it maps inputs")
        self.keys = tuple(apply_fn_kwargs)

    def side(self, x, kw: dict):
        if self.vmapped:
            x = _axes.expand(x, self.x_axis)
            kw = {k: (_axes.expand(v, self.kw_axes[k]) if k in self.kw_axes else v) for k, v in kw.items()}

        def fp(p):
            out = self.f(p, x, **kw)
            return _axes.squeeze(out, self.fx_axis) if self.vmapped else out

        return fp

    def in_axes(self):
        """vmap in_axes for ``(x, *kwarg values in self.keys order)``."""
        return [self.x_axis] + [self.kw_axes.get(k) for k in self.keys]

    def args(self, kw):
        return [kw[k] for k in self.keys]


def _out_leaves_and_axes(setup):
    leaves1 = jax.tree_util.tree_leaves(setup.fx1)
    leaves2 = jax.tree_util.tree_leaves(setup.fx2)
    axes = (jax.tree_util.tree_leaves(setup.fx_axis) if setup.vmapped else [None] * len(leaves1))
    return leaves1, leaves2, axes
