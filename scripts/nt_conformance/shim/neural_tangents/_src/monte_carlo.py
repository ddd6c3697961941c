"""``neural_tangents._src.monte_carlo`` as nt's tests import it: the public ``monte_carlo_kernel_fn`` only
(``_sample_once_kernel_fn`` is nt's private helper, out of scope)."""

from smnngp.nt import monte_carlo_kernel_fn  # noqa: F401
