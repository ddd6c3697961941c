"""Golden cases of the elementwise layers: every activation in an MLP, several in a CNN, user closed forms
(Elementwise), the ExpNormalized kernel map, Hermite on unit-variance inputs and the do_stabilize variants.

See golden_io.py for the format; this file imports neither library.
"""

import numpy as np

DENSE_IN = ((5, 4), (3, 4))
CNN2D_IN = ((3, 5, 5, 2), (2, 5, 5, 2))


def _unit_rows(rng, shapes):
    """Inputs whose every position has mean square 1 over the channels (so that Dense / CIRCULAR Conv with
    W_std=1, b_std=0 gives pre-activations of unit variance, as Hermite requires)."""
    out = []
    for s in shapes:
        if s is None:
            out.append(None)
            continue
        x = rng.normal(size=s)
        out.append(x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True)))
    return out[0], out[1], {}


def build_cases(stax, jnp):
    S = stax
    cases = {}

    def mlp(act, param="ntk", depth=1):
        layers = []
        for i in range(depth):
            layers += [S.Dense(8, W_std=1.4 - 0.1 * i, b_std=0.2, parameterization=param), act]
        return S.serial(*layers, S.Dense(8, W_std=1.1, b_std=0.1, parameterization=param))

    def cnn(act, readout, padding="SAME", W_std=1.3, b_std=0.1):
        return S.serial(S.Conv(8, (3, 3), padding=padding, W_std=W_std, b_std=b_std), act,
                        S.Conv(8, (3, 3), padding=padding, W_std=W_std, b_std=b_std), act,
                        readout, S.Dense(4, W_std=1.2, b_std=0.1))

    # The arc-cosine family and its stabilised variants.
    cases["elem_mlp_abs"] = (mlp(S.Abs(), depth=2), DENSE_IN)
    cases["elem_mlp_abs_stabilize_standard"] = (mlp(S.Abs(do_stabilize=True), "standard", depth=2), DENSE_IN)
    cases["elem_mlp_relu_stabilize"] = (mlp(S.Relu(do_stabilize=True), depth=3), DENSE_IN, {"covs": True})
    cases["elem_mlp_leakyrelu_stabilize"] = (mlp(S.LeakyRelu(0.1, do_stabilize=True), "standard", depth=2),
                                             DENSE_IN)
    cases["elem_mlp_abrelu_stabilize_x2none"] = (mlp(S.ABRelu(-0.3, 1.2, do_stabilize=True), depth=2),
                                                 (DENSE_IN[0], None))
    cases["elem_mlp_sign"] = (mlp(S.Sign(), depth=2), DENSE_IN, {"covs": True})
    # Erf, trigonometric and exponential families.
    cases["elem_mlp_sigmoid_like_standard"] = (mlp(S.Sigmoid_like(), "standard", depth=2), DENSE_IN)
    cases["elem_mlp_cos"] = (mlp(S.Cos(1.2, 0.7, 0.3), depth=2), DENSE_IN)
    cases["elem_mlp_cos_default"] = (mlp(S.Cos()), DENSE_IN, {"covs": True})
    cases["elem_mlp_rbf"] = (mlp(S.Rbf(0.4), depth=2), DENSE_IN)
    cases["elem_mlp_exp"] = (mlp(S.Exp(0.7, 0.6)), DENSE_IN, {"covs": True})
    cases["elem_mlp_exp_standard"] = (mlp(S.Exp(), "standard"), DENSE_IN)
    cases["elem_mlp_gabor"] = (mlp(S.Gabor(), depth=2), DENSE_IN, {"covs": True})
    cases["elem_mlp_exp_normalized"] = (mlp(S.ExpNormalized(), depth=2), DENSE_IN, {"covs": True})
    cases["elem_mlp_exp_normalized_clip"] = (mlp(S.ExpNormalized(gamma=0.8, shift=-0.5, do_clip=True), depth=2),
                                             (DENSE_IN[0], None))
    # Polynomials.
    for n in (0, 1, 2, 3, 5):
        cases[f"elem_mlp_monomial{n}"] = (mlp(S.Monomial(n)), DENSE_IN)
    for n in (0, 1, 2, 3):
        cases[f"elem_mlp_rectified_monomial{n}"] = (mlp(S.RectifiedMonomial(n)), DENSE_IN)
    # No "covs" case: neural-tangents 0.6.5 returns NaN for RectifiedMonomial's cov1/cov2 with get=None (0/0 at
    # theta = 0), and so NaN for a second RectifiedMonomial layer; smnngp's are finite (tests/test_stax_elementwise.py
    # checks the diagonal (2n - 1)!! v^n / 2).
    cases["elem_mlp_polynomial"] = (mlp(S.Polynomial([0.3, -1.0, 0.5, 0.2]), depth=2), DENSE_IN, {"covs": True})
    cases["elem_mlp_polynomial_standard"] = (mlp(S.Polynomial([0.0, 1.0, 0.0, -0.4, 0.1]), "standard"), DENSE_IN)
    unit = {"inputs": _unit_rows}
    for n in (0, 1, 2, 4):
        cases[f"elem_mlp_hermite{n}"] = (
            S.serial(S.Dense(8, W_std=1.0, b_std=0.0), S.Hermite(n), S.Dense(8, W_std=1.0, b_std=0.0),
                     S.Hermite(2 if n else 1), S.Dense(8, W_std=1.3, b_std=0.1)), DENSE_IN, unit)

    # User-supplied closed forms: sin with E[fn fn] and E[fn' fn'], erf with E[fn fn] only (autodiff NTK).
    def sin_nngp(c, v1, v2):
        return jnp.exp(-(v1 + v2) / 2) * jnp.sinh(c)

    def sin_d_nngp(c, v1, v2):
        return jnp.exp(-(v1 + v2) / 2) * jnp.cosh(c)

    def erf_nngp(c, v1, v2):
        return jnp.arcsin(2 * c / jnp.sqrt((1 + 2 * v1) * (1 + 2 * v2))) * 2 / np.pi

    cases["elem_mlp_elementwise_closed"] = (mlp(S.Elementwise(jnp.sin, sin_nngp, sin_d_nngp), depth=2), DENSE_IN,
                                            {"covs": True})
    cases["elem_mlp_elementwise_autodiff"] = (mlp(S.Elementwise(jnp.tanh, erf_nngp), depth=2), DENSE_IN)

    # CNNs (2-D convolutions, Flatten or GlobalAvgPool readout).
    cases["elem_cnn_abs_stabilize_flatten"] = (cnn(S.Abs(do_stabilize=True), S.Flatten()), CNN2D_IN)
    cases["elem_cnn_gabor_gap"] = (cnn(S.Gabor(), S.GlobalAvgPool()), CNN2D_IN)
    cases["elem_cnn_rbf_flatten"] = (cnn(S.Rbf(0.7), S.Flatten()), CNN2D_IN)
    cases["elem_cnn_sign_gap"] = (cnn(S.Sign(), S.GlobalAvgPool()), CNN2D_IN)
    cases["elem_cnn_monomial3_gap"] = (cnn(S.Monomial(3), S.GlobalAvgPool(), W_std=1.0), CNN2D_IN)
    cases["elem_cnn_rectified_monomial2_flatten"] = (cnn(S.RectifiedMonomial(2), S.Flatten()), CNN2D_IN)
    cases["elem_cnn_exp_normalized_gap"] = (cnn(S.ExpNormalized(gamma=1.5), S.GlobalAvgPool()), CNN2D_IN)
    cases["elem_cnn_elementwise_closed_flatten"] = (
        cnn(S.Elementwise(jnp.sin, sin_nngp, sin_d_nngp), S.Flatten()), CNN2D_IN)
    cases["elem_cnn_hermite3_circular_gap"] = (
        S.serial(S.Conv(8, (3, 3), padding="CIRCULAR", W_std=1.0, b_std=0.0), S.Hermite(3),
                 S.Conv(8, (3, 3), padding="CIRCULAR", W_std=1.0, b_std=0.0), S.Hermite(2),
                 S.GlobalAvgPool(), S.Dense(4, W_std=1.2, b_std=0.1)), CNN2D_IN, unit)
    return cases
