"""Finite networks with masked inputs, built by either library's ``stax`` (shared by
``generate_masking_apply.py``, run with neural-tangents, and ``tests/test_stax_masking.py``)."""

import numpy as np

PAD = -7.0


def nets(stax):
    """``{name: (layer, input_shape)}``: networks whose parameters hold the same arrays in both libraries."""
    branch = stax.serial(stax.Dense(5, 1.2, 0.1), stax.FanOut(2),
                         stax.parallel(stax.serial(stax.Relu(), stax.Dense(3, 1.0, 0.2)),
                                       stax.serial(stax.Erf(), stax.Dense(3, 0.8))))
    return {
        "dense_gap": (stax.serial(stax.Dense(6, 1.3, 0.2), stax.Relu(), stax.Dense(4, 1.0, 0.1),
                                  stax.GlobalAvgPool(), stax.Dense(2)), (3, 6, 4)),
        "dense_layernorm": (stax.serial(stax.Dense(6, 1.3, 0.2), stax.LayerNorm(axis=(1, 2)), stax.Erf(),
                                        stax.Dense(3), stax.GlobalSumPool()), (3, 6, 4)),
        "conv_pool_flatten": (stax.serial(stax.Conv(4, (2, 3), padding="SAME", b_std=0.1), stax.Relu(),
                                          stax.AvgPool((2, 2), padding="SAME"), stax.Conv(3, (2, 2)),
                                          stax.Flatten(), stax.Dense(2)), (3, 5, 4, 3)),
        "fanin_sum_concat": (stax.serial(branch, stax.FanInConcat(axis=1), stax.Relu(), stax.Dense(2),
                                         stax.GlobalAvgPool()), (3, 6, 4)),
    }


def inputs(name, shape):
    """Normal inputs with masked entries: sequences padded at the end, images with masked pixels."""
    rng = np.random.RandomState(sum(map(ord, name)))
    x = rng.normal(size=shape)
    if len(shape) == 3:
        for i, n in enumerate((shape[1], shape[1] - 2, 2)[: shape[0]]):
            x[i, n:] = PAD
    else:
        x[rng.uniform(size=shape[:-1]) < 0.3] = PAD
    return x
