"""Progress of the experiments: the one home of their status lines and ``--quiet`` switch.

Every experiment reports how far it is (a tqdm bar, or a status line every few seconds on long single steps:
which split, which model, how far) on stderr, so that the tables on stdout stay clean. ``python -m experiments
NAME --quiet`` turns all of it off, the library's own bars included: ``__main__`` sets ``TQDM_DISABLE=1`` before
anything imports tqdm, and `set_quiet` silences the status lines.
"""

from __future__ import annotations

import os
import sys
import time

__all__ = ["set_quiet", "is_quiet", "note"]

_START = time.perf_counter()


def set_quiet(quiet: bool) -> None:
    """Silence (``True``) or restore the status lines and bars of this process and of the processes it starts."""
    os.environ["SMNNGP_QUIET"] = "1" if quiet else ""
    os.environ["TQDM_DISABLE"] = "1" if quiet else ""


def is_quiet() -> bool:
    """Whether progress output is switched off (``--quiet``, or ``SMNNGP_QUIET=1`` in the environment)."""
    return os.environ.get("SMNNGP_QUIET", "") not in ("", "0")


def note(message: str) -> None:
    """Print ``[elapsed] message`` on stderr (flushed) unless quiet: one line per long step."""
    if not is_quiet():
        print(f"[{time.perf_counter() - _START:7.1f} s] {message}", file=sys.stderr, flush=True)
