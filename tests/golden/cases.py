"""Architectures and inputs of the golden-fixture cases.

This file imports neither library: `build_cases(stax, jnp)` is called with
neural-tangents' ``stax`` by the fixture generator (in the pinned oracle
environment) and with ``smnngp.stax`` by the tests, so the very same spec is
run by both.
"""


DENSE_IN = ((7, 5), (6, 5))
CNN1D_IN = ((4, 10, 3), (3, 10, 3))
CNN2D_IN = ((4, 6, 6, 2), (3, 6, 6, 2))


def build_cases(stax, jnp):
    """Return {name: (layer, (x1_shape, x2_shape or None))}."""
    S = stax
    cases = {}

    def mlp(act, param="ntk", b_std=0.05, width=64):
        return S.serial(
            S.Dense(width, W_std=1.5, b_std=b_std, parameterization=param), act,
            S.Dense(width, W_std=1.3, b_std=b_std, parameterization=param), act,
            S.Dense(1, W_std=1.0, b_std=b_std, parameterization=param),
        )

    cases["mlp_relu_ntk"] = (mlp(S.Relu()), DENSE_IN)
    cases["mlp_relu_standard"] = (mlp(S.Relu(), "standard"), DENSE_IN)
    cases["mlp_relu_nobias"] = (mlp(S.Relu(), b_std=None), DENSE_IN)
    cases["mlp_relu_x2none"] = (mlp(S.Relu()), (DENSE_IN[0], None))
    cases["mlp_erf_ntk"] = (mlp(S.Erf()), DENSE_IN)
    cases["mlp_erf_abc_standard"] = (mlp(S.Erf(a=0.7, b=1.3, c=0.2), "standard"), DENSE_IN)
    cases["mlp_erf_standard_nobias"] = (mlp(S.Erf(), "standard", b_std=None), DENSE_IN)
    cases["mlp_abrelu"] = (mlp(S.ABRelu(-0.3, 1.2)), DENSE_IN)
    cases["mlp_leakyrelu_standard"] = (mlp(S.LeakyRelu(0.1), "standard"), DENSE_IN)
    cases["mlp_gelu"] = (mlp(S.Gelu()), DENSE_IN)
    cases["mlp_sin"] = (mlp(S.Sin(a=1.2, b=0.8, c=0.3)), DENSE_IN)
    cases["mlp_gaussian"] = (mlp(S.Gaussian(a=1.0, b=-0.5)), DENSE_IN)
    cases["mlp_numerical_tanh"] = (mlp(S.ElementwiseNumerical(jnp.tanh, deg=25)), DENSE_IN)

    def conv(c, f, **kw):
        kw.setdefault("W_std", 1.4)
        kw.setdefault("b_std", 0.1)
        return S.Conv(c, f, **kw)

    cases["cnn1d_same_relu_flatten"] = (
        S.serial(conv(32, (3,), padding="SAME"), S.Relu(), conv(32, (3,), padding="SAME"), S.Relu(),
                 S.Flatten(), S.Dense(1)), CNN1D_IN)
    cases["cnn1d_valid_stride2_gap"] = (
        S.serial(conv(16, (3,), strides=(2,), padding="VALID"), S.Erf(), S.GlobalAvgPool(), S.Dense(1)), CNN1D_IN)
    cases["cnn1d_circular_flatten"] = (
        S.serial(conv(16, (4,), padding="CIRCULAR"), S.Relu(), conv(16, (3,), padding="CIRCULAR"), S.Relu(),
                 S.Flatten(), S.Dense(1)), CNN1D_IN)
    cases["cnn2d_same_relu_flatten"] = (
        S.serial(conv(32, (3, 3), padding="SAME"), S.Relu(), conv(32, (3, 3), padding="SAME"), S.Relu(),
                 S.Flatten(), S.Dense(1)), CNN2D_IN)
    cases["cnn2d_same_standard_flatten"] = (
        S.serial(conv(32, (3, 3), padding="SAME", parameterization="standard"), S.Relu(),
                 conv(32, (3, 3), padding="SAME", parameterization="standard"), S.Relu(),
                 S.Flatten(), S.Dense(1, parameterization="standard")), CNN2D_IN)
    cases["cnn2d_valid_stride2_flatten"] = (
        S.serial(conv(32, (3, 3), strides=(2, 2), padding="VALID"), S.Gelu(),
                 conv(32, (2, 2), padding="VALID"), S.Relu(), S.Flatten(), S.Dense(1)), CNN2D_IN)
    cases["cnn2d_same_stride2_gap"] = (
        S.serial(conv(32, (3, 3), strides=(2, 2), padding="SAME"), S.Relu(), conv(32, (3, 3), padding="SAME"),
                 S.Erf(), S.GlobalAvgPool(), S.Dense(1)), CNN2D_IN)
    cases["cnn2d_avgpool_flatten"] = (
        S.serial(conv(32, (3, 3), padding="SAME"), S.Relu(), S.AvgPool((2, 2), strides=(2, 2)),
                 S.Flatten(), S.Dense(1)), CNN2D_IN)
    cases["cnn2d_avgpool_same_gap_standard"] = (
        S.serial(conv(32, (3, 3), padding="SAME", parameterization="standard"), S.Relu(),
                 S.AvgPool((3, 3), padding="SAME"), conv(16, (2, 2), padding="VALID", parameterization="standard"),
                 S.Relu(), S.GlobalAvgPool(), S.Dense(1, parameterization="standard")), CNN2D_IN)
    cases["cnn2d_avgpool_normalize_edges"] = (
        S.serial(conv(16, (3, 3), padding="SAME"), S.Sin(), S.AvgPool((3, 3), padding="SAME", normalize_edges=True),
                 S.Flatten(), S.Dense(1)), CNN2D_IN)
    cases["cnn2d_circular_avgpool"] = (
        S.serial(conv(16, (3, 3), padding="CIRCULAR"), S.Relu(), S.AvgPool((2, 2), strides=(2, 2), padding="CIRCULAR"),
                 conv(16, (3, 3), padding="CIRCULAR", b_std=None), S.Relu(), S.Flatten(), S.Dense(1)), CNN2D_IN)
    cases["cnn2d_x2none_gap"] = (
        S.serial(conv(16, (3, 3), padding="SAME"), S.Relu(), S.GlobalAvgPool(), S.Dense(1)), (CNN2D_IN[0], None))
    cases["cnn2d_numerical_tanh"] = (
        S.serial(conv(16, (3, 3), padding="SAME"), S.ElementwiseNumerical(jnp.tanh, deg=25), S.Flatten(), S.Dense(1)),
        CNN2D_IN)

    block = S.serial(
        S.FanOut(2),
        S.parallel(S.serial(S.Relu(), S.Dense(64, 1.3, 0.1), S.Erf(), S.Dense(64, 1.1)), S.Identity()),
        S.FanInSum(),
    )
    cases["resnet_dense_sum"] = (S.serial(S.Dense(64, 1.2, 0.1), block, block, S.Relu(), S.Dense(1)), DENSE_IN)
    cases["resnet_dense_concat"] = (
        S.serial(S.Dense(64, 1.2, 0.1), S.FanOut(2),
                 S.parallel(S.serial(S.Relu(), S.Dense(32, 1.3)), S.serial(S.Erf(), S.Dense(64, 0.9, 0.2))),
                 S.FanInConcat(), S.Dense(48, 1.1, 0.1), S.Relu(), S.Dense(1)), DENSE_IN)
    conv_block = S.serial(
        S.FanOut(2),
        S.parallel(S.serial(S.Relu(), conv(16, (3, 3), padding="SAME")), S.Identity()),
        S.FanInSum(),
    )
    cases["resnet_conv_sum_gap"] = (
        S.serial(conv(16, (3, 3), padding="SAME"), conv_block, conv_block, S.Relu(), S.GlobalAvgPool(), S.Dense(1)),
        CNN2D_IN)
    cases["resnet_conv_concat_flatten"] = (
        S.serial(conv(16, (3, 3), padding="SAME"), S.FanOut(3),
                 S.parallel(S.serial(S.Relu(), conv(8, (3, 3), padding="SAME")),
                            S.serial(S.Gelu(), conv(16, (3, 3), padding="SAME")), S.Identity()),
                 S.FanInConcat(), conv(8, (2, 2), padding="VALID"), S.Relu(), S.Flatten(), S.Dense(1)), CNN2D_IN)
    cases["resnet_conv1d_sum_flatten"] = (
        S.serial(conv(16, (3,), padding="SAME"), S.FanOut(2),
                 S.parallel(S.serial(S.Erf(), conv(16, (3,), padding="SAME")), S.Identity()), S.FanInSum(),
                 S.Relu(), S.Flatten(), S.Dense(1)), CNN1D_IN)
    return cases
