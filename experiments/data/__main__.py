"""``python -m experiments.data [NAME ...]``: fetch and verify every file of the named (default: all) data sets."""

import sys

from experiments.data import main

sys.exit(main())
