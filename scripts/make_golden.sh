#!/usr/bin/env bash
# Build the pinned neural-tangents oracle environment (once) and regenerate tests/golden/*.npz.
# The library never imports neural-tangents; only this script and benchmarks/ use it.
set -euo pipefail
cd "$(dirname "$0")/.."
ORACLE=${SMNNGP_ORACLE_VENV:-.venv-oracle}
if [ ! -x "$ORACLE/bin/python" ]; then
  python3.11 -m venv "$ORACLE"
  "$ORACLE/bin/pip" install -q jax==0.4.23 jaxlib==0.4.23 neural-tangents==0.6.5 "numpy<2" "scipy<1.13"
fi
# The example programs (tests/golden/generate_examples.py) load scikit-learn's bundled digits.
if ! "$ORACLE/bin/python" -c "import sklearn" 2>/dev/null; then
  "$ORACLE/bin/pip" install -q "scikit-learn<1.6"
fi
# benchmarks/nt_notebook.py runs nt's Myrtle notebook in an IPython shell in this environment.
if ! "$ORACLE/bin/python" -c "import IPython" 2>/dev/null; then
  "$ORACLE/bin/pip" install -q "ipython<9"
fi
# With arguments: only the named case modules (e.g. cases_attention); without: every layer case and every
# other fixture family (tests/golden/generate_*.py: empirical kernels, predict).
"$ORACLE/bin/python" tests/golden/generate.py "$@"
if [ "$#" -eq 0 ]; then
  for extra in tests/golden/generate_*.py; do
    if [ -e "$extra" ]; then "$ORACLE/bin/python" "$extra"; fi
  done
fi
