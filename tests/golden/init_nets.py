"""Networks whose initial parameters are compared with neural-tangents 0.6.5's (tests/golden/init/params.npz).

Shared by ``generate_init.py`` (run in the oracle environment with neural-tangents' ``stax``) and
``tests/test_init_nt.py`` (smnngp's ``stax``); imports neither library. Together the networks hold every layer with
parameters (`Dense` in both parameterisations, with and without a bias, on any channel axis; `Conv` 1-D / 2-D
with ``dimension_numbers``, `ConvTranspose`, `ConvLocal`; `GlobalSelfAttention`) and every combinator that
hands keys to its children (`serial`, `parallel`, `repeat`), beside parameter-free layers (`LayerNorm`,
`Aggregate`, `Dropout`, pooling, `FanOut` / `FanIn*`) whose empty parameters must sit at the same places.
"""

import numpy as np

DTYPES = ("float32", "float64")


def nets(stax):
    """``{name: (layer, input_shape, seed)}``; the parameters are ``init_fn(PRNGKey(seed), input_shape)``."""
    residual = stax.serial(
        stax.Dense(4, b_std=0.1), stax.FanOut(2),
        stax.parallel(stax.serial(stax.Relu(), stax.Dense(4, W_std=1.3, b_std=0.1), stax.Erf(), stax.Dense(4)),
                      stax.Identity()),
        stax.FanInSum(), stax.Dense(1, b_std=0.05))
    concat_prod = stax.serial(
        stax.FanOut(3),
        stax.parallel(stax.Dense(2), stax.Dense(3, b_std=0.1, parameterization="standard"), stax.Identity()),
        stax.FanInConcat(), stax.Dense(2), stax.FanOut(2),
        stax.parallel(stax.Dense(2, b_std=0.1), stax.Relu()), stax.FanInProd())
    return {
        # Dense
        "dense_ntk": (stax.Dense(8, W_std=1.5, b_std=0.1), (3, 5), 3),
        "dense_standard": (stax.Dense(8, W_std=1.5, b_std=0.1, parameterization="standard"), (3, 5), 3),
        "dense_standard_s": (stax.Dense(4, W_std=1.2, b_std=0.2, parameterization="standard", s=(2, 3)),
                             (3, 6), 3),
        "dense_nobias": (stax.Dense(6, W_std=2.0), (3, 5), 3),
        "dense_nobias_standard": (stax.Dense(6, W_std=2.0, parameterization="standard"), (3, 5), 0),
        "dense_channel_axis0": (stax.Dense(4, b_std=0.1, batch_axis=1, channel_axis=0), (5, 3, 2), 3),
        "dense_channel_axis1": (stax.Dense(4, W_std=0.9, b_std=0.3, channel_axis=1), (3, 5, 2), 3),
        # convolutions
        "conv1d_same_stride": (stax.Conv(4, (3,), strides=(2,), padding="SAME", W_std=1.3, b_std=0.2), (2, 7, 3),
                               3),
        "conv2d_nchw_circular": (stax.Conv(4, (2, 3), padding="CIRCULAR", b_std=0.1,
                                           dimension_numbers=("NCHW", "OIHW", "NHWC")), (2, 3, 5, 6), 3),
        "conv2d_standard_valid": (stax.Conv(3, (2, 2), W_std=1.5, b_std=0.1, parameterization="standard",
                                            s=(2, 2)), (2, 4, 5, 3), 3),
        "conv2d_nobias": (stax.Conv(3, (3, 2), padding="SAME"), (2, 4, 4, 2), 7),
        "convT1d_valid_stride": (stax.ConvTranspose(4, (3,), strides=(2,), b_std=0.1), (2, 5, 3), 3),
        "convT2d_same_standard": (stax.ConvTranspose(3, (2, 2), strides=(2, 1), padding="SAME", b_std=0.1,
                                                     parameterization="standard",
                                                     dimension_numbers=("NCHW", "HWIO", "NHWC")), (2, 2, 4, 3), 3),
        "convT1d_circular": (stax.ConvTranspose(3, (3,), strides=(2,), padding="CIRCULAR", W_std=1.1, b_std=0.1),
                             (2, 5, 2), 3),
        "convlocal2d_same": (stax.ConvLocal(4, (2, 2), padding="SAME", b_std=0.1), (2, 3, 3, 2), 3),
        "convlocal1d_standard": (stax.ConvLocal(3, (2,), b_std=0.1, parameterization="standard",
                                                dimension_numbers=("NCH", "OIH", "NHC")), (2, 3, 5), 3),
        # attention
        "attn_concat_softmax": (stax.GlobalSelfAttention(4, 3, 2, 2, b_std=0.1, W_key_std=1.1, W_out_std=1.3,
                                                         attention_mechanism="SOFTMAX", pos_emb_type="CONCAT",
                                                         n_chan_pos_emb=2), (2, 5, 3), 3),
        "attn_linear_sum_relu": (stax.GlobalSelfAttention(4, 3, 2, 1, linear_scaling=True,
                                                          attention_mechanism="RELU", pos_emb_type="SUM",
                                                          val_pos_emb=True), (2, 4, 3), 3),
        "attn_2d_channel_axis1": (stax.GlobalSelfAttention(3, 2, 2, 2, b_std=0.2, channel_axis=1,
                                                           attention_mechanism="IDENTITY"), (2, 3, 2, 3), 3),
        # combinators and parameter-free layers between layers with parameters
        "mlp_serial": (stax.serial(stax.Dense(8, W_std=1.5, b_std=0.1), stax.Relu(), stax.Dense(1)), (3, 3), 3),
        "mlp_serial_standard": (stax.serial(stax.Dense(8, W_std=1.5, b_std=0.1, parameterization="standard"),
                                            stax.Relu(), stax.Dense(1, parameterization="standard")), (3, 3), 11),
        "layernorm_mlp": (stax.serial(stax.Dense(6, b_std=0.1), stax.LayerNorm(), stax.Relu(),
                                      stax.Dense(2, W_std=1.5)), (3, 4), 3),
        "residual": (residual, (3, 3), 3),
        "fanin_concat_prod": (concat_prod, (3, 3), 3),
        "repeat_mlp": (stax.serial(stax.Dense(4, b_std=0.1),
                                   stax.repeat(stax.serial(stax.Dense(4, W_std=1.2, b_std=0.1), stax.Erf()), 3),
                                   stax.Dense(1)), (3, 3), 3),
        "repeat_conv": (stax.repeat(stax.serial(stax.Conv(3, (2,), padding="SAME", b_std=0.1), stax.Relu()), 2),
                        (2, 4, 3), 3),
        "cnn": (stax.serial(stax.Conv(4, (2, 2), padding="SAME", b_std=0.1), stax.Relu(), stax.AvgPool((2, 2)),
                            stax.Conv(3, (2, 2)), stax.Flatten(), stax.Dense(2, b_std=0.1)), (2, 5, 5, 2), 3),
        "gcn": (stax.serial(stax.Dense(4, b_std=0.1), stax.Aggregate(), stax.Relu(), stax.GlobalAvgPool(),
                            stax.Dense(1)), (2, 5, 3), 3),
        "dropout_train": (stax.serial(stax.Dense(6, b_std=0.1), stax.Dropout(0.7, "train"), stax.Relu(),
                                      stax.Dense(1)), (3, 3), 3),
    }


def apply_kwargs(name, jax):
    """Keyword arguments of ``apply_fn`` beyond ``params, x`` (a graph's adjacency, a dropout key)."""
    if name == "gcn":
        rng = np.random.RandomState(5)
        return {"pattern": (rng.uniform(size=(2, 5, 5)) < 0.5).astype(np.float32)}
    if name == "dropout_train":
        return {"rng": jax.random.PRNGKey(5)}
    return {}


def inputs(name, shape, dtype):
    """Deterministic normal inputs of a network (independent of either library)."""
    return np.random.RandomState(sum(map(ord, name))).normal(size=shape).astype(dtype)


def describe(tree) -> str:
    """The nesting of a parameter pytree as text: ``[...]`` a list, ``(...)`` a tuple, ``None``, ``*`` an array.

    Written here rather than taken from ``jax.tree_util`` so that both JAX versions print it the same way.
    """
    if isinstance(tree, list):
        return "[" + ", ".join(describe(t) for t in tree) + "]"
    if isinstance(tree, tuple):
        return "(" + ", ".join(describe(t) for t in tree) + ")"
    if tree is None:
        return "None"
    return "*"
