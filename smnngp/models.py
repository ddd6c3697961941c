"""The regression models by name, their defaults, and the MLP architecture they share.

One home for what `smnngp.hyper`, `smnngp.sklearn` and the experiments call
``'gaussian'``, ``'student_t'`` and ``'burr12'`` (paper section 3.1): the scale
prior on the readout variance sigma_v^2 that each name stands for, the
starting values of its parameters, and the MLP whose NNGP they use by default.

=============  ============================  ===================  =====================
name           prior on sigma_v^2            its parameters       defaults
=============  ============================  ===================  =====================
'gaussian'     ``Delta(1)`` (the NNGP)       none                 -
'student_t'    ``InverseGamma(a, b)``        ``a``, ``b``         a = b = 2
'burr12'       ``BurrXII(c, k)`` (x scale)   ``c``, ``k``         c = 2, k = 1
=============  ============================  ===================  =====================

The MLP (:func:`mlp`): ``depth`` x [``Dense(W_std, b_std)``, activation], then a
readout ``Dense(1, W_std=last_W_std)`` with bias ``b_std`` (or none). Its
defaults for standardised inputs: ``W_std`` 1.4 (ReLU) or 1.5 (Erf),
``b_std = 0.1``, ``last_W_std = 1``.

The conv net of the image experiments (:func:`cnn_arch`, :func:`cnn_init`, :func:`cnn_kernel`; the scale-mixture
paper's Table 2 and the Gaussian-classification study): ``depth`` x [3 x 3 ``Conv`` (SAME), ReLU], ``Flatten``, a
readout ``Dense(1)``, every scale a hyperparameter.

The Myrtle networks (:func:`myrtle`; Shankar et al., "Neural Kernels Without Tangents", ICML 2020): the
convolutional kernels of whole image sets (``python -m experiments dataset-kernel``).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpyro.distributions as dist

from smnngp import priors, stax

__all__ = [
    "MODELS",
    "PRIOR_PARAMS",
    "PRIOR_DEFAULTS",
    "ACTIVATIONS",
    "W_STD",
    "B_STD",
    "check_model",
    "prior",
    "mlp",
    "mlp_arch",
    "cnn_arch",
    "cnn_init",
    "cnn_kernel",
    "MYRTLE_DEPTHS",
    "myrtle",
]

MODELS = ("gaussian", "student_t", "burr12")

# The parameters of each model's scale prior, and where fitting and the estimators start them.
PRIOR_PARAMS = {"gaussian": (), "student_t": ("a", "b"), "burr12": ("c", "k")}
PRIOR_DEFAULTS = {"a": 2.0, "b": 2.0, "c": 2.0, "k": 1.0}

ACTIVATIONS: dict[str, Callable[[], stax.Layer]] = {"relu": stax.Relu, "erf": stax.Erf}
W_STD = {"relu": 1.4, "erf": 1.5}
B_STD = 0.1


def check_model(model) -> str:
    """``model`` if it names a model, else a ValueError listing the names.

    Args:
        model: model name, one of :data:`MODELS` (``'gaussian'``, ``'student_t'``, ``'burr12'``).

    Returns:
        ``model`` unchanged.

    Raises:
        ValueError: if ``model`` is not one of :data:`MODELS`.
    """
    if model not in MODELS:
        raise ValueError(f"model must be one of {MODELS}, got {model!r}")
    return model


def prior(model: str, params: dict | None = None):
    """The scale prior of ``model``; ``params`` overrides :data:`PRIOR_DEFAULTS` (values may be traced).

    ``'burr12'`` with a ``scale`` entry is ``scale * BurrXII(c, k)`` (Burr XII has no scale parameter of
    its own; `smnngp.hyper.fit_burr_given_kernel` fits one).

    Args:
        model: model name, one of :data:`MODELS`.
        params: prior parameters by name (``a``, ``b`` for ``'student_t'``; ``c``, ``k`` and optionally
            ``scale`` for ``'burr12'``); missing entries take :data:`PRIOR_DEFAULTS`. Ignored for
            ``'gaussian'``.

    Returns:
        numpyro distribution on sigma_v^2: ``Delta(1)``, ``InverseGamma(a, b)``, ``BurrXII(c, k)`` or
        ``scale * BurrXII(c, k)``.

    Raises:
        ValueError: if ``model`` is unknown, or a concrete parameter is not positive and finite.
    """
    check_model(model)
    p = {**PRIOR_DEFAULTS, **(params or {})}
    if model == "gaussian":
        return priors.Delta(1.0)
    if model == "student_t":
        return priors.InverseGamma(p["a"], p["b"])
    burr = priors.BurrXII(p["c"], p["k"])
    if "scale" in p:
        return dist.TransformedDistribution(burr, dist.transforms.AffineTransform(0.0, p["scale"]))
    return burr


def _check_mlp(depth, activation):
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {sorted(ACTIVATIONS)}, got {activation!r}")
    if not isinstance(depth, int) or isinstance(depth, bool) or depth < 0:
        raise ValueError(f"depth must be a non-negative integer, got {depth!r}")


def mlp_arch(depth: int, activation: str = "relu", *, readout_bias: bool = True) -> Callable[[dict], stax.Layer]:
    """``arch(params) -> Layer``: the MLP over a dict of scales (which may be traced).

    ``params`` holds ``W_std`` and ``b_std`` (shared by the hidden layers; ``b_std=None`` means no
    biases) and optionally ``last_W_std`` (the readout's weight scale, 1 when absent). With
    ``readout_bias`` the readout has bias ``b_std``, as in `smnngp.hyper`; without it the readout is
    ``Dense(1, W_std=last_W_std)``, as in `smnngp.sklearn`, so that the scale prior alone carries the
    output's offset and scale. The builder is cached: one per (depth, activation, readout_bias), so
    that kernels of the same MLP share their compilations (see `smnngp.stax.parametric_kernel`).

    Args:
        depth: number of hidden ``Dense`` + activation blocks (a non-negative int; 0 gives the readout alone).
        activation: name of the activation, a key of :data:`ACTIVATIONS` (``'relu'`` or ``'erf'``).
        readout_bias: whether the readout layer has a bias of scale ``b_std``.

    Returns:
        Callable ``arch(params) -> Layer`` building the MLP as a :func:`smnngp.stax.serial` layer; the same
        object is returned for equal arguments, and it can be pickled.

    Raises:
        ValueError: if ``activation`` is unknown or ``depth`` is not a non-negative integer.
    """
    _check_mlp(depth, activation)
    key = (int(depth), activation, bool(readout_bias))
    if key not in _ARCHS:
        _ARCHS[key] = _MLPArch(*key)
    return _ARCHS[key]


_ARCHS: dict = {}


def _mlp_arch_positional(depth, activation, readout_bias):
    return mlp_arch(depth, activation, readout_bias=readout_bias)


class _MLPArch:
    """The builder of :func:`mlp_arch` (a class, so that it pickles and names itself)."""

    def __init__(self, depth, activation, readout_bias):
        self.depth, self.activation, self.readout_bias = depth, activation, readout_bias
        self.__name__ = f"mlp{depth}_{activation}"

    def __call__(self, params) -> stax.Layer:
        W_std, b_std = params["W_std"], params["b_std"]
        act = ACTIVATIONS[self.activation]
        layers = []
        for _ in range(self.depth):
            layers += [stax.Dense(1, W_std=W_std, b_std=b_std), act()]
        layers.append(stax.Dense(1, W_std=params.get("last_W_std", 1.0), b_std=b_std if self.readout_bias else None))
        return stax.serial(*layers)

    def __reduce__(self):
        return _mlp_arch_positional, (self.depth, self.activation, self.readout_bias)

    def __repr__(self):
        return f"mlp_arch({self.depth}, {self.activation!r}, readout_bias={self.readout_bias})"


def mlp(depth: int, activation: str = "relu", W_std: float | None = None, b_std: float | None = B_STD,
        last_W_std=1.0, *, readout_bias: bool = True) -> stax.Layer:
    """The MLP of :func:`mlp_arch` at given scales (``W_std=None``: the activation's default).

    Args:
        depth: number of hidden ``Dense`` + activation blocks (a non-negative int).
        activation: name of the activation, ``'relu'`` or ``'erf'``.
        W_std: weight standard deviation of the hidden layers; ``None`` takes :data:`W_STD` of the
            activation (1.4 for ReLU, 1.5 for Erf).
        b_std: bias standard deviation of the hidden layers (and of the readout with ``readout_bias``);
            ``None`` means no biases.
        last_W_std: weight standard deviation of the readout layer.
        readout_bias: whether the readout layer has a bias of scale ``b_std``.

    Returns:
        The MLP as a ``(init_fn, apply_fn, kernel_fn)`` layer of :mod:`smnngp.stax`.

    Raises:
        ValueError: if ``activation`` is unknown or ``depth`` is not a non-negative integer.
    """
    _check_mlp(depth, activation)
    if W_std is None:
        W_std = W_STD[activation]
    return mlp_arch(depth, activation, readout_bias=readout_bias)(
        {"W_std": W_std, "b_std": b_std, "last_W_std": last_W_std})


def cnn_arch(depth: int) -> Callable[[dict], stax.Layer]:
    """``arch(p) -> stax layer``: ``depth`` conv blocks, then ``Flatten`` and
    ``Dense(1, W_std=p["W_out"], b_std=p["b_out"])``; block ``l`` is a 3 x 3 ``Conv`` (SAME padding, one channel: the
    channel count does not enter the kernel) with scales ``p["W_std"]`` and ``p["b_std"]`` at index ``l``, then
    ``Relu``.

    Args:
        depth: the number of convolutional layers, a positive integer.

    Returns:
        A function of the scales ``p`` (as :func:`cnn_init` gives them) returning the `smnngp.stax` layer.

    Raises:
        ValueError: if ``depth`` is not a positive integer.
    """
    if not isinstance(depth, int) or isinstance(depth, bool) or depth < 1:
        raise ValueError(f"cnn_arch: depth must be a positive integer, got {depth!r}")

    def arch(p):
        layers = []
        for i in range(depth):
            layers += [stax.Conv(1, (3, 3), padding="SAME", W_std=p["W_std"][i], b_std=p["b_std"][i]), stax.Relu()]
        return stax.serial(*layers, stax.Flatten(), stax.Dense(1, W_std=p["W_out"], b_std=p["b_out"]))

    return arch


def cnn_init(depth: int) -> dict:
    """The starting scales of :func:`cnn_arch`: ``W_std = sqrt 2`` and ``b_std = 0.1`` per layer, readout
    ``W_std = 1``, ``b_std = 0.1``.

    Args:
        depth: the number of convolutional layers.

    Returns:
        ``{"W_std": [...], "b_std": [...], "W_out": 1.0, "b_out": 0.1}``.
    """
    return {"W_std": [math.sqrt(2.0)] * depth, "b_std": [0.1] * depth, "W_out": 1.0, "b_out": 0.1}


def cnn_kernel(depth: int, *, train_amplitude: bool = True, pin_weights: bool = False):
    """The conv NNGP of :func:`cnn_arch` as a `smnngp.kernels.ParametricKernel` started at :func:`cnn_init`.

    Every scale is trained, except: without ``train_amplitude`` the readout ``W_std`` stays 1 (a Student-t
    process's sigma^2 is that amplitude); with ``pin_weights`` every ``W_std`` stays at its start and only the
    ``b_std`` are trained (ReLU layers are positively homogeneous, so trained hidden ``W_std`` would carry an overall
    amplitude that competes with sigma^2).

    Args:
        depth: the number of convolutional layers.
        train_amplitude: whether the readout ``W_std`` is trained.
        pin_weights: whether every ``W_std`` is held fixed.

    Returns:
        The `ParametricKernel`.
    """
    arch, init = cnn_arch(depth), cnn_init(depth)
    if train_amplitude and not pin_weights:
        return stax.parametric_kernel(arch, init)
    pinned = ("W_out", "W_std") if pin_weights else ("W_out",)
    fixed = {k: init.pop(k) for k in pinned}
    return stax.parametric_kernel(lambda p: arch({**p, **fixed}), init)


# Myrtle-d: how many (3 x 3 Conv, ReLU) pairs each of the three stages has (Shankar et al. 2020; the depth counts
# the convolutions plus the readout: 4 + 1, 6 + 1, 9 + 1)
MYRTLE_DEPTHS = {5: (2, 1, 1), 7: (2, 2, 2), 10: (3, 3, 3)}


def myrtle(depth: int = 5, *, width: int = 1, n_out: int = 10, W_std: float = math.sqrt(2.0), b_std: float = 0.0,
           pools_at_end: int = 3) -> tuple:
    """The Myrtle CNN of depth 5, 7 or 10 as a `smnngp.stax` triple ``(init_fn, apply_fn, kernel_fn)``.

    Three stages of ``MYRTLE_DEPTHS[depth]`` (3 x 3 ``Conv`` (SAME), ReLU) pairs, the first two stages each
    followed by a 2 x 2 ``AvgPool`` of stride 2 and the last by ``pools_at_end`` of them (3 for 32 x 32 inputs:
    32 / 2^5 = 1 position left), then ``Flatten`` and ``Dense(n_out)``. He scaling (``W_std = sqrt 2``) and no
    biases by default, as in the paper. The kernel does not depend on ``width``.

    Args:
        depth: 5, 7 or 10.
        width: channels of each convolution (the finite network's; 1 is enough for the kernel).
        n_out: outputs of the readout.
        W_std: weight scale of every layer.
        b_std: bias scale of every layer.
        pools_at_end: the 2 x 2 average poolings after the last stage (0 or more).

    Returns:
        ``(init_fn, apply_fn, kernel_fn)``.

    Raises:
        ValueError: for a depth other than 5, 7 or 10, or a non-positive width or output count.
    """
    if depth not in MYRTLE_DEPTHS:
        raise ValueError(f"myrtle: depth must be one of {sorted(MYRTLE_DEPTHS)}, got {depth!r}")
    for name, v in (("width", width), ("n_out", n_out)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ValueError(f"myrtle: {name} must be a positive integer, got {v!r}")
    if not isinstance(pools_at_end, int) or pools_at_end < 0:
        raise ValueError(f"myrtle: pools_at_end must be a non-negative integer, got {pools_at_end!r}")

    def block():
        return [stax.Conv(width, (3, 3), padding="SAME", W_std=W_std, b_std=b_std), stax.Relu()]

    def pool():
        return stax.AvgPool((2, 2), strides=(2, 2))

    first, second, third = MYRTLE_DEPTHS[depth]
    layers = []
    for _ in range(first):
        layers += block()
    layers.append(pool())
    for _ in range(second):
        layers += block()
    layers.append(pool())
    for _ in range(third):
        layers += block()
    layers += [pool() for _ in range(pools_at_end)]
    return stax.serial(*layers, stax.Flatten(), stax.Dense(n_out, W_std=W_std, b_std=b_std))
