"""Masked ResNet-18 for images (Kong et al. 2023, section 6.4 and Table 2; notes section 1.1 and 3.5).

The CIFAR variant of ResNet-18: a 3 x 3 stem convolution (stride 1, no max-pool), four stages of two
BasicBlocks with ``channels`` planes (strides 1, 2, 2, 2), global average pooling and a dense readout.
Every ReLU carries a channel mask: the stem's, and two per block (after the first convolution's batch norm,
and after the residual addition, so the second masks the block output) -- 17 masks in all. The authors'
physical widths are the standard ones times 5/4 (80, 160, 320, 640) with 4/5 of the channels (64 ... 512)
active at the start; ``masked_resnet18(width=...)`` scales all widths for small-scale runs and tests.

Batch normalisation as in the authors' network: in training (``apply_train`` and ``apply`` without a state)
it normalises with the mini-batch statistics; ``apply`` with a state uses the running averages, which
``apply_train`` updates with momentum 0.1 (PyTorch's convention, unbiased variance). Batch-norm scales and
shifts are parameters without a prior (`log_prior` puts Cauchy(0, scale) on convolution and dense weights
and the readout bias only). Convolutions are ``smnngp.stax.Conv`` layers in the standard parameterisation
without bias (He-normal initialisation); the readout is ``smnngp.stax.Dense``.

Parameter pytree: ``{"stem": W, "stem_bn": (g, b), "blocks": ({"conv1", "bn1", "conv2", "bn2"[, "short",
"short_bn"]}, ...), "head": (W, b)}``; masks: a tuple of 17 float 0/1 vectors, ``widths`` gives their sizes.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import numpyro.distributions as dist

from finite.masked import masked_relu
from smnngp import stax
from smnngp._axes import lead

__all__ = ["MaskedResNet18", "masked_resnet18", "BN_MOMENTUM", "BN_EPS"]

BN_MOMENTUM = 0.1
BN_EPS = 1e-5
_STRIDES = (1, 2, 2, 2)


def _conv(c, k, stride):
    return stax.Conv(c, (k, k), strides=(stride, stride), padding="SAME", W_std=math.sqrt(2.0), b_std=None,
                     parameterization="standard")


def _bn_train(x, gb, run):
    """Batch norm with the batch's statistics; returns the output and the updated running (mean, var)."""
    g, b = gb
    axes = tuple(range(x.ndim - 1))
    mean = jnp.mean(x, axes)
    var = jnp.var(x, axes)
    d = x.ndim  # the per-channel statistics and (gamma, beta) broadcast over the batch and spatial axes
    out = (x - lead(mean, d)) * lead(jax.lax.rsqrt(var + BN_EPS), d) * lead(g, d) + lead(b, d)
    if run is None:
        return out, None
    n = x.size // x.shape[-1]
    unbiased = var * (n / max(n - 1, 1))
    new = ((1 - BN_MOMENTUM) * run[0] + BN_MOMENTUM * jax.lax.stop_gradient(mean),
           (1 - BN_MOMENTUM) * run[1] + BN_MOMENTUM * jax.lax.stop_gradient(unbiased))
    return out, new


def _bn_eval(x, gb, run):
    g, b = gb
    d = x.ndim
    return (x - lead(run[0], d)) * lead(jax.lax.rsqrt(run[1] + BN_EPS), d) * lead(g, d) + lead(b, d), None


class MaskedResNet18(NamedTuple):
    """Static description of a masked ResNet-18 (see the module docstring).

    in_shape: ``(H, W, C)``; channels: physical planes of the four stages; active: initially active planes
    of the four stages (the stem starts like stage 1); out_dim: classes.
    """

    in_shape: tuple
    channels: tuple
    active: tuple
    out_dim: int

    @property
    def widths(self) -> tuple:
        """Sizes of the 17 masks: stem, then (after conv1, block output) for each of the 8 blocks."""
        w = [self.channels[0]]
        for c in self.channels:
            w += [c, c, c, c]
        return tuple(w)

    def _initial_active(self) -> tuple:
        a = [self.active[0]]
        for c in self.active:
            a += [c, c, c, c]
        return tuple(a)

    def _block_specs(self):
        """(in_planes, planes, stride, has_projection) of the 8 blocks."""
        specs, c_in = [], self.channels[0]
        for c, s in zip(self.channels, _STRIDES):
            for j in range(2):
                stride = s if j == 0 else 1
                specs.append((c_in, c, stride, stride != 1 or c_in != c))
                c_in = c
        return specs

    def init(self, key, dtype=jnp.float32):
        """``(params, masks)``: He-normal convolutions, unit batch-norm scales, a N(0, 1/fan_in) readout."""
        keys = iter(jax.random.split(key, 32))
        H, W, C = self.in_shape

        def conv_w(c_in, c_out, k, stride):
            _, (w, _) = _conv(c_out, k, stride)[0](next(keys), (1, H, W, c_in))
            return w.astype(dtype)

        def bn(c):
            return (jnp.ones(c, dtype), jnp.zeros(c, dtype))

        blocks = []
        for c_in, c, stride, proj in self._block_specs():
            blk = {"conv1": conv_w(c_in, c, 3, stride), "bn1": bn(c), "conv2": conv_w(c, c, 3, 1), "bn2": bn(c)}
            if proj:
                blk["short"] = conv_w(c_in, c, 1, stride)
                blk["short_bn"] = bn(c)
            blocks.append(blk)
        _, (hw, hb) = stax.Dense(self.out_dim, W_std=1.0, b_std=0.0, parameterization="standard")[0](
            next(keys), (1, self.channels[-1]))
        params = {"stem": conv_w(C, self.channels[0], 3, 1), "stem_bn": bn(self.channels[0]),
                  "blocks": tuple(blocks), "head": (hw.astype(dtype), jnp.zeros(self.out_dim, dtype))}
        masks = tuple((jnp.arange(p) < a).astype(dtype) for p, a in zip(self.widths, self._initial_active()))
        return params, masks

    def init_state(self, params):
        """Running batch-norm statistics: a tuple of (mean 0, variance 1) pairs, one per batch norm in forward
        order (stem; then per block bn1, bn2 and the projection's)."""
        return tuple((jnp.zeros_like(g), jnp.ones_like(g)) for g, _ in _bn_params(params))

    def _check(self, params, masks, x):
        if len(masks) != 17:
            raise ValueError(f"MaskedResNet18: 17 masks expected, got {len(masks)}")
        if x.ndim != 4 or tuple(x.shape[1:]) != tuple(self.in_shape):
            raise ValueError(f"MaskedResNet18: inputs of shape (N, {', '.join(map(str, self.in_shape))}) "
                             f"expected, got {tuple(x.shape)}")

    def _forward(self, params, masks, x, bn_fn, state):
        self._check(params, masks, x)
        runs = None if state is None else iter(state)
        new_runs = []

        def norm(h, gb):
            out, new = bn_fn(h, gb, None if runs is None else next(runs))
            new_runs.append(new)
            return out

        m = iter(masks)
        h = _conv(self.channels[0], 3, 1)[1]((params["stem"], None), x)
        h = masked_relu(norm(h, params["stem_bn"]), next(m))
        for blk, (_, c, stride, proj) in zip(params["blocks"], self._block_specs()):
            out = _conv(c, 3, stride)[1]((blk["conv1"], None), h)
            out = masked_relu(norm(out, blk["bn1"]), next(m))
            out = norm(_conv(c, 3, 1)[1]((blk["conv2"], None), out), blk["bn2"])
            short = norm(_conv(c, 1, stride)[1]((blk["short"], None), h), blk["short_bn"]) if proj else h
            h = masked_relu(out + short, next(m))
        pooled = jnp.mean(h, axis=(1, 2))
        hw, hb = params["head"]
        return pooled @ hw.astype(pooled.dtype) + lead(hb.astype(pooled.dtype), pooled.ndim), new_runs

    def apply(self, params, masks, x, state=None):
        """Logits. With ``state`` (running statistics) in evaluation mode; without, with batch statistics."""
        if state is None:
            return self._forward(params, masks, x, _bn_train, None)[0]
        return self._forward(params, masks, x, _bn_eval, state)[0]

    def apply_train(self, params, state, masks, x):
        """Training-mode logits and the running statistics updated with this batch."""
        if state is None:
            raise ValueError("MaskedResNet18.apply_train: a running-statistics state is needed (init_state)")
        logits, new_runs = self._forward(params, masks, x, _bn_train, state)
        return logits, tuple(new_runs)

    def log_prior(self, params, scale: float):
        """Cauchy(0, scale) on every convolution and dense weight and the readout bias (batch norm: none)."""
        prior = dist.Cauchy(0.0, scale)
        leaves = [params["stem"], *params["head"]]
        for blk in params["blocks"]:
            leaves += [blk["conv1"], blk["conv2"]] + ([blk["short"]] if "short" in blk else [])
        return sum(jnp.sum(prior.log_prob(w)) for w in leaves)

    def flops_and_capacity(self, masks):
        """(multiply-accumulates per image, parameters) of the ResNet-18 made of the active channels only
        (convolutions, batch norms, shortcuts and readout; a projection shortcut maps the block input's active
        channels to the block output's)."""
        counts = [float(np.asarray(m).sum()) for m in masks]
        H, W, C = self.in_shape
        macs = params = 0.0

        def conv(hw, k, cin, cout):
            nonlocal macs, params
            macs += hw * k * k * cin * cout
            params += k * k * cin * cout + 2 * cout  # weights + batch-norm scale and shift

        conv(H * W, 3, C, counts[0])
        c_prev, hw, i = counts[0], H * W, 1
        for _, _, stride, proj in self._block_specs():
            hw = hw // (stride * stride)
            c1, c2 = counts[i], counts[i + 1]
            conv(hw, 3, c_prev, c1)
            conv(hw, 3, c1, c2)
            if proj:
                conv(hw, 1, c_prev, c2)
            c_prev, i = c2, i + 2
        macs += c_prev * self.out_dim
        params += c_prev * self.out_dim + self.out_dim
        return macs, params


def _bn_params(params):
    """The batch-norm (scale, shift) pairs in forward order, as a flat tuple."""
    out = [params["stem_bn"]]
    for blk in params["blocks"]:
        out += [blk["bn1"], blk["bn2"]] + ([blk["short_bn"]] if "short_bn" in blk else [])
    return tuple(out)


def masked_resnet18(in_shape=(32, 32, 3), out_dim: int = 10, width: float = 1.0, expand: float = 1.25,
                    active_fraction: float = 0.8) -> MaskedResNet18:
    """The authors' masked ResNet-18: stage planes ``round(width * (64, 128, 256, 512) * expand)`` physical
    (80 ... 640 at the defaults), of which ``active_fraction`` are active at the start (64 ... 512).

    Args:
        in_shape: image shape ``(H, W, C)`` (channels last); ``(32, 32, 3)`` for CIFAR.
        out_dim: number of classes of the dense readout.
        width: multiplier of the standard ResNet-18 planes ``(64, 128, 256, 512)`` (rounded, at least 1 each);
            values below 1 give small networks for tests.
        expand: factor from the base planes to the physical planes (the authors' 1.25); at least 1.
        active_fraction: fraction of each stage's physical planes active at the start (the first ones), in
            ``(0, 1]``; rounded, and at least one plane per stage.

    Returns:
        The static `MaskedResNet18` description (physical ``channels`` and initially ``active`` planes per stage).

    Raises:
        ValueError: if ``in_shape`` does not have three entries, or ``width <= 0``, ``expand < 1`` or
            ``active_fraction`` is outside ``(0, 1]``.
    """
    if len(tuple(in_shape)) != 3:
        raise ValueError(f"masked_resnet18: in_shape must be (H, W, C), got {in_shape}")
    if not (width > 0 and expand >= 1 and 0 < active_fraction <= 1):
        raise ValueError(f"masked_resnet18: need width > 0, expand >= 1, 0 < active_fraction <= 1; got "
                         f"{width}, {expand}, {active_fraction}")
    base = [max(1, round(width * c)) for c in (64, 128, 256, 512)]
    channels = tuple(max(1, round(b * expand)) for b in base)
    active = tuple(max(1, min(c, round(active_fraction * c))) for c in channels)
    return MaskedResNet18(tuple(int(s) for s in in_shape), channels, active, int(out_dim))
