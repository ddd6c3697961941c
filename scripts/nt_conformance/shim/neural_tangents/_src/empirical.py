"""``neural_tangents._src.empirical``: the one test constant nt's tests import."""

from smnngp.nt import NtkImplementation

# nt's tests run the empirical NTK through structured derivatives by default.
_DEFAULT_TESTING_NTK_IMPLEMENTATION = NtkImplementation.STRUCTURED_DERIVATIVES
