"""Golden cases of normalisation, dropout and the combinators FanInProd, FanInConcat (any axis) and repeat.

See golden_io.py for the format; this file imports neither library.
"""

DENSE_IN = ((5, 4), (3, 4))
CNN2D_IN = ((3, 5, 4, 2), (2, 5, 4, 2))
CNN1D_IN = ((3, 6, 2), (2, 6, 2))


def build_cases(stax, jnp):
    S = stax
    cases = {}

    def mlp_ln(**ln):
        return S.serial(S.Dense(16, 1.3, 0.2), S.LayerNorm(**ln), S.Relu(), S.Dense(16, 1.1, 0.1), S.LayerNorm(**ln),
                        S.Erf(), S.Dense(1, 1.2, 0.05))

    cases["norm_mlp_layernorm"] = (mlp_ln(), DENSE_IN)
    cases["norm_mlp_layernorm_x2none"] = (mlp_ln(eps=0.3), (DENSE_IN[0], None), {"covs": True})
    cases["norm_mlp_layernorm_batch"] = (
        S.serial(S.Dense(16, 1.3, 0.2), S.LayerNorm(axis=(0, 1), eps=0.01), S.Erf(), S.Dense(1, 1.1)), DENSE_IN)
    cases["norm_cnn_layernorm_channels"] = (
        S.serial(S.Conv(8, (3, 3), padding="SAME", W_std=1.4, b_std=0.1), S.LayerNorm(), S.Relu(),
                 S.Conv(8, (2, 2), W_std=1.2, b_std=0.2), S.LayerNorm(eps=0.1), S.Relu(), S.Flatten(),
                 S.Dense(1, 1.1)), CNN2D_IN)
    cases["norm_cnn_layernorm_spatial_gap"] = (
        S.serial(S.Conv(8, (3, 3), padding="SAME", W_std=1.4, b_std=0.1), S.LayerNorm(axis=(1, 2, 3)), S.Relu(),
                 S.Conv(8, (3, 3), padding="CIRCULAR", W_std=1.3, b_std=0.1), S.LayerNorm(axis=(2, 3)), S.Erf(),
                 S.GlobalAvgPool(), S.Dense(1, 1.2)), CNN2D_IN)
    cases["norm_cnn_layernorm_spatial_out"] = (
        S.serial(S.Conv(8, (3,), padding="SAME", W_std=1.4, b_std=0.1), S.LayerNorm(axis=(1, 2)), S.Relu(),
                 S.Conv(8, (3,), padding="SAME", W_std=1.3, b_std=0.1), S.LayerNorm(axis=(-2, -1), eps=0.05)),
        CNN1D_IN, {"covs": True})
    cases["norm_cnn_layernorm_diag_spatial"] = (
        S.serial(S.Conv(8, (3, 3), padding="SAME", W_std=1.4, b_std=0.1), S.LayerNorm(axis=(1, 3)), S.Relu(),
                 S.Conv(8, (3, 3), padding="SAME", W_std=1.3)), CNN2D_IN,
        {"kwargs": {"diagonal_spatial": True}})
    cases["norm_cnn_layernorm_negative_axes"] = (
        S.serial(S.Conv(8, (3, 3), padding="SAME", W_std=1.4, b_std=0.1), S.LayerNorm(axis=(1, 2, 3)), S.Relu(),
                 S.Conv(8, (3, 3), padding="SAME", W_std=1.3, b_std=0.1),
                 S.LayerNorm(axis=(-3, -1), batch_axis=0, channel_axis=3), S.Relu(), S.GlobalAvgPool(),
                 S.Dense(1)), CNN2D_IN)

    def drop_mlp(mode):
        return S.serial(S.Dense(16, 1.3, 0.2), S.Relu(), S.Dropout(0.7, mode), S.Dense(16, 1.1, 0.1), S.Erf(),
                        S.Dropout(0.6, mode), S.Dense(1, 1.2))

    # x2=None with a ReLU before the kernel's last layers: neural-tangents' batch NTK diagonal carries ~1e-8
    # relative noise from the arc-cosine singularity at correlation 1 (its own one-point kernel_fn differs from
    # it by as much; ours equals the one-point value), hence 5e-8 in float64.
    singular = (5e-8, 1e-4)
    cases["norm_dropout_train_x2none"] = (drop_mlp("train"), (DENSE_IN[0], None), {"covs": True, "tol": singular})
    cases["norm_dropout_train_x2"] = (drop_mlp("train"), DENSE_IN, {"covs": True})
    cases["norm_dropout_test_x2none"] = (drop_mlp("test"), (DENSE_IN[0], None))
    cases["norm_dropout_test_x2"] = (drop_mlp("test"), DENSE_IN)
    drop_cnn = S.serial(S.Conv(8, (3, 3), padding="SAME", W_std=1.4, b_std=0.1), S.Relu(), S.Dropout(0.8),
                        S.Conv(8, (3, 3), padding="SAME", W_std=1.3), S.Relu(), S.Dropout(0.5))
    cases["norm_dropout_cnn_full_x2none"] = (drop_cnn, (CNN2D_IN[0], None), {"covs": True})
    cases["norm_dropout_cnn_gap_x2none"] = (S.serial(drop_cnn, S.GlobalAvgPool(), S.Dense(1)), (CNN2D_IN[0], None))
    cases["norm_dropout_cnn_diag_x2none"] = (drop_cnn, (CNN2D_IN[0], None), {"kwargs": {"diagonal_spatial": True}})
    cases["norm_layernorm_dropout_mlp"] = (
        S.serial(S.Dense(32, 1.5, 0.1), S.LayerNorm(), S.Relu(), S.Dropout(0.8), S.Dense(1, 1.0, 0.05)),
        (DENSE_IN[0], None))
    cases["norm_layernorm_dropout_mlp_x2"] = (
        S.serial(S.Dense(32, 1.5, 0.1), S.LayerNorm(), S.Relu(), S.Dropout(0.8), S.Dense(1, 1.0, 0.05)), DENSE_IN)

    def prod_block(shortcut):
        return S.serial(S.Dense(16, 1.3, 0.1), S.Relu(),
                        S.FanOut(3), S.parallel(S.Dense(16, 1.2, 0.1), S.serial(S.Dense(16, 1.1), S.Erf()), shortcut),
                        S.FanInProd(), S.Dense(1, 1.1, 0.1))

    cases["norm_faninprod_residual"] = (prod_block(S.Dense(16, 0.9, 0.3)), DENSE_IN)
    cases["norm_faninprod_residual_x2none"] = (prod_block(S.Dense(16, 0.9, 0.3)), (DENSE_IN[0], None),
                                               {"covs": True})
    cases["norm_faninprod_cnn"] = (
        S.serial(S.Conv(8, (3, 3), padding="SAME", W_std=1.4, b_std=0.1), S.FanOut(2),
                 S.parallel(S.Conv(8, (3, 3), padding="SAME", W_std=1.2), S.serial(S.Relu(), S.Conv(8, (2, 2),
                            padding="SAME", W_std=1.1, b_std=0.2))),
                 S.FanInProd(), S.AvgPool((2, 2)), S.Flatten(), S.Dense(1)), CNN2D_IN)

    def concat_cnn(axis, tail):
        return S.serial(S.Conv(8, (3, 3), padding="SAME", W_std=1.4, b_std=0.1), S.Relu(), S.FanOut(2),
                        S.parallel(S.Conv(8, (3, 3), padding="SAME", W_std=1.2, b_std=0.1),
                                   S.serial(S.Conv(8, (2, 2), padding="SAME", W_std=1.1), S.Erf(),
                                            S.Conv(8, (3, 3), padding="SAME", W_std=1.2, b_std=0.3))),
                        S.FanInConcat(axis), *tail)

    cases["norm_concat_spatial_h_gap"] = (concat_cnn(1, [S.Relu(), S.Conv(4, (3, 3), padding="SAME", W_std=1.3),
                                                         S.GlobalAvgPool(), S.Dense(1)]), CNN2D_IN)
    cases["norm_concat_spatial_w_flatten"] = (concat_cnn(-2, [S.Erf(), S.Conv(4, (2, 2), W_std=1.3), S.Flatten(),
                                                              S.Dense(1)]), CNN2D_IN)
    cases["norm_concat_spatial_out"] = (concat_cnn(2, []), CNN2D_IN, {"covs": True})
    cases["norm_concat_spatial_diag"] = (concat_cnn(1, [S.Relu()]), CNN2D_IN, {"kwargs": {"diagonal_spatial": True}})
    cases["norm_concat_channels_relu"] = (concat_cnn(-1, [S.Conv(4, (2, 2), W_std=1.3), S.Relu(), S.Flatten(),
                                                          S.Dense(1)]), CNN2D_IN)

    cases["norm_concat_batch_axis"] = (
        S.serial(S.Dense(8, 1.2, 0.1), S.Relu(), S.FanOut(2), S.parallel(S.Dense(8, 1.1), S.Dense(8, 0.9, 0.4)),
                 S.FanInConcat(0), S.Relu(), S.Dense(1)), DENSE_IN)

    block = S.serial(S.Dense(12, 1.4, 0.1), S.Relu())
    cases["norm_repeat_dense_relu"] = (S.serial(S.Dense(12, 1.2, 0.2), S.repeat(block, 4), S.Dense(1)), DENSE_IN)
    cases["norm_repeat_dense_relu_x2none"] = (S.serial(S.Dense(12, 1.2, 0.2), S.repeat(block, 3), S.Dense(1)),
                                              (DENSE_IN[0], None), {"tol": singular})
    cases["norm_repeat_conv_block"] = (
        S.serial(S.Conv(6, (3,), padding="SAME", W_std=1.3),
                 S.repeat(S.serial(S.Conv(6, (3,), padding="SAME", W_std=1.3, b_std=0.1), S.Erf(),
                                   S.Conv(6, (3,), padding="CIRCULAR", W_std=1.2), S.Relu()), 2),
                 S.GlobalAvgPool(), S.Dense(1)), CNN1D_IN)
    return cases
