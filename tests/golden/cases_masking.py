"""Golden cases of masked inputs (``kernel_fn(..., mask_constant=c)``): variable-length sequences padded at the
end with the mask constant (as neural-tangents' imdb example) and images with masked pixels, through every layer
family that carries masks."""

import numpy as np

PAD = -7.0


def padded(lengths1, lengths2, seq_shape, constant=PAD, pattern=False, seed=0):
    """An ``inputs`` hook: normal sequences (N, T..., C) whose entries after each length equal ``constant``."""

    def make(rng, lengths, shape):
        x = rng.normal(size=(len(lengths),) + shape)
        for i, n in enumerate(lengths):
            x[i, n:] = constant
        return x

    def inputs(rng, shapes):
        x1 = make(rng, lengths1, seq_shape)
        x2 = None if lengths2 is None else make(rng, lengths2, seq_shape)
        kwargs = {}
        if pattern:
            t = seq_shape[0]
            p1 = (rng.uniform(size=(x1.shape[0], t, t)) < 0.4).astype(np.float64)
            p2 = None if x2 is None else (rng.uniform(size=(x2.shape[0], t, t)) < 0.4).astype(np.float64)
            kwargs["pattern"] = (p1, p2)
        return x1, x2, kwargs

    return inputs


def pixels(n1, n2, image_shape, frac=0.3, constant=PAD):
    """An ``inputs`` hook: normal images (N, H, W, C) with a random set of whole pixels equal to ``constant``."""

    def make(rng, n):
        x = rng.normal(size=(n,) + image_shape)
        hit = rng.uniform(size=(n,) + image_shape[:-1]) < frac
        x[hit] = constant
        return x

    def inputs(rng, shapes):
        return make(rng, n1), None if n2 is None else make(rng, n2), {}

    return inputs


def build_cases(stax, jnp):
    def kw(constant=PAD):
        return {"mask_constant": constant}

    seq = ((3, 6, 4), (2, 6, 4))
    seq_in = padded((6, 4, 2), (5, 3), (6, 4))
    img = ((3, 5, 4, 3), (2, 5, 4, 3))
    img_in = pixels(3, 2, (5, 4, 3))
    cases = {}

    # Dense / activations keep positions; output kernels with spatial axes are remasked.
    cases["masking_dense_relu"] = (
        stax.serial(stax.Dense(5, 1.3, 0.2), stax.Relu(), stax.Dense(3, 0.9, 0.1)), seq,
        {"kwargs": kw(), "inputs": seq_in, "covs": True})
    cases["masking_dense_erf_gap"] = (
        stax.serial(stax.Dense(5, 1.3, 0.2), stax.Erf(), stax.Dense(3, 1.1, 0.3), stax.GlobalAvgPool(),
                    stax.Dense(1)), seq, {"kwargs": kw(), "inputs": seq_in, "covs": True})
    cases["masking_gsp"] = (
        stax.serial(stax.Dense(5, 1.3, 0.2), stax.Relu(), stax.Dense(3), stax.GlobalSumPool()), seq,
        {"kwargs": kw(), "inputs": seq_in, "covs": True})
    cases["masking_gap_x2none"] = (
        stax.serial(stax.Dense(5, 1.3, 0.2), stax.Relu(), stax.Dense(3), stax.GlobalAvgPool()),
        ((3, 6, 4), None), {"kwargs": kw(), "inputs": padded((6, 3, 1), None, (6, 4)), "covs": True})
    cases["masking_nan_constant"] = (
        stax.serial(stax.Dense(5, 1.3, 0.2), stax.Relu(), stax.Dense(3), stax.GlobalAvgPool()), seq,
        {"kwargs": kw(float("nan")), "inputs": padded((6, 4, 2), (5, 3), (6, 4), constant=float("nan"))})
    cases["masking_flatten"] = (
        stax.serial(stax.Dense(5, 1.3, 0.2), stax.Relu(), stax.Flatten(), stax.Dense(2, 1.0, 0.1)), seq,
        {"kwargs": kw(), "inputs": seq_in, "covs": True})
    # Convolutions: the centre pixel's mask, SAME and VALID, 1-D and 2-D; pooling windows.
    cases["masking_conv1d"] = (
        stax.serial(stax.Conv(4, (3,), padding="SAME", W_std=1.2, b_std=0.1), stax.Relu(),
                    stax.Conv(3, (2,), padding="VALID"), stax.Erf(), stax.GlobalAvgPool()), seq,
        {"kwargs": kw(), "inputs": seq_in, "covs": True})
    cases["masking_conv2d_same_avgpool"] = (
        stax.serial(stax.Conv(4, (2, 3), padding="SAME", W_std=1.2, b_std=0.1), stax.Relu(),
                    stax.AvgPool((2, 2), padding="SAME"), stax.Flatten(), stax.Dense(1)), img,
        {"kwargs": kw(), "inputs": img_in})
    cases["masking_conv2d_valid_stride"] = (
        stax.serial(stax.Conv(4, (2, 2), strides=(2, 1), padding="VALID", b_std=0.2), stax.Relu(),
                    stax.Conv(2, (2, 2), padding="SAME"), stax.GlobalAvgPool()), img,
        {"kwargs": kw(), "inputs": img_in})
    # Attention: masked keys get no weight.
    cases["masking_attn_softmax"] = (
        stax.serial(stax.Dense(5, 1.2, 0.1),
                    stax.GlobalSelfAttention(4, 3, 3, 2, linear_scaling=True, attention_mechanism="SOFTMAX",
                                             W_key_std=1.3, W_value_std=1.1, W_out_std=0.9, b_std=0.2),
                    stax.Relu(), stax.Dense(2), stax.GlobalAvgPool()), seq,
        {"kwargs": kw(), "inputs": seq_in, "covs": True})
    cases["masking_attn_softmax_pe"] = (
        stax.serial(stax.Dense(5, 1.2, 0.1),
                    stax.GlobalSelfAttention(4, 3, 3, 2, linear_scaling=True, attention_mechanism="SOFTMAX",
                                             pos_emb_type="SUM", W_pos_emb_std=0.8, val_pos_emb=True),
                    stax.Dense(2), stax.GlobalAvgPool()), seq,
        {"kwargs": kw(), "inputs": seq_in})
    cases["masking_attn_relu_concat_pe"] = (
        stax.serial(stax.Dense(5, 1.2, 0.1),
                    stax.GlobalSelfAttention(4, 3, 3, 2, linear_scaling=True, attention_mechanism="RELU",
                                             pos_emb_type="CONCAT", n_chan_pos_emb=3, W_pos_emb_std=1.1),
                    stax.Erf(), stax.Dense(2)), seq,
        {"kwargs": kw(), "inputs": seq_in})
    cases["masking_attn_identity_sqrt"] = (
        stax.serial(stax.Dense(5, 1.2, 0.1),
                    stax.GlobalSelfAttention(4, 3, 3, 1, linear_scaling=False, attention_mechanism="IDENTITY"),
                    stax.GlobalAvgPool()), seq,
        {"kwargs": kw(), "inputs": seq_in})
    # LayerNorm over channels and over channels and positions (the mean over unmasked positions).
    cases["masking_layernorm"] = (
        stax.serial(stax.Dense(5, 1.2, 0.3), stax.LayerNorm(), stax.Relu(), stax.Dense(2), stax.GlobalAvgPool()),
        seq, {"kwargs": kw(), "inputs": seq_in, "covs": True})
    cases["masking_layernorm_spatial"] = (
        stax.serial(stax.Dense(5, 1.2, 0.3), stax.LayerNorm(axis=(1, 2)), stax.Erf(), stax.Dense(2)),
        seq, {"kwargs": kw(), "inputs": seq_in, "covs": True})
    # Graphs.
    cases["masking_aggregate"] = (
        stax.serial(stax.Dense(5, 1.2, 0.1), stax.Aggregate(), stax.Relu(), stax.Dense(3), stax.Aggregate(),
                    stax.GlobalAvgPool()), seq,
        {"kwargs": kw(), "inputs": padded((6, 4, 2), (5, 3), (6, 4), pattern=True)})
    # Branches: sum, product and concatenation (channels and positions) of masked branches.
    branch = stax.serial(stax.Dense(5, 1.2, 0.1), stax.FanOut(2),
                         stax.parallel(stax.serial(stax.Relu(), stax.Dense(3, 1.0, 0.2)),
                                       stax.serial(stax.Erf(), stax.Dense(3, 0.8))))
    cases["masking_fanin_sum"] = (
        stax.serial(branch, stax.FanInSum(), stax.Relu(), stax.GlobalAvgPool()), seq,
        {"kwargs": kw(), "inputs": seq_in})
    cases["masking_fanin_prod"] = (
        stax.serial(branch, stax.FanInProd(), stax.GlobalAvgPool()), seq,
        {"kwargs": kw(), "inputs": seq_in})
    cases["masking_fanin_concat_channels"] = (
        stax.serial(branch, stax.FanInConcat(), stax.Dense(2), stax.GlobalAvgPool()), seq,
        {"kwargs": kw(), "inputs": seq_in})
    cases["masking_fanin_concat_positions"] = (
        stax.serial(branch, stax.FanInConcat(axis=1), stax.Relu(), stax.Dense(2), stax.GlobalAvgPool()), seq,
        {"kwargs": kw(), "inputs": seq_in})
    return cases
