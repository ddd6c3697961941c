"""Golden cases of the linear and convolutional layers: Dense (s, axes), N-d Conv, dimension_numbers,
ConvTranspose, ConvLocal, both parameterisations.

See golden_io.py for the format; this file imports neither library. Networks that keep spatial axes in
their output use an even number of shared-weight convolutions or ``diagonal_spatial=True`` (neural-tangents
returns full spatial kernels with reversed spatial axes after an odd number of them).
"""

DIAG = {"kwargs": {"diagonal_spatial": True}}


def build_cases(stax, jnp):
    S = stax
    cases = {}
    std = {"parameterization": "standard"}

    # Dense: width multipliers and axes.
    cases["lin_dense_s23_standard"] = (
        S.serial(S.Dense(8, 1.5, 0.1, parameterization="standard", s=(2, 3)), S.Erf(),
                 S.Dense(5, 1.2, 0.2, parameterization="standard", s=(3, 1))),
        ((4, 6), (3, 6)))
    cases["lin_dense_s_ntk_ignored"] = (
        S.serial(S.Dense(8, 1.5, 0.1, s=(2, 3)), S.Relu(), S.Dense(5, 1.2, 0.2, s=(3, 1))), ((4, 6), (3, 6)))
    cases["lin_dense_batch1_channel0"] = (
        S.serial(S.Dense(8, 1.4, 0.1, batch_axis=1, channel_axis=0), S.Relu(),
                 S.Dense(4, 1.2, 0.3, batch_axis=1, channel_axis=0, parameterization="standard")),
        ((6, 4), None))
    cases["lin_dense_channel1_spatial"] = (
        S.serial(S.Dense(8, 1.3, 0.1, channel_axis=1), S.Relu(), S.Dense(4, 1.1, 0.2, channel_axis=1)),
        ((3, 5, 4), (2, 5, 4)))

    # N-d convolutions.
    in3 = ((3, 4, 4, 4, 2), (2, 4, 4, 4, 2))
    cases["lin_conv3d_same_gap"] = (
        S.serial(S.Conv(4, (2, 3, 2), padding="SAME", W_std=1.3, b_std=0.1), S.Relu(),
                 S.Conv(4, (3, 2, 2), strides=(2, 1, 1), padding="SAME", W_std=1.2, b_std=0.05), S.Relu(),
                 S.GlobalAvgPool()), in3)
    cases["lin_conv3d_valid_flatten_standard"] = (
        S.serial(S.Conv(4, (2, 2, 2), strides=(1, 2, 1), padding="VALID", W_std=1.5, b_std=0.05, **std), S.Erf(),
                 S.Conv(3, (2, 1, 2), W_std=1.1, b_std=0.2, **std), S.Flatten()), in3)
    cases["lin_conv3d_circular_full"] = (
        S.serial(S.Conv(4, (3, 2, 2), padding="CIRCULAR", W_std=1.3, b_std=0.1), S.Relu(),
                 S.Conv(4, (2, 2, 3), padding="SAME", W_std=1.2)), ((2, 3, 4, 3, 2), (2, 3, 4, 3, 2)))

    # dimension_numbers.
    nchw = ("NCHW", "OIHW", "NCHW")
    cases["lin_conv_nchw_strides_full"] = (
        S.serial(S.Conv(4, (3, 2), strides=(2, 1), padding="SAME", W_std=1.4, b_std=0.1, dimension_numbers=nchw),
                 S.Relu(), S.Conv(4, (2, 2), W_std=1.2, b_std=0.2, dimension_numbers=nchw)),
        ((3, 2, 5, 6), (2, 2, 5, 6)))
    cases["lin_conv_nchw_whio_diag"] = (
        S.Conv(4, (3, 1), strides=(1, 2), padding="SAME", W_std=1.3, b_std=0.1,
               dimension_numbers=("NCHW", "WHIO", "NCHW")),
        ((3, 2, 5, 6), (2, 2, 5, 6)), DIAG)
    cases["lin_conv_out_nwhc_diag"] = (
        S.serial(S.Conv(4, (3, 2), padding="SAME", W_std=1.3, b_std=0.1,
                        dimension_numbers=("NHWC", "HWIO", "NWHC")), S.Relu()),
        ((3, 5, 4, 2), (2, 5, 4, 2)), DIAG)
    cases["lin_conv1d_ncw_circular_flatten_standard"] = (
        S.serial(S.Conv(4, (3,), padding="CIRCULAR", W_std=1.3, b_std=0.1, dimension_numbers=("NCW", "OIW", "NCW"),
                        parameterization="standard", s=(1, 2)), S.Relu(),
                 S.Conv(3, (2,), strides=(2,), W_std=1.1, b_std=0.2, dimension_numbers=("NCW", "OIW", "NCW"),
                        parameterization="standard", s=(2, 1)), S.Flatten()),
        ((3, 2, 7), (2, 2, 7)))

    # ConvTranspose.
    cases["lin_convT1d_same_valid_flatten"] = (
        S.serial(S.ConvTranspose(4, (3,), strides=(2,), padding="SAME", W_std=1.3, b_std=0.1), S.Relu(),
                 S.ConvTranspose(3, (2,), strides=(3,), padding="VALID", W_std=1.2, b_std=0.05), S.Flatten()),
        ((3, 5, 2), (2, 5, 2)))
    cases["lin_convT1d_valid_full_standard"] = (
        S.serial(S.ConvTranspose(4, (3,), strides=(2,), padding="VALID", W_std=1.3, b_std=0.1, **std), S.Erf(),
                 S.ConvTranspose(3, (2,), strides=(1,), padding="SAME", W_std=1.2, b_std=0.05, **std)),
        ((3, 4, 2), (2, 4, 2)))
    cases["lin_convT2d_strides_avgpool"] = (
        S.serial(S.ConvTranspose(4, (3, 2), strides=(2, 1), padding="SAME", W_std=1.3, b_std=0.1), S.Relu(),
                 S.ConvTranspose(4, (2, 3), strides=(1, 2), padding="VALID", W_std=1.2), S.Relu(),
                 S.AvgPool((2, 2)), S.Flatten()),
        ((3, 3, 4, 2), (2, 3, 4, 2)))
    cases["lin_convT2d_valid_diag_standard"] = (
        S.ConvTranspose(4, (2, 3), strides=(2, 2), padding="VALID", W_std=1.3, b_std=0.1, **std),
        ((3, 3, 3, 2), (2, 3, 3, 2)), DIAG)
    cases["lin_convT1d_circular_gap"] = (
        S.serial(S.ConvTranspose(4, (3,), strides=(2,), padding="CIRCULAR", W_std=1.3, b_std=0.1), S.Relu(),
                 S.ConvTranspose(3, (4,), strides=(1,), padding="CIRCULAR", W_std=1.1), S.Relu(), S.GlobalAvgPool()),
        ((3, 5, 2), (2, 5, 2)))
    cases["lin_convT2d_nchw_flatten"] = (
        S.serial(S.ConvTranspose(4, (2, 3), strides=(2, 1), padding="SAME", W_std=1.3, b_std=0.1,
                                 dimension_numbers=nchw), S.Relu(), S.Flatten()),
        ((3, 2, 3, 4), (2, 2, 3, 4)))

    # ConvLocal.
    cases["lin_convlocal1d_flatten"] = (
        S.serial(S.ConvLocal(4, (3,), padding="SAME", W_std=1.3, b_std=0.2), S.Relu(),
                 S.ConvLocal(3, (2,), strides=(2,), W_std=1.1, b_std=0.1), S.Flatten()),
        ((3, 7, 2), (2, 7, 2)))
    # ConvLocal comes first: after an odd number of shared-weight convolutions neural-tangents 0.6.5 applies a
    # ConvLocal's filter_shape and strides to the wrong spatial axes of its (reversed) full kernel.
    cases["lin_convlocal2d_avgpool_standard"] = (
        S.serial(S.ConvLocal(4, (3, 2), padding="SAME", W_std=1.2, b_std=0.1, **std), S.Relu(),
                 S.Conv(4, (2, 2), padding="SAME", W_std=1.3, b_std=0.1, **std), S.Relu(),
                 S.AvgPool((2, 2)), S.Flatten()),
        ((3, 4, 5, 2), (2, 4, 5, 2)))
    cases["lin_convlocal2d_circular_full"] = (
        S.serial(S.ConvLocal(4, (3, 2), strides=(1, 2), padding="CIRCULAR", W_std=1.3, b_std=0.1), S.Erf(),
                 S.Conv(4, (2, 2), padding="SAME", W_std=1.1, b_std=0.1), S.Relu(),
                 S.Conv(4, (2, 2), padding="SAME", W_std=1.1)),
        ((3, 4, 5, 2), (2, 4, 5, 2)))
    return cases
