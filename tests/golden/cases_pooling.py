"""Golden cases of the pooling and shape layers: SumPool, GlobalSumPool, layouts, Flatten, ImageResize, Index,
DotGeneral (prefix ``pool_``).

See golden_io.py for the format; this file imports neither library.
"""

import numpy as np

CNN2D = ((3, 6, 5, 2), (2, 6, 5, 2))
CNN1D = ((3, 7, 2), (2, 7, 2))
CNN3D = ((2, 4, 3, 3, 2), (2, 4, 3, 3, 2))
NCHW = ((3, 2, 6, 5), (2, 2, 6, 5))


def build_cases(stax, jnp):
    S = stax
    cases = {}

    def conv(nd, **kw):
        return S.serial(S.Conv(8, (3,) * nd, padding="SAME", W_std=1.4, b_std=0.1, **kw), S.Relu())

    def conv2(nd):
        # Two convolutions: after an odd number, neural-tangents 0.6.5 holds the spatial axes of its kernel in
        # reverse order, which its ImageResize ignores and which it returns as they are.
        return S.serial(conv(nd), S.Conv(8, (2,) * nd, padding="SAME", W_std=1.2, b_std=0.2), S.Relu())

    head = (S.Flatten(), S.Dense(4, W_std=1.2, b_std=0.1))

    # Window and global sum pooling in a 2-D CNN.
    cases["pool_sum_valid_flatten"] = (S.serial(conv(2), S.SumPool((2, 2)), *head), CNN2D)
    cases["pool_sum_same_stride"] = (S.serial(conv(2), S.SumPool((3, 2), (2, 1), "SAME"), *head), CNN2D)
    cases["pool_sum_circular_spatial"] = (S.serial(conv(1), S.SumPool((3,), (2,), "CIRCULAR")), CNN1D)
    cases["pool_global_sum"] = (S.serial(conv(2), S.GlobalSumPool(), S.Dense(4, W_std=1.1)), CNN2D)
    cases["pool_global_sum_x2none"] = (S.serial(conv(1), S.GlobalSumPool(), S.Dense(3, W_std=1.1), S.Relu()),
                                       (CNN1D[0], None))
    cases["pool_sum_3d"] = (S.serial(conv(3), S.SumPool((2, 2, 2), padding="SAME"), S.GlobalAvgPool()), CNN3D)

    # Channel axis 1 (NCHW inputs straight into the pooling layers).
    cases["pool_avg_nchw_flatten"] = (S.serial(S.AvgPool((2, 2), (1, 2), "SAME", channel_axis=1), *head), NCHW)
    cases["pool_avg_nchw_edges"] = (
        S.serial(S.AvgPool((3, 2), padding="SAME", normalize_edges=True, channel_axis=1), *head), NCHW)
    cases["pool_sum_nchw_gap"] = (S.serial(S.SumPool((2, 3), channel_axis=1),
                                           S.GlobalAvgPool(channel_axis=1), S.Dense(3)), NCHW)
    cases["pool_global_sum_nchw"] = (S.serial(S.GlobalSumPool(channel_axis=1), S.Dense(3, W_std=0.9)), NCHW)

    # ImageResize: linear and nearest, up and down.
    cases["pool_resize_linear_up"] = (S.serial(conv2(2), S.ImageResize((-1, 9, 7, -1), "linear"), *head), CNN2D)
    cases["pool_resize_linear_down"] = (S.serial(conv2(2), S.ImageResize((-1, 3, 4, -1), "linear")), CNN2D)
    cases["pool_resize_linear_down_noaa"] = (
        S.serial(conv2(2), S.ImageResize((-1, 4, -1, -1), "bilinear", antialias=False), *head), CNN2D)
    cases["pool_resize_nearest_up"] = (S.serial(conv2(1), S.ImageResize((-1, 11, -1), "nearest")), CNN1D)
    cases["pool_resize_nearest_down"] = (S.serial(conv2(2), S.ImageResize((-1, 4, 3, -1), "nearest"),
                                                  S.GlobalAvgPool()), CNN2D)
    cases["pool_resize_nchw"] = (S.serial(S.ImageResize((-1, -1, 4, 8), "linear", channel_axis=1), *head), NCHW)

    # Index / Slice on batch and spatial axes.
    cases["pool_index_spatial"] = (S.serial(conv(2), S.Index(S.Slice[:, 1:5, ::2]), *head), CNN2D)
    cases["pool_index_batch_reverse"] = (S.serial(conv(2), S.Index(S.Slice[::2, ::-1, ...]),
                                                  S.Conv(4, (2, 2), W_std=1.1)), CNN2D)
    cases["pool_index_int_row"] = (S.serial(conv(2), S.Index(S.Slice[:, 2]), S.Conv(4, (2,), W_std=1.1),
                                            S.GlobalAvgPool()), CNN2D)
    cases["pool_index_3d"] = (S.serial(conv2(3), S.Index(S.Slice[..., 1:, :])), CNN3D)

    # DotGeneral with a constant: scalar, contraction of a spatial axis, spatial batch dimension, lhs.
    r_h = np.linspace(-1.0, 1.5, 6 * 3).reshape(6, 3)
    r_w = np.linspace(0.5, -0.7, 5)
    cases["pool_dot_scalar"] = (S.serial(conv(1), S.DotGeneral(rhs=2.0), S.Flatten()), CNN1D)
    cases["pool_dot_contract_h"] = (S.serial(conv(2), S.DotGeneral(rhs=jnp.asarray(r_h),
                                                                   dimension_numbers=(((1,), (0,)), ((), ()))),
                                             S.Flatten(), S.Dense(3)), CNN2D)
    cases["pool_dot_contract_w_spatial"] = (
        S.serial(conv(2), S.DotGeneral(rhs=jnp.asarray(r_w), dimension_numbers=(((2,), (0,)), ((), ())))), CNN2D)
    cases["pool_dot_batch_dim"] = (S.serial(conv(2), S.DotGeneral(rhs=jnp.asarray(r_w),
                                                                  dimension_numbers=(((), ()), ((2,), (0,))))), CNN2D)
    cases["pool_dot_lhs_1d"] = (S.serial(conv(1), S.DotGeneral(lhs=jnp.asarray(np.eye(7)[::-1] + 0.5),
                                                               dimension_numbers=(((1,), (1,)), ((), ()))),
                                         S.GlobalAvgPool(batch_axis=1, channel_axis=2)), CNN1D)
    cases["pool_dot_3d"] = (S.serial(conv(3), S.DotGeneral(rhs=jnp.asarray(np.arange(1.0, 4.0)),
                                                           dimension_numbers=(((3,), (0,)), ((), ()))),
                                     S.Flatten()), CNN3D)
    # Myrtle-5 as Shankar et al. (2020) and nt's Myrtle notebook build it (4 x [3 x 3 Conv SAME, Relu] in stages of
    # 2, 1, 1, 2 x 2 average pools after the first two stages and three after the last, He scaling, no biases) on
    # 32 x 32 x 3 images: also the golden of `smnngp.models.myrtle(5)` (tests/test_models.py).
    def myrtle_block():
        return [S.Conv(1, (3, 3), padding="SAME", W_std=float(np.sqrt(2.0)), b_std=0.0), S.Relu()]

    def pool2():
        return S.AvgPool((2, 2), strides=(2, 2))

    myrtle = myrtle_block() * 2 + [pool2()] + myrtle_block() + [pool2()] + myrtle_block() + [pool2()] * 3
    cases["pool_myrtle5_32"] = (S.serial(*myrtle, S.Flatten(), S.Dense(10, W_std=float(np.sqrt(2.0)), b_std=0.0)),
                                ((2, 32, 32, 3), (3, 32, 32, 3)))
    return cases

