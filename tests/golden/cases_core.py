"""Golden cases of the kernel_fn keywords: diagonal_spatial, diagonal_batch, a Kernel as first argument.

See golden_io.py for the format; this file imports neither library.
"""

CNN2D_IN = ((3, 5, 5, 2), (2, 5, 5, 2))
CNN1D_IN = ((3, 7, 2), (2, 7, 2))
DENSE_IN = ((5, 4), (3, 4))


def build_cases(stax, jnp):
    S = stax
    cases = {}

    def cnn(*tail, **kw):
        return S.serial(S.Conv(8, (3, 3), padding="SAME", W_std=1.4, b_std=0.1, **kw), S.Relu(),
                        S.Conv(8, (3, 3), padding="SAME", W_std=1.2, b_std=0.2, **kw), *tail)

    cases["core_cnn_full_output"] = (cnn(), CNN2D_IN)
    cases["core_cnn_diag_spatial"] = (cnn(), CNN2D_IN, {"kwargs": {"diagonal_spatial": True}})
    cases["core_cnn_diag_spatial_x2none"] = (cnn(S.Erf()), (CNN2D_IN[0], None), {"kwargs": {"diagonal_spatial": True}})
    # With diagonal_spatial=True, neural-tangents 0.6.5 pools same-position covariances only and returns a kernel
    # that is not the diagonal of its own full one; smnngp returns the exact diagonal (tests/test_stax_core.py
    # checks it against the diagonal of this full case).
    cases["core_cnn_pool_full"] = (cnn(S.Relu(), S.AvgPool((2, 2), padding="SAME"), S.Conv(4, (2, 2), W_std=1.1)),
                                   CNN2D_IN)
    cases["core_cnn1d_covs"] = (S.serial(S.Conv(8, (3,), padding="SAME", W_std=1.3, b_std=0.1), S.Relu(),
                                         S.Conv(8, (3,), padding="CIRCULAR", W_std=1.3)), CNN1D_IN, {"covs": True})
    cases["core_cnn1d_covs_diag_batch_false"] = (
        S.serial(S.Conv(8, (3,), padding="SAME", W_std=1.3, b_std=0.1), S.Relu(),
                 S.Conv(8, (3,), padding="CIRCULAR", W_std=1.3)), CNN1D_IN,
        {"covs": True, "kwargs": {"diagonal_batch": False}})
    cases["core_cnn1d_covs_diag_batch_false_spatial"] = (
        S.serial(S.Conv(8, (3,), padding="SAME", W_std=1.3, b_std=0.1), S.Relu(), S.Conv(8, (3,), W_std=1.3)),
        CNN1D_IN, {"covs": True, "kwargs": {"diagonal_batch": False, "diagonal_spatial": True}})
    cases["core_mlp_covs_diag_batch_false"] = (
        S.serial(S.Dense(8, 1.5, 0.1), S.Erf(), S.Dense(8, 1.2, 0.1)), DENSE_IN,
        {"covs": True, "kwargs": {"diagonal_batch": False}})
    cases["core_mlp_covs"] = (S.serial(S.Dense(8, 1.5, 0.1), S.Erf(), S.Dense(8, 1.2, 0.1)), DENSE_IN, {"covs": True})
    return cases
