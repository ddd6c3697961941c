"""An attention NNGP telling whether a token sequence contains a motif, written against neural-tangents' API.

Task: sequences of ``L`` tokens drawn uniformly from a vocabulary of ``V``; the label is +1 when the bigram
``MOTIF`` (token ``a`` immediately followed by token ``b``) occurs anywhere in the sequence, -1 otherwise. The
position of the motif is irrelevant, which a model can only exploit if its architecture shares weights across
positions.

Two infinite-width models, each predicting by its NNGP posterior mean (``nt.predict.gradient_descent_mse_ensemble``
at ``t = None``, ``get='nngp'``: the readout trained to convergence, i.e. GP regression on the labels,
``mu = K_td (K_dd + reg I)^{-1} y``), classified by the sign:

* attention: a width-2 convolution over the one-hot tokens (sees bigrams), ReLU, one softmax self-attention layer
  (``stax.GlobalSelfAttention``) mixing all positions, ReLU, average over positions, dense readout;
* MLP: the same depth of dense layers on the flattened one-hot sequence (no sharing across positions).

With its two imports changed to neural-tangents', the program runs unchanged under neural-tangents 0.6.5, and the
predictions agree (``tests/test_examples_nt.py``).

Run: ``python docs/examples/nt_attention_nngp.py`` (``SMNNGP_FAST=1``: fewer sequences).
"""

import os

import jax
import jax.numpy as jnp
import numpy as np

import smnngp.nt as nt
from smnngp.nt import stax

jax.config.update("jax_enable_x64", True)
FAST = os.environ.get("SMNNGP_FAST") == "1"
L, V, MOTIF = 10, 4, (0, 1)
N_TRAIN, N_TEST = (64, 64) if FAST else (256, 256)
RESULTS = {}


def sequences(rs, n):
    """One-hot sequences (n, L, V) and labels (n, 1): +1 when the motif occurs, -1 otherwise."""
    tokens = rs.randint(V, size=(n, L))
    has = np.any((tokens[:, :-1] == MOTIF[0]) & (tokens[:, 1:] == MOTIF[1]), axis=1)
    return jnp.asarray(np.eye(V)[tokens]), jnp.asarray(np.where(has, 1.0, -1.0)[:, None])


rs = np.random.RandomState(0)
x_train, y_train = sequences(rs, N_TRAIN)
x_test, y_test = sequences(rs, N_TEST)
print(f"{N_TRAIN} train / {N_TEST} test sequences of {L} tokens; fraction with the motif "
      f"{float(jnp.mean(y_train > 0)):.2f} / {float(jnp.mean(y_test > 0)):.2f}")

_, _, attention_kernel_fn = stax.serial(
    stax.Conv(64, (2,), padding="SAME", W_std=1.5, b_std=0.1), stax.Relu(),
    stax.GlobalSelfAttention(n_chan_out=64, n_chan_key=64, n_chan_val=64, n_heads=4,
                             W_key_std=1.0, W_query_std=1.0, W_value_std=1.5, W_out_std=1.0, b_std=0.1,
                             attention_mechanism="SOFTMAX"),
    stax.Relu(),
    stax.GlobalAvgPool(),
    stax.Dense(1, W_std=1.5))

_, _, mlp_kernel_fn = stax.serial(
    stax.Flatten(),
    stax.Dense(64, W_std=1.5, b_std=0.1), stax.Relu(),
    stax.Dense(64, W_std=1.5, b_std=0.1), stax.Relu(),
    stax.Dense(1, W_std=1.5))

for name, kernel_fn in (("attention", attention_kernel_fn), ("mlp", mlp_kernel_fn)):
    predict_fn = nt.predict.gradient_descent_mse_ensemble(kernel_fn, x_train, y_train, diag_reg=1e-3)
    mean = np.asarray(predict_fn(x_test=x_test, get="nngp"))
    accuracy = float(np.mean(np.sign(mean) == np.asarray(y_test)))
    RESULTS[f"{name}_pred"] = mean
    RESULTS[f"{name}_accuracy"] = accuracy
    print(f"{name:9s} NNGP: test accuracy {accuracy:.3f}")

# A block of the attention NNGP itself: how strongly the prior correlates two test sequences.
k = np.asarray(attention_kernel_fn(x_test[:8], None, "nngp"))
RESULTS["attention_nngp_block"] = k
print("attention NNGP correlations of the first 4 test sequences:\n",
      np.round(k[:4, :4] / np.sqrt(np.outer(np.diag(k)[:4], np.diag(k)[:4])), 3))
