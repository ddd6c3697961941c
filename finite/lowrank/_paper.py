"""The architectures behind the paper's parameter counts (Tables 1, 8, 14, 20; notes section 4.7):
`paper_model`.
"""

from __future__ import annotations

from finite.lowrank._networks import mlp
from finite.lowrank._transformer import transformer
from finite.lowrank._validation import KINDS, _check_choice

__all__ = ["paper_model"]


def paper_model(name: str, method: str):
    """The architecture behind a parameter count of the paper (notes section 4.7), as a network spec.

    ``name``/``method`` and the count ``num_params()`` gives (paper's printed value):

    * ``"toy"`` (1-100-100-1 tanh, Bayesian biases; Table 20, Fig. 20): ``"bbb"`` 20,802; ``"lowrank"`` (only
      the hidden 100x100 layer rank 16, input and output layers full-rank BBB) 7,202.
    * ``"mnist"`` (784-1200-1200-10 ReLU, deterministic biases; Table 14): ``"bbb"`` 4,788,010; ``"lowrank"``
      (hidden ranks 25, output rank 10; also the Laplace variant) 245,810; ``"rank1"`` (deterministic
      ``W_bar`` and biases, ``(mu, rho)`` for ``s, r`` of every layer) 2,406,398; ``"deterministic"`` 2,395,210.
    * ``"mimic"`` (44-128-128-1 ReLU; Table 1): ``"deterministic"`` 22,401 (22.4k; the deep ensemble is 5x,
      112k); ``"bbb"`` (Bayesian biases) 44,802 (44.8k); ``"lowrank"`` (r = 15, 15, output rank 1, Bayesian
      biases) 13,612 (13.6k); ``"rank1"`` (rank-1 on the two hidden layers, deterministic output) 23,257 (23.3k).
    * ``"sst2"`` (the encoder of :func:`transformer`; Table 8; no learned positions, no final LayerNorm,
      deterministic LayerNorms): ``"deterministic"`` 9,922,562 (9.92M; DE 5x = 49.61M); ``"bbb"`` (Bayesian
      weights, biases and embedding) 19,841,028 (19.84M); ``"lowrank"`` (rank 16 on Q, K, V, O, FFN, the
      embedding **and** the 256x2 head, Bayesian biases) 1,470,340 (1.47M); ``"rank1"`` (deterministic
      ``W_bar`` and biases, ``s, r`` on every matrix incl. embedding and head) 10,013,306 (10.01M). Table 8's
      ``r_e = 10`` would give 1.10M and Bayesian rank-1 biases 10.02M, so these are the configurations that
      reproduce the printed numbers.

    Args:
        name: ``"toy"``, ``"mnist"``, ``"mimic"`` or ``"sst2"``.
        method: one of :data:`KINDS` (the toy regression has only ``"bbb"`` and ``"lowrank"``).

    Returns:
        The network spec: an :class:`MLP` for ``"toy"``, ``"mnist"`` and ``"mimic"``, a :class:`Transformer`
        for ``"sst2"``.

    Raises:
        ValueError: if ``name`` or ``method`` is unknown, or ``name="toy"`` with a method it does not have.
    """
    where = "paper_model"
    _check_choice(name, ("toy", "mnist", "mimic", "sst2"), "name", where)
    _check_choice(method, KINDS, "method", where)
    if name == "toy":
        if method == "bbb":
            return mlp((1, 100, 100, 1), "bbb", activation="tanh", bias="bayes")
        if method == "lowrank":
            return mlp((1, 100, 100, 1), ("bbb", "lowrank", "bbb"), rank=(None, 16, None), activation="tanh",
                       bias="bayes")
        raise ValueError(f"{where}: the toy regression has methods 'bbb' and 'lowrank', got {method!r}")
    if name == "mnist":
        if method == "lowrank":
            return mlp((784, 1200, 1200, 10), "lowrank", rank=(25, 25, 10), bias="deterministic")
        return mlp((784, 1200, 1200, 10), method, bias="deterministic")
    if name == "mimic":
        sizes = (44, 128, 128, 1)
        if method == "deterministic":
            return mlp(sizes, "deterministic")
        if method == "bbb":
            return mlp(sizes, "bbb", bias="bayes")
        if method == "lowrank":
            return mlp(sizes, "lowrank", rank=(15, 15, 1), bias="bayes")
        return mlp(sizes, ("rank1", "rank1", "deterministic"), bias="deterministic")
    if method == "deterministic":
        return transformer(kind="deterministic")
    if method == "bbb":
        return transformer(kind="bbb", bias="bayes")
    if method == "lowrank":
        return transformer(kind="lowrank", rank=16, embed_rank=16, head_rank=16, overcomplete=True, bias="bayes")
    return transformer(kind="rank1", bias="deterministic")
