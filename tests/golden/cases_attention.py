"""Golden cases of `GlobalSelfAttention`: every mechanism and positional embedding, both scalings, 1-D and 2-D.

See golden_io.py for the format; this file imports neither library.
"""

SEQ_IN = ((3, 6, 4), (2, 6, 4))
IMG_IN = ((2, 3, 4, 3), (2, 3, 4, 3))
LONG_IN = ((3, 8, 4), (2, 8, 4))


def build_cases(stax, jnp):
    S = stax
    cases = {}

    def attn(**kw):
        base = dict(n_chan_out=16, n_chan_key=8, n_chan_val=8, n_heads=2, W_key_std=1.1, W_value_std=1.2,
                    W_query_std=0.9, W_out_std=1.3, b_std=0.1)
        base.update(kw)
        return S.GlobalSelfAttention(**base)

    def net(layer, param="ntk"):
        return S.serial(S.Dense(16, W_std=1.4, b_std=0.1, parameterization=param), layer)

    for mech in ("SOFTMAX", "IDENTITY", "ABS", "RELU"):
        cases[f"attn_{mech.lower()}"] = (net(attn(attention_mechanism=mech)), SEQ_IN)
    cases["attn_softmax_x2none"] = (net(attn()), (SEQ_IN[0], None), {"covs": True})
    cases["attn_softmax_nobias_first"] = (attn(b_std=None), SEQ_IN, {"covs": True})
    cases["attn_relu_standard_dense"] = (net(attn(attention_mechanism="RELU"), "standard"), SEQ_IN)
    cases["attn_channel_axis1"] = (attn(channel_axis=1, batch_axis=0), ((3, 4, 6), (2, 4, 6)))

    for pe in ("SUM", "CONCAT"):
        for val in (False, True):
            tag = f"attn_pe_{pe.lower()}{'_val' if val else ''}"
            cases[tag] = (net(attn(pos_emb_type=pe, val_pos_emb=val, W_pos_emb_std=0.8)), SEQ_IN)
    cases["attn_pe_concat_nchan_val"] = (
        net(attn(pos_emb_type="CONCAT", n_chan_pos_emb=6, val_pos_emb=True, attention_mechanism="ABS")), SEQ_IN)
    cases["attn_pe_sum_decay"] = (
        net(attn(pos_emb_type="SUM", pos_emb_decay_fn=lambda d: jnp.exp(-d / 4.0), pos_emb_p_norm=1.5)), SEQ_IN,
        {"covs": True})
    cases["attn_pe_concat_decay_val_x2none"] = (
        net(attn(pos_emb_type="CONCAT", val_pos_emb=True, pos_emb_decay_fn=lambda d: 1.0 / (1.0 + d))),
        (SEQ_IN[0], None), {"covs": True})

    # 1/sqrt(n_chan_key) scaling: the identity mechanism has a closed form.
    cases["attn_sqrt_identity"] = (net(attn(linear_scaling=False, attention_mechanism="IDENTITY")), SEQ_IN,
                                   {"covs": True})
    cases["attn_sqrt_identity_first"] = (attn(linear_scaling=False, attention_mechanism="IDENTITY"), SEQ_IN)
    cases["attn_sqrt_identity_pe_sum"] = (
        net(attn(linear_scaling=False, attention_mechanism="IDENTITY", pos_emb_type="SUM")), SEQ_IN)
    cases["attn_sqrt_identity_pe_concat_val"] = (
        net(attn(linear_scaling=False, attention_mechanism="IDENTITY", pos_emb_type="CONCAT", val_pos_emb=True,
                 pos_emb_decay_fn=lambda d: jnp.exp(-d))), SEQ_IN)

    # 2-D positions (H, W): positions flattened row-major; embeddings with a decay over the L1 distance.
    cases["attn_2d_softmax"] = (
        S.serial(S.Dense(16, W_std=1.2, b_std=0.1),
                 attn(pos_emb_type="SUM", pos_emb_p_norm=1, pos_emb_decay_fn=lambda d: jnp.exp(-d / 2.0)),
                 S.Relu(), S.GlobalAvgPool(), S.Dense(1)), IMG_IN)
    cases["attn_2d_full_output"] = (net(attn(attention_mechanism="RELU")), IMG_IN)

    def two_layer():
        return S.serial(S.Dense(16, W_std=1.3, b_std=0.1), attn(), S.Relu(),
                        attn(pos_emb_type="CONCAT", val_pos_emb=True, W_out_std=1.0), S.GlobalAvgPool(),
                        S.Dense(1, W_std=1.1, b_std=0.05))

    cases["attn_two_layer"] = (two_layer(), LONG_IN)
    cases["attn_two_layer_x2none"] = (two_layer(), (LONG_IN[0], None))
    return cases
