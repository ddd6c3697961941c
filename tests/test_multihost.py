"""Two JAX processes (``jax.distributed`` on this host, two CPU devices each, Gloo collectives) run the
matrix-free path over the global device list and give the one-device numbers (issue 30, many hosts).

Each process fits the same Student-t process with ``CG(devices=jax.devices())`` (four devices, two of them in the
other process), predicts, and takes the tiled hyperparameter gradient; then the same on its first local device
alone. Every number (log ML, predictive means and variances, gradient) agrees to 1e-9 relative at ``tol=1e-12``.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CODE = textwrap.dedent(
    """
    import os, sys
    pid, port = int(sys.argv[1]), sys.argv[2]
    # before jax is imported (appended: the suite sets its own XLA flags)
    os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=2"
    os.environ["JAX_PLATFORMS"] = "cpu"
    import jax
    import jax.flatten_util
    jax.config.update("jax_enable_x64", True)
    jax.distributed.initialize(f"localhost:{port}", num_processes=2, process_id=pid)
    import numpy as np
    from smnngp import kernels, matfree, posterior, priors
    assert jax.process_count() == 2 and len(jax.devices()) == 4 and len(jax.local_devices()) == 2
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(150, 3)), rng.normal(size=(150, 2))
    k = kernels.rbf(0.8, 1.0)

    def numbers(devices):
        opts = matfree.CG(tol=1e-12, precond_rank=30, num_probes=8, tile_size=16, devices=devices)
        post = posterior.fit(k, x, y, priors.InverseGamma(2.0, 1.0), noise=0.05, method="cg", cg=opts)
        p = post.predict(x[:9] + 0.1)
        g = matfree.KernelOperator(k, x, 0.05, tile_size=16, devices=devices).bilinear_grad(x[:, :2], y)
        return np.concatenate([[post.log_marginal_likelihood], np.ravel(p.mean), np.ravel(p.variance),
                               np.asarray(jax.flatten_util.ravel_pytree(g)[0])])

    everywhere, alone = numbers(tuple(jax.devices())), numbers(tuple(jax.local_devices()[:1]))
    print("MAXREL", float(np.max(np.abs(everywhere - alone) / np.abs(alone))), flush=True)
    """
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def test_two_processes_over_four_devices_give_the_one_device_numbers():
    port = str(_free_port())
    env = {**os.environ, "PYTHONPATH": REPO + os.pathsep + os.environ.get("PYTHONPATH", "")}
    procs = [subprocess.Popen([sys.executable, "-c", CODE, str(i), port], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, cwd=REPO, env=env) for i in range(2)]
    outs = []
    try:
        for p in procs:
            out, err = p.communicate(timeout=600)
            outs.append((p.returncode, out, err))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for code, out, err in outs:
        assert code == 0, err[-3000:]
        rel = float(out.split("MAXREL")[1].split()[0])
        assert rel < 1e-9, out
